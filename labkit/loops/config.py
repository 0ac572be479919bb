"""The training run's typed configuration: :class:`TrainConfig` and its sections.

``python -m labkit train --config X.yaml --set k=v`` reads it (:func:`load_config`); the
trainer (:mod:`labkit.loops.trainer`) runs it. docs/reference.md lists every field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

from labkit.config import apply_overrides, from_dict, load_yaml
from labkit.credit.advantages import ADVANTAGE_ESTIMATORS, check_options
from labkit.credit.losses import POLICY_LOSSES, LossConfig
from labkit.credit.reshaping import ReshapeConfig, check_regime
from labkit.env.feedback import FeedbackConfig
from labkit.env.task_sampling import TaskConfig
from labkit.sandbox.config import SandboxConfig
from labkit.loops.forks import ForkCreditConfig  # imported here, it also registers the fork stage
from labkit.loops.hunks import HunkConfig
from labkit.runs.trackers import TrackerConfig, report_to_names
from labkit.policy.loading import PolicyConfig
from labkit.policy.rollout import SamplingConfig

@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule."""

    lr: float = 1e-5
    """Peak learning rate (full fine-tune of the 2M tiny model: 5e-5 moves it in tens of
    steps; a 7B model with LoRA wants about 1e-6 to 1e-5)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay; 0 keeps the policy near its SFT start only through the KL."""
    betas: tuple[float, ...] = (0.9, 0.99)
    """AdamW ``(beta1, beta2)``."""
    warmup_steps: int = 0
    """Steps of linear warm-up from ``lr / warmup_steps`` to ``lr``. With 0 and a constant
    schedule, the first N steps of a run equal an N-step run (experiments reuse that)."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Learning rate after warm-up: constant, or decayed (cosine / linear) to
    ``min_lr_ratio * lr`` at ``steps``."""
    min_lr_ratio: float = 0.1
    """Floor of the decayed schedules, as a share of ``lr``."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this before each optimiser step (``grad/norm`` logs
    the norm before clipping)."""
    fused: bool = True
    """Torch's fused AdamW kernel (``fused=True``: one kernel over all parameters, on CPU and
    CUDA). False leaves the choice to torch: a per-parameter loop on CPU, ``foreach`` on CUDA.
    The same update up to float rounding; fused is cheaper where a step's parameters are many
    small tensors (the tiny model's optimiser step, 38 tensors). HF's Trainer (so TRL) uses
    the fused kernel by default too."""

    def validate(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0 (the peak learning rate), got {self.lr}; "
                             "e.g. optim.lr=1e-5")
        if self.weight_decay < 0 or not self.grad_clip > 0:
            raise ValueError(f"optim.weight_decay must be >= 0 and optim.grad_clip > 0, got "
                             f"{self.weight_decay} and {self.grad_clip}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), e.g. 0.9,0.99; got "
                             f"{list(self.betas)}")
        if self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.warmup_steps must be >= 0 and optim.min_lr_ratio in [0, 1], "
                             f"got {self.warmup_steps} and {self.min_lr_ratio}")


@dataclass
class TrainConfig:
    """A whole training run (``python -m labkit train --config X.yaml --set k=v``)."""

    run_dir: str = "runs/train"
    """The run folder: ``config.json``, ``metrics.jsonl``, ``eval.jsonl``, ``rollouts.jsonl``,
    ``checkpoints/``. A folder holding another run is refused unless resumed or overwritten."""
    seed: int = 0
    """Seeds everything random (tasks per step, sampling, forks, noisy feedback), derived per
    step so a resumed run equals an uninterrupted one."""
    steps: int = 100
    """Policy updates in the whole run."""
    tasks_per_step: int = 8
    """Distinct tasks per update; each gets ``sampling.group_size`` samples (the GRPO group)."""
    estimator: str = "grpo"
    """Advantage estimator by name, one of
    :data:`labkit.credit.advantages.ADVANTAGE_ESTIMATORS` (docs/reference.md lists each with
    its equation and what it needs). An estimator that needs forks or hunk values switches on
    the rollout stage registered for that need (:data:`labkit.loops.stages.STAGES`; configured
    by ``fork``, ``hunks``)."""
    estimator_options: dict = field(default_factory=dict)
    """Keyword options for the estimator, e.g. {lam: 1.2, eta: 0.8} for didpo, {lam: 1.0,
    normalise: rms, spread: hunk} for didpo_fork."""
    match_scale: bool = False
    """Rescale each group's advantages to the RMS GRPO's would have on the same tokens
    (:func:`labkit.credit.pipeline.match_grpo_rms`): compares estimators at equal step size."""
    fork: ForkCreditConfig = field(default_factory=ForkCreditConfig)
    """How forks are made when the estimator needs them (didpo_fork): positions, the
    baseline policy (EMA or frozen) and whether the KL term targets it. Unused otherwise."""
    hunks: HunkConfig = field(default_factory=HunkConfig)
    """How hunk values are measured when the estimator needs them (oracle_hunk). Unused
    otherwise."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The model: ``tiny`` or a local Hugging Face folder, LoRA, the KL reference."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How completions are sampled (group size, temperature, length, engine)."""
    tasks: TaskConfig = field(default_factory=TaskConfig)
    """Training and held-out tasks."""
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig)
    """The reward components and the feedback regime (``feedback.mode``)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """The sandbox pool the trainer starts for training and evaluation (not used when a
    ``sandbox`` or ``reward_fn`` is passed in): workers, the check's deadline and the per-test
    limit (``test_timeout_s``: what a candidate that loops costs a step), resource limits."""
    reshape: ReshapeConfig = field(default_factory=ReshapeConfig.raw)
    """Reward reshaping; the default is raw GRPO (reward = the feedback signal only). Named
    recipes: ``labkit.credit.reshaping.RECIPES``."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The policy-gradient objective (clip, aggregation, KL, entropy)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimiser and learning-rate schedule."""
    curriculum: bool = False
    """Sample tasks by bug kind, weighted by learnability (``CurriculumSampler``)."""
    eval_every: int = 20
    """Held-out pass@1 every N steps (and at step 0 and the end); 0 = never."""
    eval_k: int = 4
    """Samples per held-out task at each evaluation (pass@1 is their mean pass rate)."""
    eval_temperature: float = 0.7
    """Sampling temperature of the held-out evaluation (lower than training's: less noise in
    the reading of what the policy does)."""
    checkpoint_every: int = 10
    """Write a checkpoint every N steps (and at the end of every ``train`` call)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept (older ones deleted); two, so a corrupt latest one leaves an
    intact one to resume from."""
    log_rollouts: int = 16
    """Rollout records per step written to rollouts.jsonl (0 = none, -1 = all)."""
    report_to: list[str] = field(default_factory=lambda: ["none"])
    """Experiment trackers the run reports to, by TRL's names: ``tensorboard``, ``wandb``,
    ``mlflow``, ``trackio`` or ``none`` (``--set report_to=tensorboard,trackio``). Each
    follows the trainer's events (:mod:`labkit.runs.trackers`; the ``trackers`` extra)."""
    trackers: TrackerConfig = field(default_factory=TrackerConfig)
    """Where the trackers write and what beyond scalars: project, run name, completion
    samples, W&B mode, MLflow store."""

    def validate(self) -> None:
        if self.estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; registered: "
                             f"{ADVANTAGE_ESTIMATORS.names()}")
        if self.loss.policy_loss not in POLICY_LOSSES:
            raise ValueError(f"unknown policy_loss {self.loss.policy_loss!r}; registered: "
                             f"{POLICY_LOSSES.names()}")
        check_options(self.estimator, self.estimator_options)
        if self.steps < 0 or self.tasks_per_step < 1 or self.checkpoint_every < 1:
            raise ValueError(f"steps >= 0, tasks_per_step >= 1 and checkpoint_every >= 1 are "
                             f"required, got {self.steps}, {self.tasks_per_step} and "
                             f"{self.checkpoint_every}")
        if self.keep_checkpoints < 1 or self.eval_every < 0 or self.eval_k < 1:
            raise ValueError(f"keep_checkpoints >= 1, eval_every >= 0 and eval_k >= 1 are "
                             f"required, got {self.keep_checkpoints}, {self.eval_every} and "
                             f"{self.eval_k}")
        if not self.eval_temperature > 0:
            raise ValueError(f"eval_temperature must be > 0, got {self.eval_temperature}")
        if self.loss.horizon is not None and self.loss.horizon < 1:
            raise ValueError(f"loss.horizon must be >= 1 (or null for sampling.max_new_tokens), "
                             f"got {self.loss.horizon}")
        check_regime(self.reshape, self.feedback.mode)
        report_to_names(self.report_to)
        self.trackers.validate()
        t = self.tasks
        if t.train_split not in ("train", "val"):
            raise ValueError(f"tasks.train_split must be 'train' or 'val', got {t.train_split!r}")
        if t.eval_split == t.train_split:
            raise ValueError(f"tasks.eval_split {t.eval_split!r} is the split trained on; evaluate "
                             f"on another one (e.g. tasks.eval_split=test)")


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> TrainConfig:
    if path:
        return load_yaml(TrainConfig, path, list(overrides))
    return apply_overrides(from_dict(TrainConfig, {}), list(overrides))
