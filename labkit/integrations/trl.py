"""labkit's tasks, sandbox rewards and DiDPO credit inside TRL's ``GRPOTrainer``.

Leaving the lab for a bigger model is a config change: the same repair tasks, the same
sandboxed reward (a feedback regime and a reshaping recipe chosen by name) and the same
DiDPO credit, with TRL doing generation (vLLM on a GPU) and the sharded training::

    from trl import GRPOConfig
    from labkit.integrations.trl import DiDPOTrainer, SandboxReward, task_dataset

    tasks = load_tasks("synthetic", "train", n=2000)
    reward = SandboxReward(feedback="binary", recipe="reshaped_grpo")
    trainer = DiDPOTrainer(model=..., args=GRPOConfig(...), train_dataset=task_dataset(tasks),
                           reward_funcs=[reward], processing_class=tokenizer)

* :func:`task_dataset`: a ``datasets.Dataset`` with labkit's prompt (``prompt``), the task id
  and the whole task record (``task``, JSON) a reward needs.
* :class:`SandboxReward`: a TRL reward function; runs every completion's extracted program
  in labkit's sandbox against the hidden tests, turns the result into the regime's signal and
  the recipe's reward, and logs every component through TRL (``log_metric``).
* :class:`DiDPOTrainer`: ``GRPOTrainer`` whose sequence advantages are replaced by labkit's
  per-token ``A_E + lambda A_D`` over diff anchors (``labkit.credit.anchors.didpo``), with
  exact token offsets from the tokenizer. TRL's loss accepts ``(B, T)`` advantages from a
  subclass (``_compute_loss`` unsqueezes only 1-D ones).

TRL is an optional dependency (``pip install 'labkit[trl]'``); nothing else in labkit imports
this module.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from labkit.credit.reshaping import ReshapeConfig
from labkit.env.feedback import FeedbackConfig
from labkit.env.records import RepairTask
from labkit.integrations.credit import didpo_credit
from labkit.integrations.scoring import SandboxScorer
from labkit.policy.prompts import extract_code, plain_prompt

try:
    from trl import GRPOTrainer
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("labkit.integrations.trl needs TRL: pip install 'labkit[trl]' "
                      "(trl, datasets)") from e


def task_dataset(tasks: Sequence[RepairTask], prompt_fn=plain_prompt):
    """A TRL-ready dataset: ``prompt`` (labkit's plain prompt of each task), ``task_id`` and
    ``task`` (the JSON of ``RepairTask.to_dict()``, what :class:`SandboxReward` rebuilds the
    task from)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [prompt_fn(t) for t in tasks],
                              "task_id": [t.task_id for t in tasks],
                              "task": [json.dumps(t.to_dict()) for t in tasks]})


def _completion_text(completion: Any) -> str:
    """A TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


class SandboxReward(SandboxScorer):
    """labkit's feedback as a TRL reward function (``GRPOTrainer(reward_funcs=[...])``).

    For every completion: extract the program (``labkit.policy.prompts.extract_code``), run it
    in the sandbox against the task's hidden tests (:func:`labkit.env.feedback.evaluate_many`
    under the ``feedback`` regime), and return the recipe's reward
    (:class:`~labkit.integrations.scoring.SandboxScorer`). Every component's batch mean goes to
    TRL's logs as ``labkit/<component>``. ``history`` keeps the last ``keep`` calls (tasks,
    codes, rewards) for inspection and tests."""

    def __init__(self, feedback: str | FeedbackConfig = "dense", recipe_name: str | ReshapeConfig = "raw",
                 sandbox=None, keep: int = 8):
        super().__init__(feedback=feedback, recipe_name=recipe_name, sandbox=sandbox)
        self.__name__ = "labkit_sandbox"  # TRL names a reward function by its __name__
        self.history: list[dict] = []
        self.keep = keep
        self._calls = 0

    def __call__(self, prompts, completions, task, log_metric=None, trainer_state=None,
                 **kwargs) -> list[float]:
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        tasks = [self.task(t) for t in task]
        codes = [extract_code(_completion_text(c)) for c in completions]
        rewards, comps = self.rewards(tasks, codes, step=step, seed=self._calls)
        self._calls += 1
        if log_metric is not None:
            for key in comps[0]:
                log_metric(f"labkit/{key}", sum(c[key] for c in comps) / len(comps))
        self.history = (self.history + [{"tasks": tasks, "codes": codes, "rewards": rewards,
                                         "completions": [_completion_text(c) for c in completions],
                                         "step": step}])[-self.keep:]
        return rewards


class DiDPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with DiDPO's per-token credit (arXiv 2608.07147).

    After TRL has generated and scored a batch, every completion becomes a labkit
    :class:`~labkit.env.records.Rollout` (its token ids, the decoded text, exact per-token
    character offsets, the extracted code) and the group's advantages are recomputed by
    labkit's ``didpo`` estimator: ``A(i, t) = A_E(i) + lambda A_D(i, a*(t))``, ``A_E`` the
    group-standardised reward, ``A_D`` the anchor term on tokens of sub-diffs shared across
    the group. The rewards are TRL's (the weighted sum of the reward functions). ``didpo``
    options (``lam``, ``eta``, ...) go in ``didpo_options``; the dataset needs the ``task``
    column of :func:`task_dataset`. ``last_credit`` keeps the last batch's rollouts, rewards
    and per-token advantages."""

    def __init__(self, *args, didpo_options: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.didpo_options = dict(didpo_options or {})
        self.last_credit: dict | None = None
        self._rewards_per_func: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func  # gathered over processes (TRL's contract)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.accelerator.num_processes > 1:
            raise RuntimeError(
                "DiDPOTrainer builds anchors from one process's whole groups and runs on a single "
                "process for now; for several processes use verl's route (docs/scale_out.md)")
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        rewards = torch.nansum(self._rewards_per_func * self.reward_weights.to(
            self._rewards_per_func.device).unsqueeze(0), dim=1).double().cpu()  # [B]
        mask = out["completion_mask"].detach().cpu().double()  # [B, T]
        tasks = [RepairTask.from_dict(json.loads(example["task"])) for example in inputs]
        groups = [b // G for b in range(len(inputs))]
        credit, rollouts = didpo_credit(self.processing_class, out["completion_ids"], mask,
                                        rewards, groups, tasks, **self.didpo_options)
        for k, v in credit.metrics.items():
            if k.startswith("anchors/"):
                self._metrics[mode][f"didpo/{k.split('/', 1)[1]}"].append(v)
        self.last_credit = {"rollouts": rollouts, "tasks": tasks, "rewards": rewards,
                            "groups": groups, "mask": mask, "advantages": credit.advantages}
        out["advantages"] = credit.advantages.to(out["completion_mask"].device,
                                                 dtype=torch.float32)  # [B, T]
        return out
