"""labkit inside TRL: GRPOTrainer with labkit's sandbox reward, and the DiDPO subclass, two
steps each on the tiny model; rewards and per-token credit equal labkit's own; DiDPO on two
CPU processes under `accelerate launch` equals one process."""

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trl import GRPOTrainer

from labkit.credit.advantages import AdvantageInput, compute_advantages
from labkit.env.feedback import FeedbackConfig, evaluate_many
from labkit.env.tasks import load_tasks
from labkit.env.task_sampling import CurriculumSampler
from labkit.credit.fork_credit import delta_moments
from labkit.integrations.trl import (CurriculumRepeatSampler, DiDPOTrainer, ForkCreditTrainer,
                                     SandboxReward, group_rows, task_dataset)
from labkit.policy.forking import ForkCreditConfig

ROOT = Path(__file__).resolve().parents[1]


def _setup(tmp_path, trainer_cls, reward, **extra):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from labkit.policy.loading import TINY_DIR

    tok = AutoTokenizer.from_pretrained(str(TINY_DIR))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(TINY_DIR), dtype=torch.float32)
    tasks = load_tasks("synthetic", "train", n=2, seed=0)
    cfg = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                     max_completion_length=96, learning_rate=1e-4, beta=0.0, loss_type="dapo",
                     use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
                     max_steps=2, logging_steps=1, report_to="none", save_strategy="no",
                     temperature=1.0, seed=0, shuffle_dataset=False, dataloader_num_workers=0)
    return trainer_cls(model=model, reward_funcs=[reward], args=cfg, train_dataset=task_dataset(tasks),
                       processing_class=tok, **extra), tasks


def test_grpo_trainer_with_labkit_sandbox_reward(tmp_path):
    reward = SandboxReward(feedback="dense", recipe_name="reshaped_grpo")
    trainer, tasks = _setup(tmp_path, GRPOTrainer, reward)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert len(reward.history) == 2  # one call per step
    last = reward.history[-1]
    # the rewards TRL trained on are labkit's own on the same completions
    again, comps = reward.rewards(last["tasks"], last["codes"], step=last["step"], seed=1)
    assert again == pytest.approx(last["rewards"])
    fb = evaluate_many(last["tasks"], last["codes"], config=FeedbackConfig(mode="dense"))
    assert [c["r_test"] for c in comps] == [f.components["r_test"] for f in fb]
    logged = {k for row in trainer.state.log_history for k in row}
    assert {"labkit/r_test", "labkit/r_feedback", "labkit/hack"} <= logged


def test_didpo_trainer_gives_labkits_per_token_credit(tmp_path):
    reward = SandboxReward(feedback="dense", recipe_name="raw")
    trainer, _ = _setup(tmp_path, DiDPOTrainer, reward)
    trainer.train()
    c = trainer.last_credit
    assert c["advantages"].dim() == 2 and c["advantages"].shape == c["mask"].shape
    want = compute_advantages("didpo", AdvantageInput(c["rewards"], c["groups"], c["mask"],
                                                      rollouts=c["rollouts"], tasks=c["tasks"]))
    assert torch.allclose(c["advantages"], want.advantages)
    # the logged anchor metrics (summed per process, one process here) are the estimator's
    logged = [row for row in trainer.state.log_history if "didpo/count" in row][-1]
    for key in ("count", "mean_group_size", "mean_gs", "token_coverage", "ad_nonzero_frac"):
        assert logged[f"didpo/{key}"] == pytest.approx(want.metrics[f"anchors/{key}"], abs=1e-12)
    assert logged["didpo/gather_bytes"] == logged["didpo/gather_s"] == 0.0  # nothing to gather
    # exact offsets: every token's characters are where the decoded text has them
    r = next(r for r in c["rollouts"] if r.offsets)
    assert "".join(r.completion[a:b] for a, b in r.offsets) == r.completion
    assert reward.history[-1]["rewards"] == pytest.approx(c["rewards"].tolist())


def test_fork_credit_trainer_gives_labkits_fork_credit_and_its_baseline_follows(tmp_path):
    """Two steps of ForkCreditTrainer: its advantages are labkit's didpo_fork estimator on the
    forks it measured (dR = the sandbox reward of the row minus the fork's), and with
    beta = 0 the EMA baseline is the policy after every step."""
    reward = SandboxReward(feedback="dense", recipe_name="raw")
    fork = ForkCreditConfig(strategy="uniform", fraction=0.05, budget=2, beta=0.0)
    trainer, _ = _setup(tmp_path, ForkCreditTrainer, reward, fork=fork,
                        fork_options={"lam": 0.5})
    start = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    c = trainer.last_credit
    sites = c["sites"]
    assert len(sites.dr) > 0 and c["moments"] == pytest.approx(delta_moments(sites.dr))
    # dR: the row's sandbox reward minus what the same reward gives the fork's program
    forks = trainer._policy  # labkit's view of the same model
    assert forks.model is trainer.accelerator.unwrap_model(trainer.model)
    told = reward.history[-1]["rewards"]
    rows = sites.row.tolist()
    assert sites.dr.tolist() == pytest.approx([told[r] - x for r, x in zip(rows, c["counterfactual"])])
    again, _ = reward.rewards([c["tasks"][r] for r in rows], c["fork_codes"])
    assert again == pytest.approx(c["counterfactual"])  # dense feedback is deterministic
    want = compute_advantages("didpo_fork", AdvantageInput(
        c["rewards"], c["groups"], c["mask"], rollouts=c["rollouts"], tasks=c["tasks"],
        forks=sites), lam=0.5)
    assert torch.allclose(c["advantages"], want.advantages)
    assert (c["advantages"] != want.advantages.new_zeros(1)).any()
    # forks continue the row's own prompt
    assert all(r.prompt_ids and r.temperature == 1.0 for r in c["rollouts"])
    logged = [row for row in trainer.state.log_history if "fork/n" in row][-1]
    assert logged["fork/n"] == len(sites.dr)
    assert logged["fork/dr_rms"] == pytest.approx(float(sites.dr.pow(2).mean().sqrt()))
    base = trainer._policy.baseline()
    assert all(torch.equal(a, b) for a, b in zip(base.parameters(), trainer.model.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(base.parameters(), start))
    with pytest.raises(ValueError, match="kl_to_baseline"):
        _setup(tmp_path, ForkCreditTrainer, reward, fork=ForkCreditConfig(kl_to_baseline=True))


def test_group_rows_against_a_naive_scan():
    assert group_rows(0, 6, 4) == (0, 8) and group_rows(1, 6, 4) == (4, 12)
    assert group_rows(2, 8, 4) == (16, 24)  # whole groups: the process's own rows
    for rows in range(1, 9):
        for G in range(1, 7):
            for p in range(4):
                mine = range(p * rows, (p + 1) * rows)
                groups = {r // G for r in mine}
                want = (min(groups) * G, (max(groups) + 1) * G)
                assert group_rows(p, rows, G) == want, (p, rows, G)


def test_didpo_credit_of_a_slice_keeps_the_whole_batchs_pair_draws():
    """One process's rows are a slice of the batch: numbered from their first group, their
    credit is the whole batch's even where the estimator aligns only some pairs of roots."""
    from transformers import AutoTokenizer

    from labkit.integrations.credit import didpo_credit
    from labkit.policy.loading import TINY_DIR

    tok = AutoTokenizer.from_pretrained(str(TINY_DIR))
    stray = ["import os", "print('hello world')", "CACHE = {}", "LIMIT = 10 ** 6", "assert True",
             "names = sorted(globals())"]
    G = len(stray)
    rows = [(t, s) for t in load_tasks("synthetic", "train", n=3, seed=0) for s in range(G)]
    texts = [f"```python\n{t.reference_code.rstrip()}\n\n{stray[s]}\n{stray[(s + 1) % G]}\n```\n"
             for t, s in rows]  # sample s shares one stray line with s - 1 and one with s + 1
    ids = [tok(x, add_special_tokens=False)["input_ids"] for x in texts]
    T = max(map(len, ids))
    id_t = torch.tensor([i + [tok.pad_token_id] * (T - len(i)) for i in ids])
    mask = torch.tensor([[1.0] * len(i) + [0.0] * (T - len(i)) for i in ids])
    rewards = torch.tensor([float(s) for _, s in rows], dtype=torch.float64)
    groups, tasks = [r // G for r in range(len(rows))], [t for t, _ in rows]
    opts = {"pair_budget": 1}  # one of the 15 pairs of each group is aligned, drawn by number
    whole, _ = didpo_credit(tok, id_t, mask, rewards, groups, tasks, **opts)
    part, _ = didpo_credit(tok, id_t[G:], mask[G:], rewards[G:], groups[G:], tasks[G:],
                           first_group=1, **opts)
    assert torch.equal(part.advantages, whole.advantages[G:])
    assert sorted(part.artifacts["anchors"]) == [1, 2]
    renumbered, _ = didpo_credit(tok, id_t[G:], mask[G:], rewards[G:], groups[G:], tasks[G:],
                                 **opts)
    assert not torch.equal(renumbered.advantages, whole.advantages[G:])  # the draws differ


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(folder: Path, process: int) -> list[dict]:
    lines = (folder / f"rows.{process}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_didpo_trainer_on_two_processes_equals_one(tmp_path):
    """`accelerate launch` with two CPU processes (gloo) against one process, both training on
    the same known completions: 3 prompts x 4 per step, 6 rows a process, so the middle group
    spans the two processes and its anchors need the other process's completions."""
    from labkit.integrations import trl_run

    run = ["--completions", "fixed", "--dump", "--prompts", "3", "--group", "4", "--tasks", "6",
           "--steps", "3", "--optim", "sgd", "--lr", "0.1", "--curriculum"]
    launch = Path(sys.executable).with_name("accelerate")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    two = subprocess.Popen(
        [str(launch), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no",
         "--main_process_port", str(_free_port()), "-m", "labkit.integrations.trl_run",
         "--out", str(tmp_path / "two"), *run],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    one = trl_run.main(["--out", str(tmp_path / "one"), *run])  # meanwhile, one process here
    log, _ = two.communicate(timeout=600)
    assert two.returncode == 0, log[-3000:]
    rec = json.loads((tmp_path / "two" / "record.json").read_text())
    assert (rec["processes"], rec["backend"], rec["rows_per_process"]) == (2, "gloo", 6)
    assert one["processes"] == 1
    ones, twos = _rows(tmp_path / "one", 0), [_rows(tmp_path / "two", p) for p in (0, 1)]
    for step, ref in enumerate(ones):
        p0, p1 = twos[0][step], twos[1][step]
        assert p0["rows"] + p1["rows"] == ref["rows"] == list(range(12))
        assert p0["completion_ids"] + p1["completion_ids"] == ref["completion_ids"]
        assert p0["rewards"] + p1["rewards"] == ref["rewards"]
        # every row's per-token advantages equal the one-process run's, to the last bit
        assert p0["advantages"] + p1["advantages"] == ref["advantages"]
        # ... and they are per-token credit: some row's tokens get different advantages
        assert any(len(set(a)) > 1 for a in ref["advantages"][4:8])
        # each process scored its own 6 rows once: together, exactly the batch
        assert len(p0["codes"]) == len(p1["codes"]) == 6
        assert p0["codes"] + p1["codes"] == ref["codes"]
        # the curriculum drew the same prompts on both processes and learned the same
        assert p0["task_ids"] + p1["task_ids"] == ref["task_ids"]
        assert p0["curriculum"] == p1["curriculum"] == ref["curriculum"]
        # the logged component means are over both processes' rows
        logged = [r for r in rec["log_history"] if "labkit/r_test" in r][step]
        comps = p0["components"] + p1["components"]
        for key in ("r_test", "r_precision", "noop"):
            assert logged[f"labkit/{key}"] == pytest.approx(sum(c[key] for c in comps) / 12)
        ref_logged = [r for r in one["log_history"] if "didpo/count" in r][step]
        for key in ("count", "mean_group_size", "mean_gs", "token_coverage", "ad_nonzero_frac"):
            assert logged[f"didpo/{key}"] == pytest.approx(ref_logged[f"didpo/{key}"], abs=1e-12)
        # the gather: every row's length (int64) and its ids (int32) padded to the longest
        width = max(len(ids) for ids in ref["completion_ids"])
        assert logged["didpo/gather_bytes"] == 12 * 8 + 12 * width * 4
        assert logged["didpo/gather_s"] > 0
    # the curriculum's state: the EMA of what the regime told, row by row in batch order
    success, buckets = {}, {}
    for t in load_tasks("synthetic", "train", n=6, seed=0):
        buckets[t.task_id] = ",".join(t.bug_kinds)
    for ref in ones:
        for tid, c in zip(ref["task_ids"], ref["components"]):
            old = success.get(buckets[tid], 0.5)
            success[buckets[tid]] = 0.9 * old + 0.1 * float(c["r_feedback"] >= 1 - 1e-9)
    assert ones[-1]["curriculum"]["success"] == pytest.approx(success, abs=1e-12)
    w1 = torch.load(tmp_path / "one" / "weights.pt")
    w2 = torch.load(tmp_path / "two" / "weights.pt")
    from transformers import AutoModelForCausalLM

    from labkit.policy.loading import TINY_DIR

    w0 = AutoModelForCausalLM.from_pretrained(str(TINY_DIR), dtype=torch.float32).state_dict()
    moved = sum(float((w1[k] - w0[k]).norm()) ** 2 for k in w1) ** 0.5
    apart = sum(float((w1[k] - w2[k]).norm()) ** 2 for k in w1) ** 0.5
    assert moved > 1e-2 and apart < 1e-3 * moved  # SGD: float noise stays float noise
    assert all(torch.allclose(w1[k], w2[k], rtol=1e-4, atol=1e-5) for k in w1)


def test_grpo_advantages_in_trl_are_labkits_estimator(tmp_path):
    """The TRL engine's GRPO credit: on the rewards of TRL's first step, labkit's ``grpo``
    estimator gives TRL's advantages, to the bit with TRL's std offset (1e-4) and within
    1e-3 relative with labkit's own (1e-6)."""
    seen = []

    class Keep(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append((self._last_rewards, out["advantages"].detach().clone()))
            return out

        def _calculate_rewards(self, *args):
            per_func = super()._calculate_rewards(*args)
            self._last_rewards = per_func.sum(1).detach().clone()
            return per_func

    trainer, _ = _setup(tmp_path, Keep, SandboxReward(feedback="dense", recipe_name="raw"))
    trainer.args.max_steps = 1
    trainer.train()
    rewards, trl_adv = seen[0]
    groups = [b // trainer.num_generations for b in range(len(rewards))]
    inp = AdvantageInput(rewards, groups, torch.ones(len(rewards), 1))
    assert rewards.std() > 0  # a batch with signal: the comparison is not 0 == 0
    ours = compute_advantages("grpo", inp, eps=1e-4).advantages[:, 0]
    assert torch.equal(ours.to(trl_adv.dtype), trl_adv)
    default = compute_advantages("grpo", inp).advantages[:, 0]
    assert torch.allclose(default.to(trl_adv.dtype), trl_adv, rtol=1e-3, atol=0)


def test_curriculum_sampler_draws_each_generation_batch_when_it_is_asked_for():
    """TRL's row layout (each prompt G times in a row, the batch repeated), with each batch's
    prompts drawn by the curriculum as it stands when the batch's first row is asked for."""
    buckets = ["a", "b", "a", "b", "a", "b"]
    cur = CurriculumSampler(order=("a", "b"), unlock_at=0.3, success={"a": 0.0})
    sampler = CurriculumRepeatSampler(buckets, cur, prompts=2, num_generations=3, repeat_count=2, seed=5)
    assert len(sampler) == 3 * 2 * 3 * 2  # 3 batches a pass
    it = iter(sampler)
    first = [next(it) for _ in range(12)]
    chosen = first[:6:3]
    assert first == [r for r in chosen for _ in range(3)] * 2 and chosen[0] != chosen[1]
    assert {buckets[r] for r in chosen} == {"a"}  # "b" stays locked while "a" is unsolved
    cur.success["a"] = 0.9  # "a" is learned: "b" opens for the batches not drawn yet
    rest = list(it)
    later = [rest[i:i + 6:3] for i in range(0, len(rest), 12)]
    replay_rng = random.Random("curriculum:5:0")
    replay = CurriculumSampler(order=("a", "b"), unlock_at=0.3, success={"a": 0.0})
    assert replay.sample(range(6), buckets.__getitem__, 2, replay_rng) == chosen
    replay.success["a"] = 0.9
    assert later == [replay.sample(range(6), buckets.__getitem__, 2, replay_rng) for _ in range(2)]
    assert any(buckets[r] == "b" for batch in later for r in batch)
    second = list(iter(sampler))  # a second pass draws with a seed of its own
    assert second[:6:3] == replay.sample(range(6), buckets.__getitem__, 2, random.Random("curriculum:5:1"))
