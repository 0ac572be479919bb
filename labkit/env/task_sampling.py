"""Task sampling: the tasks a training run holds, and which of them each step takes.

:class:`TaskConfig` (a training config's ``tasks`` section) says where a run's tasks come from;
:func:`run_tasks` loads its training or held-out list and :func:`check_train_tasks` refuses a
list a batch cannot be drawn from. Each step takes ``n`` distinct tasks (:func:`pick_tasks`):
uniformly, or by the learnability :class:`CurriculumSampler` that buckets tasks by bug kind
(:func:`bucket`) and follows each bucket's success.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from labkit.env.records import RepairTask
from labkit.env.tasks import load_tasks

TASK_SOURCES = ("synthetic", "humaneval", "humanevalpack", "records")
"""What ``TaskConfig.source`` may name."""


@dataclass
class TaskConfig:
    """Which tasks to train and evaluate on."""

    source: str = "synthetic"
    """``synthetic``, ``humaneval``, ``humanevalpack`` (needs ``path``) or ``records``: a
    JSONL of ``RepairTask.to_dict()`` records at ``path`` (their ``split`` field is used)."""
    train_problems: int = 2000
    """Problems generated for the train split (synthetic) / cap for other sources (0 = all)."""
    bugs_per_problem: int = 1
    """Buggy variants per training problem."""
    n_bugs: int = 1
    """Bugs planted in each task (train and eval)."""
    multi_hunk: bool = False
    """With ``n_bugs >= 2``: only tasks whose bugs are separate, separately tested hunks
    (``labkit.env.tasks.multi_hunk_catches``), the setting diff-level credit is made for."""
    templates: tuple[str, ...] = ()
    """Train only on tasks of these synthetic templates (``task.meta["template"]``, e.g.
    ``digits/e354b12609``); empty: every template of ``train_split``. A training mix of the
    templates the starting policy rarely solves makes a sparse-reward testbed."""
    train_split: str = "train"
    """Split the policy is trained on: ``train`` (the templates the shipped tiny model's SFT
    data came from) or ``val`` (templates neither its SFT data nor ``test`` holds: RL on new
    templates, where the tiny model has room to learn; docs/tasks.md)."""
    eval_split: str = "val"
    """Held-out split: ``val`` or ``test`` (templates training never sees) or ``in_template``;
    never the split trained on."""
    eval_tasks: int = 64
    """Held-out tasks evaluated every ``eval_every`` steps (0 = none)."""
    seed: int | None = None
    """Seed of the task generator and bug injection; ``None``: the run's seed. Fix it to
    compare runs of several training seeds on the same tasks (paired)."""
    path: str | None = None
    """HumanEvalPack-format JSONL for source ``humanevalpack``."""

    def validate(self) -> None:
        if self.source not in TASK_SOURCES:
            raise ValueError(f"tasks.source must be one of {', '.join(TASK_SOURCES)}, got "
                             f"{self.source!r}")
        if self.train_problems < 0 or self.eval_tasks < 0:
            raise ValueError(f"tasks.train_problems and tasks.eval_tasks must be >= 0 (0: all, "
                             f"none), got {self.train_problems} and {self.eval_tasks}")
        if self.bugs_per_problem < 1 or self.n_bugs < 1:
            raise ValueError(f"tasks.bugs_per_problem and tasks.n_bugs must be >= 1, got "
                             f"{self.bugs_per_problem} and {self.n_bugs}")



def run_tasks(t: TaskConfig, run_seed: int, which: str) -> list[RepairTask]:
    """A run's training tasks (``which="train"``) or held-out tasks (``"eval"``), as its
    ``tasks`` section ``t`` describes them (``t.seed``, else the run's seed ``run_seed``)."""
    if t.source == "records":
        return records_tasks(t.path, t.train_split if which == "train" else t.eval_split,
                              t.eval_tasks if which != "train" else 0)
    seed = run_seed if t.seed is None else t.seed
    kinds = {"n_bugs": t.n_bugs, "multi_hunk": t.multi_hunk}
    if which == "train":
        n = t.train_problems or None
        tasks = load_tasks(t.source, split=t.train_split, n=n, seed=seed, path=t.path,
                           bugs_per_problem=t.bugs_per_problem, **kinds)
        if t.templates:
            tasks = [x for x in tasks if x.meta.get("template") in set(t.templates)]
        return tasks
    if not t.eval_tasks:
        return []
    # multi-hunk problems yield a task less than half the time: ask for enough problems
    n = t.eval_tasks * (4 if t.multi_hunk else 1)
    tasks = load_tasks(t.source, split=t.eval_split, n=n, seed=seed, path=t.path,
                       bugs_per_problem=1, **kinds)
    return tasks[: t.eval_tasks]


def check_train_tasks(tasks: Sequence[RepairTask], t: TaskConfig) -> None:
    """Raise ``ValueError`` saying what to change when the training tasks are none, or list a
    task twice (a batch must hold each task once: its samples form one group)."""
    if not tasks:
        hint = (" (multi-hunk problems yield a task less than half the time: raise "
                "tasks.train_problems)" if t.multi_hunk else "")
        hint += f" (tasks.templates {list(t.templates)} keeps none of them)" if t.templates else ""
        where = f", path={t.path!r}, train_split={t.train_split!r}" if t.path else ""
        raise ValueError(f"no training tasks from tasks.source={t.source!r}, "
                         f"train_problems={t.train_problems}{where}{hint}")
    ids = [x.task_id for x in tasks]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"training task {dup!r} is listed more than once; a batch must hold "
                         "each task once (its samples form one group): pass distinct tasks")


def records_tasks(path: str | None, split: str, limit: int) -> list[RepairTask]:
    """The task records of a JSONL file (``RepairTask.to_dict()`` per line) of ``split``, the
    first ``limit`` of them (0: all)."""
    if not path or not Path(path).is_file():
        raise ValueError(f"tasks.source 'records' needs tasks.path, a JSONL of task records; "
                         f"got {path!r}")
    tasks = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                tasks.append(RepairTask.from_dict(json.loads(line)))
            except (ValueError, KeyError) as e:
                raise ValueError(f"{path}:{i}: not a task record: {e}") from None
    tasks = [t for t in tasks if t.split == split]
    return tasks[:limit] if limit else tasks


def pick_tasks(tasks: Sequence[RepairTask], n: int, rng: random.Random,
               curriculum: CurriculumSampler | None = None) -> list[RepairTask]:
    """A step's ``min(n, len(tasks))`` distinct tasks: a uniform draw without replacement, or
    the curriculum's draw by bucket (:meth:`CurriculumSampler.sample`)."""
    if curriculum is not None:
        return curriculum.sample(tasks, bucket, n, rng)
    return rng.sample(tasks, min(n, len(tasks)))


def bucket(task: RepairTask) -> str:
    """The curriculum's bucket of a task: its bug kinds."""
    return ",".join(task.bug_kinds)



@dataclass
class CurriculumSampler:
    """Samples tasks by bucket (bug kind or difficulty), weighting buckets by how
    learnable they look now: ``w_k = eps + s_k (1 - s_k)``, ``s_k`` the EMA success rate
    of bucket k (buckets that are always or never solved give little signal to GRPO).
    ``order`` (optional) unlocks buckets easy to hard once the previous ones reach
    ``unlock_at`` success."""

    beta: float = 0.9
    eps: float = 0.05
    order: tuple[str, ...] = ()
    unlock_at: float = 0.3
    success: dict = field(default_factory=dict)

    def weights(self, buckets: Sequence[str]) -> dict[str, float]:
        open_ = set(buckets)
        if self.order:
            open_ = set()
            for b in self.order:
                open_.add(b)
                if self.success.get(b, 0.5) < self.unlock_at:
                    break
            open_ |= {b for b in buckets if b not in self.order}
        return {b: (self.eps + self.success.get(b, 0.5) * (1 - self.success.get(b, 0.5)))
                if b in open_ else 0.0 for b in buckets}

    def sample(self, tasks: Sequence, key, n: int, rng: random.Random) -> list:
        """``n`` distinct tasks, without replacement: a bucket by weight, then a uniform task
        of the bucket not drawn yet (a bucket leaves the draw once it is used up). Fewer than
        ``n`` when the open buckets hold fewer tasks. A task never appears twice in one batch:
        its group would merge with itself."""
        by: dict[str, list] = {}
        for t in tasks:
            by.setdefault(key(t), []).append(t)
        w = self.weights(sorted(by))
        left = {b: list(by[b]) for b in sorted(by) if w[b] > 0}
        out = []
        while left and len(out) < n:
            names = list(left)
            b = rng.choices(names, weights=[w[x] for x in names], k=1)[0]
            out.append(left[b].pop(rng.randrange(len(left[b]))))
            if not left[b]:
                del left[b]
        return out

    def update(self, bucket: str, success: float) -> None:
        old = self.success.get(bucket, 0.5)
        self.success[bucket] = self.beta * old + (1 - self.beta) * success

    def state_dict(self) -> dict:
        return {"success": dict(self.success)}

    def load_state_dict(self, s: Mapping) -> None:
        self.success = dict(s["success"])
