"""Advantage estimators: pure functions from rewards (and groups) to per-token advantages.

One interface for every estimator. An estimator is a function
``f(inp: AdvantageInput, **options) -> AdvantageOutput`` registered in
:data:`ADVANTAGE_ESTIMATORS` with two pieces of metadata:

* ``needs``: which optional inputs it reads: fields of :class:`AdvantageInput` (``rollouts``,
  ``tasks``, ``forks``, ``hunks``) or any other measurement, found in
  :attr:`AdvantageInput.measured` by its name; :func:`compute_advantages` refuses a call that
  lacks one, and the trainer provides what its estimator needs: the step's rollouts and
  tasks, and every other need from the rollout stage registered for it
  (:data:`labkit.loops.stages.STAGES`: forks are made only for an estimator that needs them);
* ``credit``: ``sequence`` (one value per sequence, broadcast to its tokens) or ``token``
  (per-token credit, e.g. DiDPO's diff anchors).

Its options (``TrainConfig.estimator_options``) are its keyword parameters; one that passes
``**options`` on says where with two more pieces of metadata, ``options`` (the estimator or
config dataclass that takes them) and ``fixed`` (those it sets itself).
:func:`check_options` checks a config's options by name and type before anything trains.

The output always holds ``[B, T]`` advantages over completion tokens, a flat dict of
metrics and ``artifacts`` (e.g. DiDPO's anchors, which the trainer logs). Adding an
estimator: write the function, register it with its metadata; nothing else in the trainer
changes (``docs/training.md``). Conventions follow verl's ``core_algos``
(``compute_grpo_outcome_advantage`` and friends):

* a one-member group uses mean 0 and std 1;
* the std is the unbiased one (``n - 1``);
* a group whose scores are all equal gets advantage 0 and is counted in
  ``adv/zero_std_frac``.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from labkit.config import coerce, did_you_mean
from labkit.registry import Registry

if TYPE_CHECKING:
    from labkit.env.records import RepairTask, Rollout

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")
"""Estimators by name; metadata ``needs`` (a tuple of :class:`AdvantageInput` fields) and
``credit`` (``sequence`` or ``token``)."""
EPS = 1e-6
INPUTS = ("rollouts", "tasks", "forks", "hunks")
"""The optional :class:`AdvantageInput` fields an estimator may declare it needs; a need of
any other name is read from :attr:`AdvantageInput.measured`."""


@dataclass
class ForkSites:
    """Measured counterfactual forks (:func:`labkit.credit.fork_credit.fork_sites`): fork
    ``f`` branched row ``row[f]`` at completion token ``t[f]`` and changed the reward by
    ``dr[f] = R(factual) - R(counterfactual)``."""

    row: torch.Tensor  # [F] long
    t: torch.Tensor  # [F] long
    dr: torch.Tensor  # [F] float64

    def __len__(self) -> int:
        return int(self.row.numel())


@dataclass
class HunkValues:
    """Measured per-hunk credit of each row (:func:`labkit.credit.oracle.shapley_values` of the
    rollout's diff hunks, run in the sandbox by the loops floor): ``rows[b]`` lists, for each
    hunk of row ``b``'s code against its buggy code, the completion tokens the hunk covers and
    its value ``phi``."""

    rows: list[list[tuple[tuple[int, ...], float]]]

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class AdvantageInput:
    """What an estimator may look at. ``rewards[b]`` is sequence b's scalar score,
    ``groups[b]`` its group id (one task's G samples share an id), ``mask`` the completion
    mask. The optional fields are filled for estimators that declare them in ``needs``."""

    rewards: torch.Tensor  # [B]
    groups: Sequence  # len B, hashable ids
    mask: torch.Tensor  # [B, T] completion mask
    rollouts: Sequence[Rollout] | None = None
    """Row b's :class:`~labkit.env.records.Rollout` (token ids, offsets, extracted code)."""
    tasks: Sequence[RepairTask] | None = None
    """Row b's task (its ``buggy_code`` is what diffs are taken against)."""
    forks: ForkSites | None = None
    """Counterfactual forks measured on these rows (:class:`ForkSites`)."""
    hunks: HunkValues | None = None
    """Per-hunk values measured on these rows (:class:`HunkValues`)."""
    measured: Mapping[str, Any] = field(default_factory=dict)
    """What rollout stages measured for needs that are not fields above, by need (a need
    whose stage was registered later: :data:`labkit.loops.stages.STAGES`)."""

    def need(self, name: str) -> Any:
        """The input of need ``name``: its field, else its entry of :attr:`measured` (``None``
        when absent)."""
        return getattr(self, name) if name in INPUTS else self.measured.get(name)

    def supplied(self, measured: Mapping[str, Any]) -> AdvantageInput:
        """These rows with what rollout stages measured, by need: a need that is a field
        (``forks``, ``hunks``) fills it, any other joins :attr:`measured`."""
        fields = {k: v for k, v in measured.items() if k in INPUTS}
        rest = {k: v for k, v in measured.items() if k not in INPUTS}
        return dataclasses.replace(self, **fields, measured={**self.measured, **rest})


@dataclass
class AdvantageOutput:
    """An estimator's result: ``advantages [B, T]`` (0 at masked tokens), flat ``metrics``
    (``adv/*``, ...), and ``artifacts`` the trainer may log (e.g. ``{"anchors": ...}``).
    Unpacks and indexes like the pair ``(advantages, metrics)`` (``adv, m = ...``)."""

    advantages: torch.Tensor  # [B, T]
    metrics: dict = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator:
        return iter((self.advantages, self.metrics))

    def __getitem__(self, i: int):
        return (self.advantages, self.metrics)[i]


def group_stats(rewards: torch.Tensor, groups: Sequence) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sequence group mean, unbiased std and group size (``[B]`` each).

    A one-member group gets mean 0, std 1 (verl's convention).
    """
    ids: dict = {}
    gidx = torch.tensor([ids.setdefault(g, len(ids)) for g in groups], dtype=torch.long)  # [B]
    n_groups = len(ids)
    r = rewards.double()
    count = torch.zeros(n_groups, dtype=torch.double).index_add_(0, gidx, torch.ones_like(r))
    total = torch.zeros(n_groups, dtype=torch.double).index_add_(0, gidx, r)
    mean = total / count  # [G]
    sq = torch.zeros(n_groups, dtype=torch.double).index_add_(0, gidx, (r - mean[gidx]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))  # [G]
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[gidx].to(rewards.dtype), std[gidx].to(rewards.dtype), count[gidx]


def _zero_std_frac(rewards: torch.Tensor, groups: Sequence) -> float:
    by: dict = {}
    for r, g in zip(rewards.tolist(), groups):
        by.setdefault(g, []).append(r)
    multi = [v for v in by.values() if len(v) > 1]
    return sum(max(v) - min(v) < 1e-12 for v in multi) / max(1, len(multi))


def _broadcast(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return adv.unsqueeze(-1) * mask  # [B, T]


def _metrics(adv_seq: torch.Tensor, inp: AdvantageInput) -> dict:
    return {"adv/mean": adv_seq.mean().item(), "adv/std": adv_seq.std().item() if adv_seq.numel() > 1 else 0.0,
            "adv/max": adv_seq.max().item(), "adv/min": adv_seq.min().item(),
            "adv/zero_frac": (adv_seq.abs() < 1e-12).double().mean().item(),
            "adv/zero_std_frac": _zero_std_frac(inp.rewards, inp.groups)}


@ADVANTAGE_ESTIMATORS.register("grpo", needs=(), credit="sequence")
def grpo(inp: AdvantageInput, eps: float = EPS) -> AdvantageOutput:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath):

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)``, std unbiased, broadcast to tokens.
    """
    mean, std, _ = group_stats(inp.rewards, inp.groups)
    adv = (inp.rewards - mean) / (std + eps)  # [B]
    return AdvantageOutput(_broadcast(adv, inp.mask), _metrics(adv, inp))


@ADVANTAGE_ESTIMATORS.register("dr_grpo", needs=(), credit="sequence")
def dr_grpo(inp: AdvantageInput) -> AdvantageOutput:
    """Dr. GRPO (Liu et al. 2025): no std division, ``A_i = r_i - mean_g(r)``."""
    mean, _, _ = group_stats(inp.rewards, inp.groups)
    adv = inp.rewards - mean  # [B]
    return AdvantageOutput(_broadcast(adv, inp.mask), _metrics(adv, inp))


@ADVANTAGE_ESTIMATORS.register("rloo", needs=(), credit="sequence")
def rloo(inp: AdvantageInput) -> AdvantageOutput:
    """RLOO (Ahmadian et al. 2024): leave-one-out baseline,
    ``A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_g(r))`` (0 for n = 1)."""
    mean, _, n = group_stats(inp.rewards, inp.groups)
    factor = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n)).to(inp.rewards.dtype)
    adv = factor * (inp.rewards - mean)  # [B]
    return AdvantageOutput(_broadcast(adv, inp.mask), _metrics(adv, inp))


@ADVANTAGE_ESTIMATORS.register("batch_norm", needs=(), credit="sequence")
def batch_norm(inp: AdvantageInput, eps: float = EPS) -> AdvantageOutput:
    """REINFORCE with a batch baseline: ``A_i = (r_i - mean_B(r)) / (std_B(r) + eps)``."""
    r = inp.rewards
    std = r.std() if r.numel() > 1 else torch.ones((), dtype=r.dtype)
    adv = (r - r.mean()) / (std + eps)  # [B]
    return AdvantageOutput(_broadcast(adv, inp.mask), _metrics(adv, inp))


def needs(name: str) -> tuple[str, ...]:
    """The optional inputs estimator ``name`` reads (its registry metadata)."""
    return tuple(ADVANTAGE_ESTIMATORS.meta(name).get("needs", ()))


def _annotation(fn, param: inspect.Parameter) -> Any:
    """A parameter's annotation as a type (``Any`` when it has none or it cannot be read)."""
    ann = param.annotation
    if ann is inspect.Parameter.empty:
        return Any
    if isinstance(ann, str):
        try:
            return eval(ann, fn.__globals__)  # noqa: S307 - the module's own annotation text
        except Exception:  # noqa: BLE001 - an annotation naming a type-checking-only import
            return Any
    return ann


def _options_config(name: str) -> type | None:
    """The config dataclass that takes estimator ``name``'s ``**options`` (followed through
    the estimators it passes them to), if any."""
    more = ADVANTAGE_ESTIMATORS.meta(name).get("options")
    if isinstance(more, str):
        return _options_config(more)
    return more


def estimator_options(name: str) -> dict[str, Any]:
    """The options estimator ``name`` takes in ``TrainConfig.estimator_options``, each with
    its type: its keyword parameters after ``inp``, then those its ``options`` metadata names
    (another estimator's options, or a config dataclass's fields), less its ``fixed`` ones."""
    fn, meta = ADVANTAGE_ESTIMATORS.get(name), ADVANTAGE_ESTIMATORS.meta(name)
    out: dict[str, Any] = {}
    for param in list(inspect.signature(fn).parameters.values())[1:]:
        if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            out[param.name] = _annotation(fn, param)
    more = meta.get("options")
    if isinstance(more, str):
        out.update(estimator_options(more))
    elif more is not None:
        hints = typing.get_type_hints(more)
        out.update({f.name: hints[f.name] for f in dataclasses.fields(more) if f.init})
    for name_ in meta.get("fixed", ()):
        out.pop(name_, None)
    return out


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` for the first of ``options`` estimator ``name`` does not take (naming
    the closest it does) or whose value is not of its type; options bound for a config
    dataclass (didpo's :class:`~labkit.credit.anchors.AnchorConfig`) are validated as that
    config. Runs when a ``TrainConfig`` is built, so a typo fails before the model loads."""
    known = estimator_options(name)
    for key, value in options.items():
        if key not in known:
            raise ValueError(f"estimator_options: {name} takes no option {key!r}"
                             f"{did_you_mean(key, known)}; its options: "
                             f"{', '.join(sorted(known)) or 'none'}")
        coerce(value, known[key], f"estimator_options.{key}")
    config = _options_config(name)
    if config is not None:
        names = {f.name for f in dataclasses.fields(config)}
        check = getattr(config(**{k: v for k, v in options.items() if k in names}), "validate", None)
        if callable(check):
            try:
                check()
            except ValueError as e:
                raise ValueError(f"estimator_options: {e}") from None


def compute_advantages(name: str, inp: AdvantageInput, **kwargs) -> AdvantageOutput:
    """Look up estimator ``name``, check it has the inputs it needs, and apply it."""
    fn = ADVANTAGE_ESTIMATORS.get(name)
    missing = [f for f in needs(name) if inp.need(f) is None]
    if missing:
        where = f"AdvantageInput.{missing[0]}=..." if missing[0] in INPUTS else \
            f"AdvantageInput.measured[{missing[0]!r}]"
        raise ValueError(f"estimator {name!r} needs {', '.join(missing)} in its AdvantageInput "
                         f"(set {where})")
    out = fn(inp, **kwargs)
    if not isinstance(out, AdvantageOutput):
        raise TypeError(f"estimator {name!r} returned {type(out).__name__}, not AdvantageOutput")
    return out
