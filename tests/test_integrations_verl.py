"""labkit inside verl 0.9 at the function level, on CPU: the parquet rows load with verl's
``RLHFDataset``, the custom reward functions equal labkit's own feedback, and the DiDPO drop-in
for verl's ``compute_advantage`` equals labkit's ``didpo`` on a hand-made verl batch (rows
interleaved, responses right-padded) while other estimators stay verl's own.

verl runs in a subprocess (tests/verl_side.py) with .venv/verl on PYTHONPATH (`make
verl-extra`, which `make test` runs), so its packages never enter this process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from verl_cases import batch_rows, completions, tasks

from labkit.credit.advantages import AdvantageInput, compute_advantages
from labkit.env.feedback import FeedbackConfig, evaluate_many
from labkit.integrations.scoring import SandboxScorer
from labkit.policy.prompts import extract_code, plain_prompt
from labkit.policy.rollout import Rollout, token_offsets

ROOT = Path(__file__).resolve().parents[1]
VERL_DIR = ROOT / ".venv" / "verl"


@pytest.fixture(scope="module")
def verl_report(tmp_path_factory):
    if not (VERL_DIR / "verl").is_dir():
        pytest.fail(f"verl is not installed in {VERL_DIR}: run `make verl-extra` (make test does)")
    out = tmp_path_factory.mktemp("verl")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(VERL_DIR), str(ROOT)]))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "verl_side.py"), str(out)],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from labkit.policy.loading import TINY_DIR
    return AutoTokenizer.from_pretrained(str(TINY_DIR))


def test_parquet_rows_load_with_verls_dataset(verl_report):
    ds = verl_report["dataset"]
    ts = tasks()
    assert ds["len"] == len(ts)
    for row, t in zip(ds["rows"], ts):
        assert row["prompt"] == plain_prompt(t)
        assert row["task_id"] == row["ground_truth"] == t.task_id
        assert row["data_source"] == "labkit"


@pytest.mark.parametrize("feedback,recipe", [("dense", "raw"), ("binary", "reshaped_grpo")])
def test_reward_functions_equal_labkits_feedback(verl_report, feedback, recipe):
    single = verl_report["scores"]["single"][f"{feedback}/{recipe}"]
    batch = verl_report["scores"]["batch"][f"{feedback}/{recipe}"]
    assert single == batch  # one response at a time or the whole batch: the same numbers
    if (feedback, recipe) == ("binary", "reshaped_grpo"):  # as verl's loader finds it by name
        assert verl_report["scores"]["loaded"] == single
    by_id = {t.task_id: t for t in tasks()}
    cases = completions()
    ts = [by_id[tid] for tid, _ in cases]
    codes = [extract_code(text) for _, text in cases]
    fb = evaluate_many(ts, codes, config=FeedbackConfig(mode=feedback))
    assert [s["r_test"] for s in single] == [f.components["r_test"] for f in fb]
    assert [s["r_pass"] for s in single] == [f.components["r_pass"] for f in fb]
    rewards, _ = SandboxScorer(feedback=feedback, recipe_name=recipe).rewards(ts, codes)
    assert [s["score"] for s in single] == pytest.approx(rewards)
    # the cases span the range: the reference passes, the buggy code and the refusal do not
    assert single[0]["r_pass"] == 1.0 and single[1]["r_pass"] == 0.0 and single[3]["r_pass"] == 0.0


def test_didpo_advantages_equal_labkits_estimator(verl_report, tokenizer):
    b = batch_rows(tokenizer)
    by_id = {t.task_id: t for t in tasks()}
    # labkit's own route, rows grouped in order, then put back in the batch's order
    order = sorted(range(len(b["uid"])), key=lambda i: (b["uid"][i], i))
    rollouts, samples = [], {}
    for i in order:
        n = sum(b["mask"][i])
        ids = b["responses"][i][:n]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        code = extract_code(text)
        samples[b["uid"][i]] = samples.get(b["uid"][i], -1) + 1
        rollouts.append(Rollout(task_id=b["task_ids"][i], sample=samples[b["uid"][i]], prompt="",
                                prompt_ids=[], completion_ids=ids, logprobs=[0.0] * n,
                                completion=text, code=code,
                                code_start=text.find(code.rstrip("\n")) if code else -1,
                                offsets=token_offsets(tokenizer, ids), finished=True))
    mask = torch.tensor([b["mask"][i] for i in order], dtype=torch.float64)
    rewards = torch.tensor([b["rewards"][i] for i in order], dtype=torch.float64)
    groups = [b["uid"][i] for i in order]
    want = compute_advantages("didpo", AdvantageInput(
        rewards, groups, mask, rollouts=rollouts,
        tasks=[by_id[b["task_ids"][i]] for i in order])).advantages
    back = torch.empty_like(want)
    back[torch.tensor(order)] = want
    got = torch.tensor(verl_report["advantages"]["didpo"], dtype=torch.float64)
    assert got.shape == back.shape
    assert torch.allclose(got, back, atol=1e-6)
    assert (got[torch.tensor(b["mask"]) == 0] == 0).all()  # nothing on padding
    # the diff term acts: DiDPO differs from GRPO on this batch
    grpo = torch.tensor(verl_report["advantages"]["grpo_verl"], dtype=torch.float64)
    assert not torch.allclose(got, grpo, atol=1e-4)


def test_other_estimators_stay_verls_own(verl_report, tokenizer):
    via = torch.tensor(verl_report["advantages"]["grpo_via_labkit"])
    own = torch.tensor(verl_report["advantages"]["grpo_verl"])
    assert torch.equal(via, own)
    # and verl's GRPO is labkit's (group mean, unbiased std, eps 1e-6)
    b = batch_rows(tokenizer)
    mask = torch.tensor(b["mask"], dtype=torch.float64)
    lab = compute_advantages("grpo", AdvantageInput(torch.tensor(b["rewards"], dtype=torch.float64),
                                                    b["uid"], mask)).advantages
    assert torch.allclose(own.double(), lab, atol=1e-5)


def test_didpo_without_tokenizer_is_a_clear_error(verl_report):
    assert "pass tokenizer=" in verl_report["no_tokenizer_error"]
