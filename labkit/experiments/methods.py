"""Named training methods, defined once: what a method changes in a run's config, the rollout
stages it needs, and how pages name it.

A :class:`Method` is config overrides by dotted path (what ``--set`` would write:
``estimator``, ``reshape`` (a recipe name, then its fields), ``feedback.mode``, ...) and two
options the experiments compare at equal cost: ``scale="rms"`` (advantages rescaled to GRPO's
per-group RMS, ``TrainConfig.match_scale``) and ``wall="grpo"`` (trained for the steps that fit
in that method's wall time, measured side by side before training). ``variant_of`` names the
method it varies (its scale, its wall time, a component switched off), so a page sets the two
side by side. :data:`METHODS` holds every method by the name results are recorded under; every
experiment, the command line (``--set methods=[...]``) and notebook 05 take them from here::

    cfg = METHODS["didpo@rms"].configure(base_config)   # estimator didpo, match_scale true
    METHODS["didpo_fork"].stages                        # ("forks",)

Adding a method: ``METHODS.add("my_method", Method("my label", {"estimator": "my_estimator"}))``;
its name is then valid in every experiment's ``methods``. Most methods train with the GRPO
loop (:class:`~labkit.loops.config.TrainConfig`); muCODE's generators (``loop="mucode"``) are
overrides of :class:`~labkit.mucode.loop.MucodeConfig`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from labkit.config import apply_values, did_you_mean
from labkit.credit.advantages import needs
from labkit.credit.reshaping import COMPONENT_OFF
from labkit.loops.stages import STEP_NEEDS
from labkit.registry import Registry


@dataclass(frozen=True)
class Method:
    """One named training method (:data:`METHODS`)."""

    label: str
    """How pages, tables and the dashboard name it."""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    """Config fields it sets, by dotted path, applied in order over the experiment's base
    config: ``{"estimator": "didpo"}``, ``{"reshape": "reshaped_grpo", "reshape.amplify":
    "piecewise"}``, ``{"feedback.mode": "flipped", "feedback.noise_p": 0.3}``."""
    scale: Literal["own", "rms"] = "own"
    """``rms``: its advantages rescaled to GRPO's per-group RMS (``match_scale``), so a
    difference from GRPO is not a step-size difference."""
    wall: str | None = None
    """Matched wall time: trained for the steps that fit in this method's wall time (the
    experiment measures both step costs side by side first)."""
    variant_of: str | None = None
    """The method this one varies (its scale, its wall time, a component switched off)."""
    loop: Literal["grpo", "mucode"] = "grpo"
    """The loop it trains with: ``grpo`` (overrides of ``TrainConfig``) or ``mucode`` (of
    ``MucodeConfig``)."""

    @property
    def estimator(self) -> str:
        """Its advantage estimator (GRPO's unless it sets one)."""
        return self.overrides.get("estimator", "grpo")

    @property
    def estimator_options(self) -> Mapping[str, Any]:
        """The options it gives its estimator."""
        return self.overrides.get("estimator_options", {})

    @property
    def stages(self) -> tuple[str, ...]:
        """The rollout stages it needs: its estimator's needs the step does not supply
        (:data:`labkit.loops.stages.STAGES` measures each)."""
        if self.loop != "grpo":
            return ()
        return tuple(n for n in needs(self.estimator) if n not in STEP_NEEDS)

    def configure(self, cfg, wall_steps: int | None = None):
        """``cfg`` (a ``TrainConfig``, or a ``MucodeConfig`` for a muCODE method) with this
        method's overrides and options applied, checked and validated: a new config. A
        matched-wall-time method needs ``wall_steps``, the steps its budget buys."""
        values = dict(self.overrides)
        if self.loop == "grpo":
            values["match_scale"] = self.scale == "rms"
        if self.wall is not None:
            if wall_steps is None:
                raise ValueError(f"a method at {self.wall}'s wall time needs the steps that fit in "
                                 "it (measure the step costs first)")
            steps = max(1, wall_steps)
            values.update(steps=steps, checkpoint_every=max(1, steps // 3), eval_every=steps)
        return apply_values(cfg, values)


METHODS: Registry[Method] = Registry("method", same=lambda old, new: old == new)
"""Every named method, by the name its runs and results are recorded under."""


def check_methods(names: Sequence[str], loop: str = "grpo", field_name: str = "methods") -> None:
    """Raise ``ValueError`` naming the first of ``names`` that is not a registered method of
    ``loop`` (with the closest registered name)."""
    known = sorted(n for n, method in METHODS.items() if method.loop == loop)
    for name in names:
        if name not in known:
            raise ValueError(f"{field_name}: unknown method {name!r}{did_you_mean(name, known)}; "
                             f"registered: {', '.join(known)}")


def variant(name: str, **options: Any) -> str:
    """The registered method that is ``name`` with ``options`` (``scale="rms"``,
    ``wall="grpo"``): its name. A ``ValueError`` when none is registered."""
    found = [m for m, method in METHODS.items() if method.variant_of == name
             and all(getattr(method, k) == v for k, v in options.items())]
    if not found:
        opts = ", ".join(f"{k}={v!r}" for k, v in options.items())
        raise ValueError(f"no method is {name!r} with {opts}; register one in "
                         "labkit.experiments.methods")
    return found[0]


def variants_of(name: str, names: Sequence[str]) -> list[str]:
    """The methods among ``names`` that vary ``name``, in their order."""
    return [m for m in names if m in METHODS and METHODS[m].variant_of == name]


# ============================================================================= the methods

RAW = {"reshape": "raw"}
"""The reward is what the feedback regime tells (the recipe ``raw``)."""

for _name, _label, _overrides in (
        ("grpo", "GRPO", {**RAW, "estimator": "grpo"}),
        ("didpo", "DiDPO", {**RAW, "estimator": "didpo"}),
        ("didpo_fork", "DiDPO-fork", {**RAW, "estimator": "didpo_fork"}),
        ("oracle_hunk", "oracle hunk credit", {**RAW, "estimator": "oracle_hunk"}),
        ("oracle_hunk_shuffled", "shuffled oracle credit",
         {**RAW, "estimator": "oracle_hunk_shuffled"})):
    METHODS.add(_name, Method(_label, _overrides))
    if _name != "grpo":  # each credit estimator also at GRPO's scale, the one they are compared with
        METHODS.add(f"{_name}@rms", Method(f"{_label}, GRPO's scale", _overrides, scale="rms",
                                           variant_of=_name))
METHODS.add("didpo_fork@wall", Method("DiDPO-fork at GRPO's wall time", METHODS["didpo_fork"].overrides,
                                      wall="grpo", variant_of="didpo_fork"))

FLIP_P = 0.3
"""How often ``raw_grpo_flip30``'s pass/fail label is wrong."""

METHODS.add("raw_grpo", Method("raw GRPO", RAW))
METHODS.add("raw_grpo_binary", Method("raw GRPO, pass/fail of the hidden tests",
                                      {**RAW, "feedback.mode": "binary"}))
METHODS.add("raw_grpo_dense", Method("raw GRPO, dense feedback", {**RAW, "feedback.mode": "dense"}))
METHODS.add("raw_grpo_flip30", Method("raw GRPO, 30% of labels flipped",
                                      {**RAW, "feedback.mode": "flipped", "feedback.noise_p": FLIP_P}))
METHODS.add("reshaped_grpo", Method("reshaped GRPO", {"reshape": "reshaped_grpo"}))
METHODS.add("reshaped", Method("reshaped GRPO", {"reshape": "reshaped_grpo"}))

FULL_RECIPE = {"reshape": "reshaped_grpo", "reshape.amplify": "piecewise",
               "reshape.amplify_scale": 2.0, "reshape.focus_threshold": 0.5,
               "reshape.focus_damping": 0.1}
"""The blog's recipe with every component that acts under GRPO: the composite reward
(``reshaped_grpo``), piecewise amplification (``|A| > 1`` doubled: the blog's "分段放大") and a
focus threshold (``|A| < 0.5`` damped to a tenth: the blog's suppressed low-advantage samples);
``reshaped_full`` adds the trainer's learnability curriculum."""

LEAVE_ONE_OUT = ("composite", "amplify", "focus", "curriculum")
"""The components of ``reshaped_full`` that act under GRPO, each switched off in turn
(``full-<component>``)."""

METHODS.add("reshaped_full", Method("full recipe", {**FULL_RECIPE, "curriculum": True}))
for _off in LEAVE_ONE_OUT:
    _overrides = {**FULL_RECIPE, "curriculum": _off != "curriculum"}
    _overrides.update({f"reshape.{k}": v for k, v in COMPONENT_OFF.get(_off, {}).items()})
    METHODS.add(f"full-{_off}", Method(f"full recipe without {_off}", _overrides,
                                       variant_of="reshaped_full"))

# the credit experiment's other estimators (it compares credit without training)
METHODS.add("didpo_no_ae", Method("DiDPO, A_D only", {"estimator": "didpo_no_ae"}))
METHODS.add("didpo_group_mean", Method("DiDPO with group-mean anchors (non-paper)",
                                       {"estimator": "didpo_group_mean"}))
METHODS.add("didpo_fork_hunk", Method("DiDPO-fork, spread over hunks",
                                      {"estimator": "didpo_fork", "estimator_options": {"spread": "hunk"}}))
METHODS.add("oracle", Method("Shapley values on tokens", {"estimator": "oracle_hunk",
                                                          "estimator_options": {"episode": False}}))
METHODS.add("revert_one", Method("revert-one effects on tokens", {"estimator": "oracle_hunk",
                                                                  "estimator_options": {"episode": False}}))
METHODS.add("shuffled", Method("shuffled Shapley values", {"estimator": "oracle_hunk_shuffled",
                                                            "estimator_options": {"episode": False}}))

# muCODE's generators: what each relabels with
for _name, _label, _relabel in (
        ("expert_iteration", "expert iteration (muCODE)", "verifier"),
        ("ei_filtered", "expert iteration, public tests first", "verifier_public"),
        ("ei_oracle", "correct experts only", "oracle"),
        ("sft_self", "own correct samples", "self")):
    METHODS.add(_name, Method(_label, {"relabel": _relabel}, loop="mucode"))
