"""What an experiment decides, named before it runs: its claim, the claim's size from its
source, and its signed controls; everything else on its page is exploratory.

Each experiment module declares ``PRIMARY``, a tuple of :class:`Contrast` (one ``claim`` and
its ``positive`` and ``negative`` controls), and ``PRIMARY_KEY``, the paired evaluation they
are read on. :func:`read` turns a results dict into the ``primary`` record the page, the
README's findings and the lab report print: each contrast's change (seeds and tasks both
random, :mod:`labkit.experiments.stats`), the claim's verdict against its size (supported,
refuted at this scale, undecided) and each control's (passed, or "the control failed: ...").
:func:`exploratory` Holm-corrects every other contrast of the page as one family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from labkit.experiments import stats

ROLES = ("claim", "positive", "negative")


@dataclass(frozen=True)
class Contrast:
    """One primary contrast: ``variant - base`` (``base`` ``None``: the variant's change from
    the start policy)."""

    label: str
    """How the page names it (``DiDPO - GRPO``)."""
    role: str
    """``claim``, ``positive`` (a variant known to be better: it must come out better by at
    least the claim's smallest detectable effect) or ``negative`` (no signal: it must not come
    out better)."""
    variant: str
    """The method (or condition) whose change is read."""
    base: str | None = None
    """The method it is compared with, paired by seed and task; ``None``: the start."""
    direction: int = 1
    """The claimed (or, for a positive control, the expected) direction: +1 better, -1 worse."""
    size: float | None = None
    """The claimed effect in pass-rate units (``0.056``: 5.6 points); ``None`` with
    ``relative`` or for a control."""
    relative: float | None = None
    """The claimed effect relative to the base's end level (``0.35``: +35%), turned into
    pass-rate units on the measured level (:func:`read`)."""
    source: str = ""
    """Where the size comes from (paper, table, setting)."""
    of: str | None = None
    """For a control: the label of the claim it controls (default: the first claim)."""

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"contrast role {self.role!r}: choose one of {', '.join(ROLES)}")
        if self.direction not in (1, -1):
            raise ValueError(f"contrast direction must be +1 or -1, got {self.direction}")


def primary_key(config) -> str:
    """The paired evaluation a training experiment's claim is read on, by its config (the
    dataclass or its record): the screened list (``paired_screened``) when ``claim_on`` is
    ``screened``; else the held-out tasks no trained-on reference solves (``paired_clean``)
    when training used templates other than the shipped model's SFT ones (``val``), else the
    whole held-out list (``paired``)."""
    fields = config if isinstance(config, Mapping) else vars(config)
    if fields.get("claim_on", "standard") == "screened":
        return "paired_screened"
    return "paired_clean" if fields.get("train_split") != "train" else "paired"


Getter = Callable[[Mapping, "Contrast", str], tuple[Mapping | None, float | None]]
"""``(results, contrast, key) -> (change record, the base's end level)``."""


def method_change(results: Mapping, c: Contrast, key: str) -> tuple[Mapping | None, float | None]:
    """The contrast's change in a results dict of methods (``methods[m][f"{key}_change"]``):
    the variant's change from the start, or ``variant - base`` paired by seed and task; and
    the base's end level (the start's mean reading plus the base's change)."""
    methods = results.get("methods", {})
    var = methods.get(c.variant, {}).get(f"{key}_change")
    start = results.get(key, {}).get("start_mean", {}).get("pass_at_1")
    if c.base is None:
        return var, start
    base = methods.get(c.base, {}).get(f"{key}_change")
    if not var or not base:
        return None, None
    end = None if start is None else start + base["mean"]
    return stats.difference(base, var), end


def read(results: Mapping, primary: Sequence[Contrast], key: str,
         getter: Getter = method_change) -> dict:
    """The ``primary`` record of a page: per contrast its change (compact); each claim's
    verdict against its size, its smallest detectable effect (``mde``) and whether its positive
    controls passed (``testbed_sees``, ``None`` when none was run); each control's verdict, read
    against its claim's ``mde``. ``mde`` and ``testbed_sees`` at the top: the first claim's."""
    measured = [(c, *getter(results, c, key)) for c in primary]
    first = next((c.label for c in primary if c.role == "claim"), None)
    mdes = {c.label: (change or {}).get("mde") for c, change, _ in measured if c.role == "claim"}
    out: dict = {"key": key, "contrasts": []}
    for c, change, level in measured:
        size = c.size
        if c.relative is not None and level is not None:
            size = c.relative * level
        rec = {**{k: v for k, v in asdict(c).items() if v is not None}, "size_abs": size,
               "change": stats.compact(change)}
        if c.role != "claim":
            rec["of"] = c.of or first
        if not change:
            rec.update({"verdict": "undecided", "why": "not measured: this record has no runs of "
                        "both methods"} if c.role == "claim" else
                       {"passed": False, "why": "the control was not run"})
        elif c.role == "claim":
            rec.update(stats.claim_verdict(change, c.direction, size), mde=mdes[c.label],
                       plan=plan(change, size))
        else:
            rec.update(stats.control_verdict(change, c.direction if c.role == "positive" else 0,
                                             mdes.get(rec["of"])))
        out["contrasts"].append(rec)
    for rec in out["contrasts"]:
        if rec["role"] == "claim":
            positives = [r for r in out["contrasts"] if r["role"] == "positive" and r["of"] == rec["label"]
                         and r.get("change")]  # a control that was not run tells nothing
            rec["testbed_sees"] = all(r["passed"] for r in positives) if positives else None
    claim = claim_of(out)
    out["mde"] = claim.get("mde") if claim else None
    out["testbed_sees"] = claim.get("testbed_sees") if claim else None
    return out


def plan(change: Mapping, size: float | None) -> dict | None:
    """How many training seeds a design on the same tasks needs to detect half the claimed
    size, from this record's variance components (:func:`labkit.experiments.stats.seeds_needed`):
    ``{"target", "seeds"}`` (``seeds`` ``None``: not within 64), or ``None`` without a size or
    per-task data."""
    per_task = change.get("per_task")
    if size is None or not per_task or len(per_task) < 2 or change.get("tasks", 0) < 2:
        return None
    comp = stats.components(list(per_task.values()))
    target = abs(size) / 2
    return {"target": target, "seeds": stats.seeds_needed(comp, change["tasks"], target),
            "components": comp}


def restat_methods(results: dict, primary: Sequence[Contrast], key: str) -> dict:
    """A results dict of methods with every paired change computed again from its per-task
    changes (the statistics of this code; the measurements untouched) and its ``primary``
    record read again; the older, unsigned ``controls`` records are dropped."""
    for r in results.get("methods", {}).values():
        for k, v in list(r.items()):
            if k.endswith("_change") and isinstance(v, dict) and "per_task" in v:
                r[k] = stats.paired_change(v["per_task"], v.get("task_ids"))
    for stale in ("controls", "controls_trained"):
        results.pop(stale, None)
    if results.get(key):
        results["primary"] = read(results, primary, key)
    return results


def claim_of(primary: Mapping | None) -> Mapping | None:
    """The claim's row of a ``primary`` record."""
    return next((r for r in (primary or {}).get("contrasts", []) if r["role"] == "claim"), None)


def controls_of(primary: Mapping | None, role: str, of: str | None = None) -> list[Mapping]:
    """The ``positive`` or ``negative`` rows of a ``primary`` record (of the claim labelled
    ``of``; default: the first claim's)."""
    claim = claim_of(primary)
    of = of or (claim["label"] if claim else None)
    return [r for r in (primary or {}).get("contrasts", []) if r["role"] == role and r.get("of") == of]


def exploratory(rows: Sequence[tuple[str, Mapping]]) -> list[dict]:
    """Every other contrast of a page as one family: ``(label, change)`` pairs -> the same with
    the unadjusted ``p`` and Holm's adjusted ``p_holm`` (:func:`labkit.experiments.stats.holm`)
    and ``shown`` at 5% after the correction. Contrasts without a p (one seed) are kept with
    ``p_holm`` ``None``."""
    tested = [(i, r[1]["p"]) for i, r in enumerate(rows) if r[1].get("p") is not None]
    adjusted = dict(zip((i for i, _ in tested), stats.holm([p for _, p in tested])))
    return [{"label": label, "change": stats.compact(change), "p": change.get("p"),
             "p_holm": adjusted.get(i), "shown": adjusted.get(i, 1.0) < stats.ALPHA}
            for i, (label, change) in enumerate(rows)]
