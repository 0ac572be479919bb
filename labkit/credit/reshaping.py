"""Reward reshaping for GRPO under weak feedback (the recipe of the seed blog post;
``docs/training.md`` says how it relates to arXiv 2605.07276).

Three stages, each a pure function, composed by :class:`Reshaper` from one
:class:`ReshapeConfig` (which a notebook slider or a papermill parameter can set):

1. **composite reward** from the feedback components,
   ``R = w_test * r_test + w_precision * g * r_precision + w_style * r_style
   + w_progress * r_progress - w_hack * hack`` with ``g`` the precision gate (below),
   and weights that may follow a schedule over training steps;
2. **pre-processing**: averaging repeated evaluations (done in the feedback floor),
   batch normalisation that falls back to running (global) statistics during a warm-up
   or while the batch std is tiny, an EMA reward baseline;
3. **advantage transforms** after the estimator: clipping (default ``[-5, 5]``),
   non-linear amplification, and a focus threshold that damps small advantages.

The precision gate answers the copying trap: ``exp(-lambda * d)`` is largest for the
unchanged buggy code, so it is paid only for a real edit (``noop = 0``), and, with
``gate_precision = "improved"``, only when the tests improve over the buggy code.

All running state (statistics, EMA, step) is in :meth:`Reshaper.state_dict`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Sequence

import torch

# ----------------------------------------------------------------------------- config


@dataclass
class WeightSchedule:
    """``w(step)``: constant, or linear from ``start`` to ``end`` over ``[begin, finish]`` steps."""

    start: float = 0.0
    end: float = 0.0
    begin: int = 0
    finish: int = 0

    def at(self, step: int) -> float:
        if self.finish <= self.begin:
            return self.end
        frac = min(1.0, max(0.0, (step - self.begin) / (self.finish - self.begin)))
        return self.start + frac * (self.end - self.start)


@dataclass
class ReshapeConfig:
    """The reshaping recipe: one field per component of the reward and of the advantage
    transform. The presets are the named recipes (:data:`RECIPES`: ``raw``, ``reshaped``,
    ``reshaped_grpo``); a run's default is ``raw`` (``TrainConfig.reshape``), plain GRPO's reward.
    The field defaults are the values a component takes when a recipe switches it on (the
    blog's weights, the precision gate), not a recipe of their own.
    """

    w_test: float = 1.0
    """Weight of the test term ``r_t`` (the blog's ``w1``, about 1)."""
    w_precision: float = 0.2
    """Weight of ``r_precision = exp(-lambda d)``, small edits paid more (``w2``, 0.1-0.3); only
    under the precision gate, since the unchanged buggy code maximises it."""
    w_style: float = 0.1
    """Weight of ``r_style`` (ruff findings, black formatting; ``w3``, 0.1-0.3)."""
    w_progress: float = 0.05
    """Weight of the one-off ``r_progress`` bonus for a bug kind finally fixed (``w4``, small)."""
    w_hack: float = 1.0
    """Penalty weight for a flagged reward hack (not for a syntax error: ``r_compile`` prices
    that)."""
    test_reward: Literal["feedback", "fraction", "binary"] = "feedback"
    """The test term ``r_t``: ``feedback``: ``r_feedback``, what the run's feedback regime
    tells the learner (``r_test`` under the default ``dense`` regime); ``fraction``: the hidden
    ``r_test``; ``binary``: the hidden ``r_pass``."""
    gate_precision: Literal["none", "edit", "improved"] = "improved"
    """``none``: pay precision always (the trap); ``edit``: only for a real edit;
    ``improved``: only for an edit that passes more tests than the buggy code."""
    style_schedule: WeightSchedule | None = None
    """When set, ``w_style`` follows this schedule (e.g. rising over training)."""
    normalise: Literal["none", "batch", "running"] = "none"
    """Reward normalisation before the estimator. ``batch`` uses the batch mean/std, but
    falls back to running statistics during ``warmup_steps`` or while the batch std is
    below ``min_batch_std``; ``running`` always uses the running statistics."""
    warmup_steps: int = 10
    """``batch`` normalisation uses running statistics for the first N steps, while a batch's
    own statistics are too few to trust."""
    min_batch_std: float = 1e-3
    """Below this batch std, ``batch`` falls back to running statistics (no blowing up of a
    batch with almost no spread)."""
    running_momentum: float = 0.99
    """Momentum of the running mean and variance."""
    ema_baseline: float = 0.0
    """If > 0, subtract ``b``, an EMA of the batch's mean reward with this beta, after
    normalisation and in its units: ``b <- beta b + (1 - beta) mean(R~)`` (0 = off)."""
    adv_clip: float = 5.0
    """Clip advantages to ``[-adv_clip, adv_clip]`` (0 = off)."""
    amplify: Literal["none", "signed_power", "piecewise"] = "none"
    """Non-linear amplification of the advantages (after the estimator)."""
    amplify_power: float = 0.5
    """``signed_power``: ``A <- sign(A) |A|^p`` (p < 1 amplifies small advantages)."""
    amplify_scale: float = 2.0
    """``piecewise``: ``A <- A * scale`` where ``|A| > 1``, unchanged elsewhere."""
    focus_threshold: float = 0.0
    """Damp samples with ``|A| < threshold`` by ``focus_damping`` (0 = off)."""
    focus_damping: float = 0.1
    """Factor applied to advantages below ``focus_threshold``."""

    @classmethod
    def raw(cls) -> "ReshapeConfig":
        """Plain GRPO: reward = fraction of tests passed, no extra terms or transforms."""
        return cls(w_precision=0.0, w_style=0.0, w_progress=0.0, w_hack=0.0,
                   gate_precision="none", adv_clip=0.0)

    @classmethod
    def named(cls, name: str) -> "ReshapeConfig":
        """The recipe called ``name`` (:data:`RECIPES`): what a config means by a name in
        place of the section (``--set reshape=reshaped_grpo``, ``reshape: reshaped`` in YAML)."""
        return recipe(name)

    def validate(self) -> None:
        if self.adv_clip < 0 or self.focus_threshold < 0:
            raise ValueError("adv_clip and focus_threshold must be >= 0")
        if not 0 <= self.ema_baseline < 1 or not 0 < self.running_momentum < 1:
            raise ValueError("ema_baseline must be in [0, 1) and running_momentum in (0, 1)")


def _blog_recipe() -> ReshapeConfig:
    """The seed blog's recipe as the lab runs it: the composite reward with the precision
    gate, batch normalisation with a 5-step warm-up on running statistics, and advantages
    clipped to [-5, 5] (which never binds under per-group standardisation at G <= 27)."""
    return ReshapeConfig(normalise="batch", warmup_steps=5)


def _blog_recipe_for_grpo() -> ReshapeConfig:
    """The blog's recipe with only the components that can act under GRPO's per-group
    standardisation: the composite reward (gated precision, style, progress, hack penalty).
    Batch normalisation and the EMA baseline are affine in the rewards, and a clip at 5 is
    above the largest standardised advantage of a group of 8 (2.47): all three are dropped."""
    return ReshapeConfig(normalise="none", ema_baseline=0.0, adv_clip=0.0)


RECIPES: dict[str, Callable[[], ReshapeConfig]] = {
    "raw": ReshapeConfig.raw,
    "reshaped": _blog_recipe,
    "reshaped_grpo": _blog_recipe_for_grpo,
}
"""Named reshaping recipes, defined once; experiments, notebooks and the RewardTuner take
them from here (a fresh config on each call)."""


def max_standardised_advantage(n: int) -> float:
    """The largest ``|A|`` that standardising ``n`` rewards can give: ``(n - 1) / sqrt(n)`` (one
    reward apart from ``n - 1`` equal ones, unbiased std). GRPO standardises each group of
    ``G`` (2.47 at G = 8), ``batch_norm`` the whole batch: a clip at or above this never binds."""
    return (n - 1) / math.sqrt(n) if n > 1 else 0.0


COMPONENT_OFF: dict[str, dict] = {
    "composite": {"w_precision": 0.0, "w_style": 0.0, "w_progress": 0.0, "w_hack": 0.0,
                  "style_schedule": None},
    "normalise": {"normalise": "none"},
    "ema_baseline": {"ema_baseline": 0.0},
    "adv_clip": {"adv_clip": 0.0},
    "amplify": {"amplify": "none"},
    "focus": {"focus_threshold": 0.0},
}
"""How to switch each reshaping component off: the fields a raw config sets. A component is
*on* in a config that differs from these values; whether it can *act* (change the
advantages) depends on the estimator, which ``widgets.tuner.component_effects`` measures."""


def components_on(cfg: "ReshapeConfig") -> list[str]:
    """The components of :data:`COMPONENT_OFF` that ``cfg`` switches on."""
    return [name for name, off in COMPONENT_OFF.items()
            if any(getattr(cfg, k) != v for k, v in off.items())]


def recipe(name: str) -> ReshapeConfig:
    """A fresh :class:`ReshapeConfig` of the recipe called ``name`` (see :data:`RECIPES`)."""
    if name not in RECIPES:
        raise ValueError(f"unknown reshaping recipe {name!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[name]()


# ----------------------------------------------------------------------------- stage 1


def test_term(components: Mapping[str, float], cfg: "ReshapeConfig") -> float:
    """``r_t``, the test signal the composite reward pays (``cfg.test_reward``); records
    without ``r_feedback`` (older runs, custom rewards) read ``r_test``."""
    if cfg.test_reward == "binary":
        return components["r_pass"]
    if cfg.test_reward == "feedback":
        return components.get("r_feedback", components["r_test"])
    return components["r_test"]


def check_regime(cfg: ReshapeConfig, mode: str) -> None:
    """Refuse a test term that reads what the feedback regime ``mode`` hides: under any regime
    but ``dense``, ``r_t`` must be ``r_feedback`` (``test_reward="feedback"``), since
    ``fraction`` and ``binary`` read the hidden tests (docs/feedback.md, "What each part of
    the reward reads")."""
    if cfg.test_reward != "feedback" and mode != "dense":
        raise ValueError(
            f"reshape.test_reward={cfg.test_reward!r} reads the hidden tests, which feedback mode "
            f"{mode!r} hides from the learner; use reshape.test_reward=feedback (what the regime "
            "tells), or feedback.mode=dense")


def precision_gate(components: Mapping[str, float], buggy_r_test: float | None,
                   mode: str, r_t: float | None = None) -> float:
    """``g`` in {0, 1}: whether ``r_precision`` is paid (see :class:`ReshapeConfig`)."""
    if mode == "none":
        return 1.0
    if components.get("noop", 0.0) >= 1.0:
        return 0.0
    if mode == "edit":
        return 1.0
    if mode == "improved":
        base = buggy_r_test if buggy_r_test is not None else 0.0
        value = components["r_test"] if r_t is None else r_t
        return 1.0 if value > base + 1e-12 else 0.0
    raise ValueError(f"unknown gate_precision {mode!r}")


def composite_reward(components: Mapping[str, float], cfg: ReshapeConfig, step: int = 0,
                     buggy_r_test: float | None = None) -> tuple[float, dict[str, float]]:
    """``R = w_test r_t + w_p g r_p + w_s(step) r_s + w_g r_g - w_h hack`` and its terms.

    ``r_t`` is the test signal (:func:`test_term`); ``g`` the precision gate, which compares
    ``r_t`` with the same signal of the unchanged buggy code (``buggy_r_test``).
    """
    r_t = test_term(components, cfg)
    w_style = cfg.style_schedule.at(step) if cfg.style_schedule else cfg.w_style
    g = precision_gate(components, buggy_r_test, cfg.gate_precision, r_t)
    terms = {
        "test": cfg.w_test * r_t,
        "precision": cfg.w_precision * g * components.get("r_precision", 0.0),
        "style": w_style * components.get("r_style", 0.0),
        "progress": cfg.w_progress * components.get("r_progress", 0.0),
        "hack": -cfg.w_hack * components.get("hack", 0.0),
    }
    return sum(terms.values()), terms


# ----------------------------------------------------------------------------- stage 3


def clip_advantages(adv: torch.Tensor, bound: float) -> torch.Tensor:
    """``A <- clip(A, -bound, bound)`` (identity for bound 0)."""
    return adv.clamp(-bound, bound) if bound > 0 else adv


def amplify(adv: torch.Tensor, mode: str, power: float = 0.5, scale: float = 2.0) -> torch.Tensor:
    """Non-linear amplification: ``signed_power``: ``sign(A) |A|^p``; ``piecewise``:
    ``A * scale`` where ``|A| > 1``; ``none``: identity."""
    if mode == "none":
        return adv
    if mode == "signed_power":
        return torch.sign(adv) * adv.abs().pow(power)
    if mode == "piecewise":
        return torch.where(adv.abs() > 1, adv * scale, adv)
    raise ValueError(f"unknown amplification {mode!r}; choose none, signed_power, piecewise")


def focus(adv: torch.Tensor, threshold: float, damping: float) -> torch.Tensor:
    """Focus threshold: ``A <- A * damping`` where ``|A| < threshold`` (identity for 0)."""
    if threshold <= 0:
        return adv
    return torch.where(adv.abs() < threshold, adv * damping, adv)


def transform_advantages(adv: torch.Tensor, cfg: ReshapeConfig) -> torch.Tensor:
    """Amplify, then focus, then clip: the order keeps the clip the final guarantee."""
    adv = amplify(adv, cfg.amplify, cfg.amplify_power, cfg.amplify_scale)
    adv = focus(adv, cfg.focus_threshold, cfg.focus_damping)
    return clip_advantages(adv, cfg.adv_clip)


# ----------------------------------------------------------------------------- stage 2 (stateful)


class Reshaper:
    """Applies a :class:`ReshapeConfig` batch after batch, keeping running statistics."""

    def __init__(self, cfg: ReshapeConfig):
        self.cfg = cfg
        self.step = 0
        self.run_mean = 0.0
        self.run_var = 1.0
        self.seen = 0
        self.var_seen = 0
        self.ema = None

    def rewards(self, components: Sequence[Mapping[str, float]],
                buggy_r_test: Sequence[float | None] | None = None) -> tuple[torch.Tensor, list[dict]]:
        """Composite rewards ``[B]`` for a batch (and their terms, for inspection)."""
        out, terms = [], []
        for i, c in enumerate(components):
            r, t = composite_reward(c, self.cfg, self.step,
                                    buggy_r_test[i] if buggy_r_test is not None else None)
            out.append(r)
            terms.append(t)
        return torch.tensor(out, dtype=torch.float64), terms

    def normalise(self, r: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Normalise ``r`` (see ``ReshapeConfig.normalise``), subtract the EMA baseline,
        update the running statistics; returns the rewards and what was used."""
        cfg = self.cfg
        mean, std = r.mean().item(), (r.std().item() if r.numel() > 1 else 0.0)
        used = "none"
        if cfg.normalise != "none":
            warm = self.step < cfg.warmup_steps or std < cfg.min_batch_std
            if cfg.normalise == "running" or (warm and self.seen > 0):
                used = "running"
                r = (r - self.run_mean) / (math.sqrt(self.run_var) + 1e-6)
            elif cfg.normalise == "batch" and std >= cfg.min_batch_std:
                used = "batch"
                r = (r - mean) / (std + 1e-6)
            else:
                used = "skipped"  # first batch with no spread: nothing to normalise with
        if cfg.ema_baseline > 0:
            # the baseline is kept in the units of the rewards it is subtracted from: the batch
            # mean *after* normalisation (an EMA of raw means subtracted from standardised
            # rewards would shift them by the raw mean, about -0.9 on a mostly passing batch)
            now = r.mean().item()
            base = self.ema if self.ema is not None else now
            r = r - base
            self.ema = cfg.ema_baseline * base + (1 - cfg.ema_baseline) * now
        # Running statistics: the mean from every batch, the variance only from batches
        # with spread (a batch of equal rewards says nothing about the scale; the
        # variance starts at 1, so until then normalising only centres).
        m = cfg.running_momentum if self.seen else 0.0
        self.run_mean = m * self.run_mean + (1 - m) * mean
        if std >= cfg.min_batch_std:
            mv = cfg.running_momentum if self.var_seen else 0.0
            self.run_var = mv * self.run_var + (1 - mv) * std ** 2
            self.var_seen += 1
        self.seen += 1
        return r, {"reshape/norm": used, "reshape/batch_mean": mean, "reshape/batch_std": std,
                   "reshape/running_mean": self.run_mean}

    def advance(self) -> None:
        self.step += 1

    def state_dict(self) -> dict:
        return {"step": self.step, "run_mean": self.run_mean, "run_var": self.run_var,
                "seen": self.seen, "var_seen": self.var_seen, "ema": self.ema}

    def load_state_dict(self, s: Mapping) -> None:
        self.step, self.run_mean, self.run_var = int(s["step"]), float(s["run_mean"]), float(s["run_var"])
        self.seen, self.var_seen, self.ema = int(s["seen"]), int(s["var_seen"]), s["ema"]
