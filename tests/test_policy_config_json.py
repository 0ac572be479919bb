"""A corrupt ``config.json`` in a model folder is reported as such (it used to surface as
"cannot load a tokenizer"), through the library and through the command line."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.policy.loading import PolicyLoadError, load_policy

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("content, says", [
    (b'{"model_type": "llama", "hidden_size": 32,', r"is corrupt: not valid JSON \(Expecting "),
    (b"\xff\xfe\x00{", r"is corrupt: not UTF-8 text"),
    (b'["llama"]', r"is corrupt: it holds a JSON list, not an object"),
])
def test_a_corrupt_config_json_is_named(random_model_dir, tmp_path, content, says):
    folder = tmp_path / "model"
    shutil.copytree(random_model_dir, folder)
    (folder / "config.json").write_bytes(content)
    with pytest.raises(PolicyLoadError, match=rf"config\.json' {says}.*save the model again"):
        load_policy(str(folder))


def test_the_command_line_says_config_json_not_tokenizer(random_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(random_model_dir, folder)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text[: len(text) // 2])
    p = subprocess.run([sys.executable, "-m", "labkit", "eval", "--policy", str(folder)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert p.returncode == 2, (p.stdout, p.stderr)
    (line,) = p.stderr.strip().splitlines()
    assert "config.json' is corrupt: not valid JSON" in line and "tokenizer" not in line
    json.loads(text)  # the original was fine: only the cut made it corrupt
