"""labkit inside TRL: GRPOTrainer with labkit's sandbox reward, and the DiDPO subclass, two
steps each on the tiny model; rewards and per-token credit equal labkit's own."""

import pytest
import torch
from trl import GRPOTrainer

from labkit.credit.advantages import AdvantageInput, compute_advantages
from labkit.env.feedback import FeedbackConfig, evaluate_many
from labkit.env.tasks import load_tasks
from labkit.integrations.trl import DiDPOTrainer, SandboxReward, task_dataset


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
