"""Held-out task lists where no template outweighs the others.

A template split (:func:`labkit.env.tasks.template_split`) holds out whole templates, but the
synthetic stream draws templates at very different rates: of the first 200 ``test`` tasks
(task seed 0), 56 are one template (``side_of``), the next largest 12. A pass@1 over that
list is then 28% one template's answer. :func:`balanced_tasks` keeps the first ``cap``
tasks of each template, in the stream's order, and draws further into the stream until it
has ``n`` of them:

    keep task i  iff  #{j < i : template_j = template_i, j kept} < cap,   then the first n kept

so the list is still the template split's own tasks (same problems, bugs and tests as
:func:`~labkit.env.tasks.load_tasks` builds), only reweighted towards templates the stream
draws rarely. The experiments pair on such a list (``ExperimentConfig.paired_per_template``,
12); ``load_tasks`` and ``eval`` give the list as drawn unless asked (``--per-template``), and
a result says which one it used.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from labkit.env.records import RepairTask
from labkit.env.tasks import load_tasks

MAX_GROWTH = 16
""":func:`balanced_tasks` draws at most this many times ``n`` problems before it gives up."""


def template_of_task(task: RepairTask) -> str:
    """The synthetic template a task was drawn from (``meta["template"]``)."""
    template = task.meta.get("template")
    if not template:
        raise ValueError(f"task {task.task_id!r} records no template (meta['template']); "
                         "a per-template cap needs synthetic tasks")
    return template


def cap_per_template(tasks: Sequence[RepairTask], cap: int) -> list[RepairTask]:
    """``tasks`` in order, keeping at most ``cap`` of each template (the first ones)."""
    if cap < 1:
        raise ValueError(f"per-template cap must be >= 1, got {cap}")
    seen: Counter[str] = Counter()
    kept = []
    for task in tasks:
        template = template_of_task(task)
        if seen[template] < cap:
            seen[template] += 1
            kept.append(task)
    return kept


def balanced_tasks(n: int, cap: int, load: Callable[[int], Sequence[RepairTask]],
                   problems: int | None = None) -> list[RepairTask]:
    """The first ``n`` tasks of ``load(m)`` after :func:`cap_per_template`, growing ``m``
    (problems drawn; default ``2 n``) by doubling until ``n`` are kept.

    ``load(m)`` must return the first ``m`` problems' tasks of one stream, so that a longer
    draw extends a shorter one (as :func:`~labkit.env.tasks.load_tasks` does for a fixed
    seed): the list then does not depend on how far it had to draw. Raises ``ValueError``
    when ``MAX_GROWTH x n`` problems cannot fill it (too few templates for the cap)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    m = problems or 2 * n
    while True:
        kept = cap_per_template(load(m), cap)
        if len(kept) >= n:
            return kept[:n]
        if m >= MAX_GROWTH * n:
            templates = len({template_of_task(t) for t in kept})
            raise ValueError(f"only {len(kept)} tasks with at most {cap} per template from {m} "
                             f"problems ({templates} templates); ask for fewer tasks or a "
                             f"larger per-template cap")
        m *= 2


def balanced_synthetic(split: str | None, n: int, cap: int, *, seed: int = 0,
                       problems: int | None = None, **spec) -> list[RepairTask]:
    """:func:`balanced_tasks` over ``load_tasks("synthetic", split, n=m, seed=seed, **spec)``:
    ``n`` synthetic tasks of ``split``, at most ``cap`` of any one template."""
    return balanced_tasks(n, cap, lambda m: load_tasks("synthetic", split=split, n=m, seed=seed,
                                                        **spec), problems)
