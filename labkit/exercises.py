"""The notebooks' "Try this" exercises, each with the outcome it promises and a check of it.

An :class:`Exercise` changes parameters of a notebook's parameters cell and states what the
learner will see. Its ``check`` reads the numbers the notebook records (:func:`labkit.lab.record`)
after a run with those parameters; ``not_before`` reads the numbers of a run at the default
parameters and holds when the promised outcome is *not* already there, so a passing exercise
shows a change the parameter made. The test suite runs every exercise and its baseline
headless (``tests/test_notebooks.py``), and checks that each notebook shows its exercises'
text as written here (:meth:`Exercise.markdown`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Exercise:
    notebook: str
    """The notebook's name, e.g. ``00_tour``."""
    parameters: Mapping
    """What the learner sets in the parameters cell."""
    expect: str
    """The outcome, in words, naming the recorded number that shows it."""
    check: Callable[[Mapping], bool]
    """Holds on the numbers recorded by a run with ``parameters``."""
    not_before: Callable[[Mapping], bool]
    """Holds on the numbers recorded at the default parameters: the outcome is a change."""
    budget: Mapping = field(default_factory=dict)
    """Parameters the test adds to keep the run short (the outcome does not depend on them)."""

    def markdown(self) -> str:
        sets = ", ".join(f"`{k} = {v!r}`" for k, v in self.parameters.items())
        return f"**Try this.** Set {sets} in the parameters cell and run all. Expected: {self.expect}"


EXERCISES: tuple[Exercise, ...] = (
    Exercise(
        "00_tour", {"max_new_tokens": 4},
        "no fix fits in four tokens, so every rollout fails alike: every group ties "
        "(`nonzero_std_groups` is 0), every advantage is 0 and the GRPO step leaves the "
        "parameters where they were (`param_delta` is 0).",
        check=lambda n: n["nonzero_std_groups"] == 0 and n["param_delta"] == 0.0,
        not_before=lambda n: n["nonzero_std_groups"] > 0 and n["param_delta"] > 0.0),
    Exercise(
        "03_counterfactual_forking", {"budget": 1},
        "each rollout is forked at one position at most (`positions_per_rollout_max` is 1), so "
        "there are no more forks than rollouts and far fewer positions with a measured dR.",
        check=lambda n: n["positions_per_rollout_max"] == 1 and n["forks"] <= n["rollouts"],
        not_before=lambda n: n["positions_per_rollout_max"] > 1,
        budget={"n_tasks": 2, "group_size": 2, "max_new_tokens": 160}),
)
"""Every notebook exercise (a notebook may have several)."""


def of(notebook: str) -> list[Exercise]:
    """The exercises of one notebook."""
    return [e for e in EXERCISES if e.notebook == notebook]
