"""``python -m labkit sandbox run --code FILE`` on input it used to crash on: a binary file
(UnicodeDecodeError traceback) and 50 MB of statements (the parent's compile took ~10 GB).
Each is now one clear line on stderr, exit status 2, in bounded time and memory."""

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "humanevalpack_small.jsonl"
TASK = "humanevalpack/HumanEval-0/bug0"


MEMORY_CAP = 3 << 30  # the command's address space: 50 MB of code took ~10 GB to compile


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def sandbox_run(code_file: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run the command in a child process limited to ``MEMORY_CAP``; its exit and wall time."""
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "labkit", "sandbox", "run", "--task", TASK,
                        "--code", str(code_file), "--source", "humanevalpack",
                        "--path", str(FIXTURE)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
                       preexec_fn=_cap_memory)
    return p, time.monotonic() - start


def one_clear_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


@pytest.mark.parametrize("content, says", [
    (bytes(range(256)) * 64, "a binary file (it holds NUL bytes)"),
    (b"def f(x):\n    return '\xff\xfe'\n", "not UTF-8 text (byte 22)"),
])
def test_a_binary_or_non_utf8_file_is_one_clear_line(tmp_path, content, says):
    path = tmp_path / "candidate.bin"
    path.write_bytes(content)
    p, _ = sandbox_run(path)
    line = one_clear_line(p)
    assert str(path) in line and says in line


def test_fifty_megabytes_of_statements_are_refused_in_bounded_memory(tmp_path):
    path = tmp_path / "huge.py"
    with path.open("w") as f:
        for _ in range(50):
            f.write("x = foo(a, b + 1, [c, d])\n" * (1_000_000 // 26))
    assert os.path.getsize(path) > 49_000_000
    p, wall_s = sandbox_run(path)
    line = one_clear_line(p)
    assert "larger than 262144 bytes, the sandbox's limit (SandboxConfig.max_code_bytes)" in line
    assert wall_s < 60
