"""DiDPO diff-anchor credit (Diff-in-Diff Policy Optimization, arXiv 2608.07147).

``docs/didpo.md`` records what the paper and its released code specify, and where this
implementation differs. For the G rollouts of one task:

1. **roots**: each rollout's gated changed lines (:func:`labkit.credit.diffs.root_diff`);
2. **sub-diff candidates**: every whole root (exact hash), and for at most ``pair_budget``
   pairs of distinct roots the blocks of a line-level ``difflib.SequenceMatcher``
   alignment: ``equal`` blocks, and ``replace`` blocks whose character similarity is
   ``>= eta``. Only when the alignment finds nothing, an AST split of every root (top-level
   definition / hunk) supplies the candidates. The members of each candidate are then found
   in all G roots by exact hash of its normalised lines;
3. **near-duplicate merging** around a representative (not transitive);
4. **groupability** (paper Eq. 9), ``L`` the mean sub-diff size in lines, ``n`` the number of
   rollouts sharing it: ``GS = (1 - exp(-L / s0)) * (1 - exp(-(n - 1) / g0))``;
5. **anchors**: greedy by GS, at most K per task; a line claimed inside one rollout stays
   with the higher-GS anchor;
6. **advantage**: ``A_D(i) = R_i - mean_{j in group} R_j`` per anchor member, and per token
   ``A(i, t) = A_E(i) + lambda * A_D(highest-GS anchor covering t)`` with ``A_E`` the GRPO
   episode advantage; tokens outside every anchor get ``A_E`` alone.

Estimators registered in ``ADVANTAGE_ESTIMATORS``: ``didpo`` and the paper's ablations
``didpo_no_ae`` (without A_E), ``didpo_no_ad`` (without A_D: GRPO), ``didpo_whole_diff``
(whole root as one unit) and ``didpo_additive_gs``.
"""

from __future__ import annotations

import ast
import itertools
import math
import random
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from difflib import SequenceMatcher
from typing import Literal

import torch

from labkit.credit.advantages import ADVANTAGE_ESTIMATORS, EPS, AdvantageInput, AdvantageOutput, grpo
from labkit.credit.diffs import RootDiff, clear_caches, root_diff
from labkit.env.records import Rollout

GSForm = Literal["mul", "add", "log"]


@dataclass
class AnchorConfig:
    """How anchors are found and scored (paper defaults, ``didpo/HYPERPARAMETERS.md``)."""

    eta: float = 0.8
    """Similarity ratio at or above which a ``replace`` block is a sub-diff, and near-duplicate
    sub-diffs merge. Lower: more, looser groups whose members made different edits."""
    s0: float = 8.0
    """Size scale of ``phi(L) = 1 - exp(-L / s0)`` (lines)."""
    g0: float = 8.0
    """Group scale of ``psi(n) = 1 - exp(-(n - 1) / g0)`` (rollouts)."""
    K: int = 64
    """At most this many anchors per task."""
    pair_budget: int = 8
    """Root pairs aligned per task (the paper's lightweight mode). Pairs are drawn uniformly
    under ``seed``; shared sub-diffs of pairs not drawn are found only through hashing."""
    exhaustive: bool = False
    """Align every pair of distinct roots (``m (m - 1) / 2`` alignments) instead."""
    gs_form: GSForm = "mul"
    """``mul`` (paper), ``add`` or ``log`` (ablations, see :func:`groupability`)."""
    divide_std: bool = False
    """Divide ``A_D`` by the group's unbiased std (+1e-6); the paper does not."""
    ad_form: Literal["paper", "group_mean"] = "paper"
    """``paper``: ``A_D(i) = R_i - mean_{j in group} R_j``, member by member: within one
    rollout a real fix (shared with successful rollouts, so a high group mean) gets a *lower*
    ``A_D`` than a stray edit, by construction. ``group_mean`` (NOT in the paper, an
    ablation): ``A_D = mean_{j in group} R_j - mean_{task} R``, the same for every member: how
    much better the rollouts sharing the edit did than the task's average."""
    whole_diff: bool = False
    """Ablation: the whole root is the only unit (no alignment, no AST split)."""
    seed: int | str = 0
    """Seed of the pair choice; the estimator appends the task id."""

    def validate(self) -> None:
        if not 0.0 < self.eta <= 1.0:
            raise ValueError("eta must be in (0, 1]")
        if self.s0 <= 0 or self.g0 <= 0:
            raise ValueError("s0 and g0 must be > 0")
        if self.K < 0 or self.pair_budget < 0:
            raise ValueError("K and pair_budget must be >= 0")
        if self.ad_form not in ("paper", "group_mean"):
            raise ValueError(f"ad_form must be 'paper' or 'group_mean', not {self.ad_form!r}")
        if self.gs_form not in ("mul", "add", "log"):
            raise ValueError(f"gs_form must be 'mul', 'add' or 'log', not {self.gs_form!r}")


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Member:
    """One rollout of an anchor's group."""

    rollout: int
    """Index of the rollout in the list given to :func:`task_anchors`."""
    size: int
    """Lines of the sub-diff this rollout produced (its own variant after merging)."""
    reward: float
    """``R_i``: the return the anchor's baseline is taken over."""
    a_d: float
    """``A_D(i) = R_i - mean(group rewards)`` (divided by the group std with ``divide_std``)."""
    lines: tuple[int, ...]
    """Code line indices this anchor credits in the rollout (empty when a higher-GS anchor
    claimed them all: the rollout still counts in the group)."""
    spans: tuple[tuple[int, int], ...]
    """Completion characters ``[start, end)`` of those lines."""
    tokens: tuple[int, ...]
    """Completion token indices that receive ``A_D`` from this anchor."""


@dataclass(frozen=True)
class Anchor:
    """A sub-diff shared by a group of rollouts of one task, and the credit it carries."""

    id: int
    """Rank in the greedy selection (0 = highest GS)."""
    text: tuple[str, ...]
    """The representative sub-diff: normalised lines."""
    source: str
    """How the representative was found: ``root`` (whole root, exact hash), ``equal`` or
    ``near`` (alignment block), ``ast`` (fallback split)."""
    L: float
    """Mean sub-diff size in lines over the members."""
    n: int
    """Number of rollouts sharing the sub-diff."""
    gs: float
    """Groupability score."""
    members: tuple[Member, ...]

    @property
    def group_rewards(self) -> tuple[float, ...]:
        return tuple(m.reward for m in self.members)


# ----------------------------------------------------------------------------- scores


def groupability(L: float, n: int, s0: float = 8.0, g0: float = 8.0, form: GSForm = "mul") -> float:
    """Groupability score of a sub-diff of mean size ``L`` lines shared by ``n`` rollouts.

    ``mul`` (paper Eq. 9): ``GS = phi(L) * psi(n)``, ``phi(L) = 1 - exp(-L / s0)``,
    ``psi(n) = 1 - exp(-(n - 1) / g0)``; a sub-diff nobody else produced (n = 1) scores 0.
    ``add`` (ablation): ``GS = (phi(L) + psi(n)) / 2``: size alone makes an unshared
    sub-diff score > 0. ``log`` (ablation): ``GS = log(1 + L / s0) * log(1 + (n - 1) / g0)``,
    logarithmic instead of saturating growth.
    """
    if form == "log":
        return math.log1p(L / s0) * math.log1p((n - 1) / g0)
    phi = 1.0 - math.exp(-L / s0)
    psi = 1.0 - math.exp(-(n - 1) / g0)
    return phi * psi if form == "mul" else (phi + psi) / 2.0


def returns_to_go(rewards: Sequence[float], gamma: float = 0.95) -> list[float]:
    """Step return-to-go over the turns of one episode: ``G_t = sum_{k >= t} gamma^(k - t) r_k``.

    In a multi-turn episode an anchor member's ``R_i`` is the ``G_t`` of the turn whose
    edit holds the sub-diff; single-turn repair (this lab's trainer) has ``G_0 = R``.
    """
    out, g = [], 0.0
    for r in reversed(rewards):
        g = r + gamma * g
        out.append(g)
    return out[::-1]


# ----------------------------------------------------------------------------- sub-diffs

Text = tuple[str, ...]


@dataclass(frozen=True)
class PairMatch:
    """A sub-diff candidate from aligning two roots: the block on each side."""

    kind: Literal["equal", "near"]
    a: Text
    b: Text
    ratio: float
    """Character similarity of the two blocks (1 for ``equal``)."""


def similarity(a: Text, b: Text) -> float:
    """``ratio = 2 M / (|a| + |b|)`` over the characters of the newline-joined lines, ``M``
    the matched characters (``difflib.SequenceMatcher.ratio``)."""
    return SequenceMatcher(None, "\n".join(a), "\n".join(b), autojunk=False).ratio()


def align(a: Text, b: Text, eta: float = 0.8) -> list[PairMatch]:
    """Sub-diff candidates shared by roots ``a`` and ``b`` (normalised lines).

    A line-level ``SequenceMatcher`` alignment; every ``equal`` block is a candidate, and so
    is every ``replace`` block with ``similarity(a[i1:i2], b[j1:j2]) >= eta`` (its two sides
    are near-duplicates). Inserted and deleted blocks are not shared.
    """
    out = []
    for op, i1, i2, j1, j2 in SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(PairMatch("equal", a[i1:i2], b[j1:j2], 1.0))
        elif op == "replace":
            ratio = similarity(a[i1:i2], b[j1:j2])
            if ratio >= eta:
                out.append(PairMatch("near", a[i1:i2], b[j1:j2], ratio))
    return out


def choose_pairs(m: int, budget: int, seed: int | str = 0,
                 exhaustive: bool = False) -> list[tuple[int, int]]:
    """Which of ``m`` distinct roots to align: every pair when ``exhaustive`` or when there
    are at most ``budget``, else ``budget`` pairs drawn uniformly (``random.Random(seed)``,
    so the same seed draws the same pairs), in sorted order."""
    pairs = list(itertools.combinations(range(m), 2))
    if exhaustive or len(pairs) <= budget:
        return pairs
    return sorted(random.Random(seed).sample(pairs, budget))


def ast_units(root: RootDiff, code: str) -> list[tuple[int, int]]:
    """Fallback split of a root: ``[start, stop)`` positions in ``root.lines`` of each hunk and
    of the root lines inside each top-level ``def`` / ``class`` of ``code`` (hunks only when
    the code does not parse)."""
    units = set(root.hunks())
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return sorted(units)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            inside = [p for p, line in enumerate(root.lines)
                      if first <= line.index < node.end_lineno]
            if inside:
                units.add((inside[0], inside[-1] + 1))
    return sorted(units)


def candidate_texts(roots: Sequence[RootDiff], codes: Sequence[str],
                    cfg: AnchorConfig) -> dict[Text, str]:
    """Sub-diff candidates of one task, each with its source (``root``, ``equal``, ``near``,
    ``ast``), in discovery order. Distinct non-empty roots are the candidates of
    ``whole_diff``; otherwise ``choose_pairs`` of them are aligned, and when that finds
    nothing every root's :func:`ast_units` are the candidates."""
    seqs = [root.texts for root in roots]
    found = {s: "root" for s in seqs if s}
    if cfg.whole_diff:
        return found
    classes = list(found)
    matches = [m for i, j in choose_pairs(len(classes), cfg.pair_budget, cfg.seed, cfg.exhaustive)
               for m in align(classes[i], classes[j], cfg.eta)]
    for m in matches:
        found.setdefault(m.a, m.kind)
        found.setdefault(m.b, m.kind)
    if not matches:
        for root, code, seq in zip(roots, codes, seqs):
            for p, q in ast_units(root, code):
                found.setdefault(seq[p:q], "ast")
    return found


def find_occurrences(seqs: Sequence[Text],
                     texts: Sequence[Text]) -> dict[Text, dict[int, list[int]]]:
    """Exact-hash matches: ``out[text][b]`` = start positions of ``text`` as a contiguous
    window of root ``seqs[b]`` (one hash lookup per window of a needed length)."""
    wanted: dict[int, set[Text]] = {}
    for t in texts:
        wanted.setdefault(len(t), set()).add(t)
    out: dict[Text, dict[int, list[int]]] = {t: {} for t in texts}
    for size, keys in wanted.items():
        for b, seq in enumerate(seqs):
            for p in range(len(seq) - size + 1):
                window = seq[p:p + size]
                if window in keys:
                    out[window].setdefault(b, []).append(p)
    return out


def merge_near_duplicates(texts: Sequence[Text], eta: float = 0.8) -> list[list[int]]:
    """Clusters of near-duplicate sub-diffs around representatives, as index lists
    (representative first).

    ``texts`` are taken in order; the first unassigned one becomes a representative and
    absorbs every unassigned ``t`` with ``similarity(rep, t) >= eta``. Only similarity to the
    representative counts: ``a ~ b`` and ``b ~ c`` does not put ``c`` with ``a``.
    """
    joined = ["\n".join(t) for t in texts]
    left = list(range(len(texts)))
    clusters = []
    while left:
        rep, rest = left[0], left[1:]
        sm = SequenceMatcher(None, autojunk=False)
        sm.set_seq2(joined[rep])
        cluster, left = [rep], []
        for k in rest:
            sm.set_seq1(joined[k])
            near = sm.real_quick_ratio() >= eta and sm.quick_ratio() >= eta and sm.ratio() >= eta
            (cluster if near else left).append(k)
        clusters.append(cluster)
    return clusters


# ----------------------------------------------------------------------------- anchors


@dataclass
class Unit:
    """A merged sub-diff before selection: which root lines of which rollouts it covers."""

    text: Text
    source: str
    lines: dict[int, set[int]]  # rollout -> positions in its root
    size: dict[int, int]  # rollout -> lines of the variant it produced

    @property
    def L(self) -> float:
        return sum(self.size.values()) / len(self.size)


def shared_units(roots: Sequence[RootDiff], codes: Sequence[str], cfg: AnchorConfig) -> list[Unit]:
    """Candidates found, located in every root by hash, merged around representatives
    (most-shared first, then longest, then text order)."""
    seqs = [root.texts for root in roots]
    found = candidate_texts(roots, codes, cfg)
    occ = find_occurrences(seqs, list(found))
    order = sorted(found, key=lambda t: (-len(occ[t]), -len(t), t))
    units = []
    for cluster in merge_near_duplicates(order, cfg.eta):
        unit = Unit(order[cluster[0]], found[order[cluster[0]]], {}, {})
        for text in (order[k] for k in cluster):
            for b, starts in occ[text].items():
                covered = {p + d for p in starts for d in range(len(text))}
                unit.lines.setdefault(b, set()).update(covered)
                unit.size[b] = max(unit.size.get(b, 0), len(text))
        units.append(unit)
    return units


def select_anchors(units: Sequence[Unit], roots: Sequence[RootDiff], rollouts: Sequence[Rollout],
                   rewards: Sequence[float], cfg: AnchorConfig) -> list[Anchor]:
    """Greedy anchor selection and credit.

    Units are taken by ``GS`` (ties: larger n, larger L, text order) while ``GS > 0`` and
    fewer than K are chosen. In each member the lines (and tokens) already claimed by a
    higher-GS anchor are cut; a unit left with no line to credit is skipped. The group keeps
    every member: ``A_D(i) = R_i - mean_{j in group} R_j`` (``/ (std + 1e-6)``, unbiased std,
    with ``divide_std``).
    """
    gs_of = [groupability(u.L, len(u.lines), cfg.s0, cfg.g0, cfg.gs_form) for u in units]
    scored = sorted(zip(gs_of, units),
                    key=lambda su: (-su[0], -len(su[1].lines), -su[1].L, su[1].text))
    claimed_lines: list[set[int]] = [set() for _ in roots]
    claimed_tokens: list[set[int]] = [set() for _ in roots]
    anchors: list[Anchor] = []
    for gs, unit in scored:
        if gs <= 0 or len(anchors) == cfg.K:
            break
        free = {b: sorted(pos - claimed_lines[b]) for b, pos in unit.lines.items()}
        if not any(free.values()):
            continue
        group = [rewards[b] for b in sorted(unit.lines)]
        mean = sum(group) / len(group)
        task_mean = sum(rewards) / len(rewards)
        scale = 1.0
        if cfg.divide_std:
            scale = (statistics.stdev(group) if len(group) > 1 else 1.0) + EPS
        members = []
        for b in sorted(unit.lines):
            lines = [roots[b].lines[p] for p in free[b]]
            spans = tuple(line.span for line in lines)
            tokens = sorted({t for s in spans for t in rollouts[b].tokens_in_span(*s)}
                            - claimed_tokens[b])
            claimed_lines[b].update(free[b])
            claimed_tokens[b].update(tokens)
            a_d = ((rewards[b] - mean) if cfg.ad_form == "paper" else (mean - task_mean)) / scale
            members.append(Member(b, unit.size[b], rewards[b], a_d,
                                  tuple(line.index for line in lines), spans, tuple(tokens)))
        anchors.append(Anchor(len(anchors), unit.text, unit.source, unit.L, len(unit.lines), gs,
                              tuple(members)))
    return anchors


def task_anchors(rollouts: Sequence[Rollout], rewards: Sequence[float], buggy_code: str,
                 **opts) -> list[Anchor]:
    """The anchors of one task's rollouts (``opts``: :class:`AnchorConfig` fields).

    ``rewards[i]`` is rollout i's return ``R_i`` (:func:`returns_to_go` of the turn for
    multi-turn episodes). Members refer to rollouts by their index in ``rollouts``.
    """
    cfg = AnchorConfig(**opts)
    cfg.validate()
    roots = [root_diff(r.code, buggy_code, r.code_start) for r in rollouts]
    units = shared_units(roots, [r.code for r in rollouts], cfg)
    return select_anchors(units, roots, rollouts, [float(r) for r in rewards], cfg)


# ----------------------------------------------------------------------------- estimator


def _token_metrics(adv: torch.Tensor, mask: torch.Tensor) -> dict:
    vals = adv[mask.bool()]  # [N] unmasked tokens
    if vals.numel() == 0:
        return {}
    return {"adv/mean": vals.mean().item(),
            "adv/std": vals.std().item() if vals.numel() > 1 else 0.0,
            "adv/max": vals.max().item(), "adv/min": vals.min().item(),
            "adv/zero_frac": (vals.abs() < 1e-12).double().mean().item()}


@ADVANTAGE_ESTIMATORS.register("didpo", needs=("rollouts", "tasks"), credit="token",
                               options=AnchorConfig)
def didpo(inp: AdvantageInput, lam: float = 1.0, no_episode: bool = False, no_diff: bool = False,
          **anchor_opts) -> AdvantageOutput:
    """DiDPO per-token advantage (arXiv 2608.07147):

    ``A(i, t) = A_E(i) + lambda * A_D(i, a*(t))``, ``A_E`` the GRPO advantage of
    :func:`labkit.credit.advantages.grpo`, ``a*(t)`` the highest-GS anchor covering token t
    (``A_D = 0`` outside anchors), ``A_D(i, a) = R_i - mean_{j in group(a)} R_j``.

    Reads ``inp.rollouts`` (``Rollout`` per row) and ``inp.tasks`` (its ``RepairTask``);
    groups are ``inp.groups``. Ablations: ``no_episode`` drops ``A_E``, ``no_diff`` drops
    ``A_D`` (exactly GRPO, no anchors built); ``anchor_opts`` are :class:`AnchorConfig` fields
    (``whole_diff``, ``gs_form``, ...; the pairs of group g are drawn under
    ``f"{seed}/{g}"``). ``artifacts["anchors"]`` maps each group id to its anchors, for
    logging.
    """
    a_e, metrics = grpo(inp)  # [B, T]
    if no_diff:
        return AdvantageOutput(a_e, metrics)
    if inp.rollouts is None or inp.tasks is None:
        raise ValueError("didpo needs AdvantageInput.rollouts and .tasks (one per row)")
    rollouts, tasks = inp.rollouts, inp.tasks
    seed = anchor_opts.pop("seed", 0)
    rows: dict = {}
    for b, g in enumerate(inp.groups):
        rows.setdefault(g, []).append(b)

    t0 = time.perf_counter()
    a_d = torch.zeros_like(a_e)  # [B, T]
    covered = torch.zeros_like(inp.mask, dtype=torch.bool)  # [B, T]
    built: dict = {}
    for g, idx in rows.items():
        built[g] = task_anchors([rollouts[b] for b in idx], inp.rewards[idx].tolist(),
                                tasks[idx[0]].buggy_code, seed=f"{seed}/{g}", **anchor_opts)
        for anchor in built[g]:
            for m in anchor.members:
                a_d[idx[m.rollout], list(m.tokens)] = m.a_d
                covered[idx[m.rollout], list(m.tokens)] = True
    build_s = time.perf_counter() - t0

    adv = (lam * a_d if no_episode else a_e + lam * a_d) * inp.mask  # [B, T]
    every = [a for anchors in built.values() for a in anchors]
    metrics.update(_token_metrics(adv, inp.mask))
    metrics.update({
        "anchors/count": float(len(every)),
        "anchors/mean_group_size": sum(a.n for a in every) / len(every) if every else 0.0,
        "anchors/mean_gs": sum(a.gs for a in every) / len(every) if every else 0.0,
        "anchors/token_coverage": ((covered & inp.mask.bool()).sum()
                                   / inp.mask.sum().clamp(min=1)).item(),
        "anchors/ad_nonzero_frac": (((a_d != 0) & inp.mask.bool()).sum()
                                    / inp.mask.sum().clamp(min=1)).item(),
        "anchors/build_s": build_s,
    })
    return AdvantageOutput(adv, metrics, {"anchors": built})


@ADVANTAGE_ESTIMATORS.register("didpo_no_ae", needs=("rollouts", "tasks"), credit="token",
                               options="didpo", fixed=("no_episode",))
def didpo_no_ae(inp: AdvantageInput, **opts) -> AdvantageOutput:
    """Ablation: DiDPO without the episode term, ``A(i, t) = lambda * A_D``."""
    return didpo(inp, no_episode=True, **opts)


@ADVANTAGE_ESTIMATORS.register("didpo_no_ad", needs=(), credit="sequence",
                               options="didpo", fixed=("no_diff",))
def didpo_no_ad(inp: AdvantageInput, **opts) -> AdvantageOutput:
    """Ablation: DiDPO without the diff term, ``A(i, t) = A_E(i)`` (GRPO)."""
    return didpo(inp, no_diff=True, **opts)


@ADVANTAGE_ESTIMATORS.register("didpo_whole_diff", needs=("rollouts", "tasks"), credit="token",
                               options="didpo", fixed=("whole_diff",))
def didpo_whole_diff(inp: AdvantageInput, **opts) -> AdvantageOutput:
    """Ablation: the whole root diff is the only unit of credit (no sub-diffs)."""
    return didpo(inp, whole_diff=True, **opts)


@ADVANTAGE_ESTIMATORS.register("didpo_additive_gs", needs=("rollouts", "tasks"), credit="token",
                               options="didpo", fixed=("gs_form",))
def didpo_additive_gs(inp: AdvantageInput, **opts) -> AdvantageOutput:
    """Ablation: additive groupability ``GS = (phi(L) + psi(n)) / 2``."""
    return didpo(inp, gs_form="add", **opts)


@ADVANTAGE_ESTIMATORS.register("didpo_group_mean", needs=("rollouts", "tasks"), credit="token",
                               options="didpo", fixed=("ad_form",))
def didpo_group_mean(inp: AdvantageInput, **opts) -> AdvantageOutput:
    """NOT the paper's estimator (a labelled ablation): ``A_D`` of an anchor is its group's mean
    reward minus the task's mean reward, the same for every member (``ad_form="group_mean"``)."""
    return didpo(inp, ad_form="group_mean", **opts)


# ----------------------------------------------------------------------------- inspection


def anchor_records(anchors: Sequence[Anchor], **context) -> list[dict]:
    """One plain dict per anchor (members nested), ``context`` (e.g. ``step``, ``task_id``)
    merged in: lines for ``anchors.jsonl``."""
    return [{**context, **asdict(a)} for a in anchors]


def anchors_frame(anchors: Sequence[Anchor]):
    """A ``pandas.DataFrame`` with one row per (anchor, member)."""
    import pandas as pd

    head = [f.name for f in fields(Anchor) if f.name != "members"]
    rows = [{**{k: getattr(a, k) for k in head}, "text": "\n".join(a.text), "group_mean":
             sum(a.group_rewards) / a.n, "rollout": m.rollout, "size": m.size, "reward": m.reward,
             "a_d": m.a_d, "n_lines": len(m.lines), "n_tokens": len(m.tokens)}
            for a in anchors for m in a.members]
    return pd.DataFrame(rows, columns=head + ["group_mean", "rollout", "size", "reward", "a_d",
                                              "n_lines", "n_tokens"])


# ----------------------------------------------------------------------------- cost

_SYNTH_BUGGY = '''def running_stats(xs, k):
    """Mean and max of the last k values at every step."""
    out = []
    window = []
    for i, x in enumerate(xs):
        window.append(x)
        if len(window) > k + 1:
            window.pop(0)
        total = sum(window)
        mean = total / len(window)
        best = min(window)
        out.append((round(mean, 3), best))
    if not out:
        return None
    return out
'''
# line -> (fixes, variants): what a sampled repair may write on that line
_SYNTH_EDITS = {
    6: (("        if len(window) > k:", "        while len(window) > k:"),
        ("        if len(window) >= k + 1:", "        if len(window)>k+1:  # trim")),
    10: (("        best = max(window)", "        best = max(window)  # largest"),
         ("        best = sorted(window)[0]", "        best = min(window, default=0)")),
    13: ((), ("        return []", "        return out")),
    9: ((), ("        mean = total / max(1, len(window))",)),
}
_TOKEN = re.compile(r"\s*\S{1,4}")  # leading space + up to 4 characters: BPE-like granularity


def synthetic_group(G: int = 32, seed: int = 0) -> tuple[str, list[Rollout], list[float]]:
    """A realistic group for one task: a 15-line buggy program with two bugs and ``G``
    fenced completions that fix none, one or both (in different ways, with stray edits),
    tokenised at about 3.5 characters a token. Returns ``(buggy_code, rollouts, rewards)``,
    the reward being the fraction of the two bugs fixed."""
    rng = random.Random(seed)
    buggy = _SYNTH_BUGGY.split("\n")
    rollouts, rewards = [], []
    for g in range(G):
        lines, fixed = list(buggy), 0
        for i, (fixes, variants) in _SYNTH_EDITS.items():
            u = rng.random()
            if fixes and u < 0.5:
                lines[i], fixed = rng.choice(fixes), fixed + 1
            elif u > 0.75:
                lines[i] = rng.choice(variants)
        code = "\n".join(lines)
        completion = f"Here is the fix.\n```python\n{code}```\n"
        offsets = [m.span() for m in _TOKEN.finditer(completion)]
        rollouts.append(Rollout(
            task_id="synthetic", sample=g, prompt="", prompt_ids=[],
            completion_ids=[0] * len(offsets), logprobs=[0.0] * len(offsets),
            completion=completion, code=code, code_start=completion.index(code), offsets=offsets,
            finished=True))
        rewards.append(fixed / 2)
    return _SYNTH_BUGGY, rollouts, rewards


def time_anchor_build(G: int = 32, repeats: int = 5, seed: int = 0, **opts) -> float:
    """Median wall seconds of :func:`task_anchors` over ``repeats`` synthetic groups
    (:func:`synthetic_group`) of ``G`` rollouts (seeds ``seed``, ``seed + 1``, ...), the memos of
    :mod:`labkit.credit.diffs` cleared before every build (``opts``: :class:`AnchorConfig`
    fields). The syntax trees that ``normalise_code`` memoises in :mod:`labkit.env.feedback`
    stay warm, as in the trainer, whose feedback step has parsed the same programs."""
    times = []
    for rep in range(repeats):
        buggy, rollouts, rewards = synthetic_group(G, seed + rep)
        clear_caches()
        t0 = time.perf_counter()
        task_anchors(rollouts, rewards, buggy, **opts)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
