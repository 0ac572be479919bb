"""``python -m labkit.bench NAME [options] [--record FILE]``: run one registered benchmark.

``--record FILE`` also appends the benchmark's JSON line to ``FILE`` (JSON lines), with the
command, the UTC time and the machine it ran on (cores, load average, torch threads): the
record docs/benchmarks.md's table is generated from (``docs/benchmarks/records.jsonl``;
``python -m labkit docs``).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

from labkit.bench import names, resolve
from labkit.machine import append_record


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy (the benchmark's last line is its record)."""

    def __init__(self, out):
        self.out, self.kept = out, io.StringIO()

    def write(self, s: str) -> int:
        self.out.write(s)
        return self.kept.write(s)

    def flush(self) -> None:
        self.out.flush()


def record(path: str | Path, name: str, args: list[str], output: str) -> dict:
    """Append the record of one run (its last JSON line) to ``path``; a clear error when the
    benchmark printed none."""
    last = next((line for line in reversed(output.strip().splitlines()) if line.startswith("{")), None)
    if last is None:
        raise ValueError(f"benchmark {name!r} printed no JSON line: nothing to record")
    return append_record(path, {"bench": name, "command": " ".join(["python -m labkit.bench", name, *args]),
                                "result": json.loads(last)})


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m labkit.bench NAME [options] [--record FILE]   (NAME --help for its options)")
        print("benchmarks: " + ", ".join(names()))
        return 0 if argv else 2
    target = None
    if "--record" in argv:
        i = argv.index("--record")
        if i + 1 >= len(argv):
            print("--record needs a file, e.g. --record docs/benchmarks/records.jsonl", file=sys.stderr)
            return 2
        target = argv[i + 1]
        del argv[i:i + 2]
    try:
        bench = resolve(argv[0])
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    if target is None:
        return bench(argv[1:])
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        rc = bench(argv[1:])
    if rc == 0:
        record(target, argv[0], argv[1:], tee.kept.getvalue())
        print(f"recorded in {target}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
