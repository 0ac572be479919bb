"""The notebooks' "Try this" exercises, each with the outcome it promises and a check of it.

An :class:`Exercise` changes parameters of a notebook's parameters cell and states what the
learner will see. Its ``check`` reads the numbers the notebook records (:func:`labkit.lab.record`)
after a run with those parameters, beside those of a run at the default parameters;
``not_before`` reads the default run's numbers and holds when the promised outcome is *not*
already there, so a passing exercise shows a change the parameter made. The test suite runs
every exercise headless (``tests/test_notebooks.py``): a ``smoke`` exercise at the smoke
budget, its baseline being the smoke run the suite makes anyway; the others at the default
budget (plus ``budget``) beside a baseline run of their own. It also checks that each
notebook shows its exercises' text as written here (:meth:`Exercise.markdown`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Exercise:
    notebook: str
    """The notebook's name, e.g. ``00_tour``."""
    parameters: Mapping
    """What the learner sets in the parameters cell."""
    expect: str
    """The outcome, in words, naming the recorded number that shows it."""
    check: Callable[[Mapping, Mapping], bool]
    """``check(tried, base)`` holds on the numbers recorded by a run with ``parameters``
    (``tried``), given those of the run at the default parameters (``base``)."""
    not_before: Callable[[Mapping], bool]
    """Holds on the numbers recorded at the default parameters: the outcome is a change."""
    budget: Mapping = field(default_factory=dict)
    """Parameters the test adds to keep the run short (the outcome does not depend on them)."""
    smoke: bool = False
    """The outcome shows at the smoke budget (``smoke = True``), which leaves ``parameters``
    as set: the test runs the exercise there, against the suite's smoke run."""

    def __post_init__(self) -> None:
        if self.smoke and self.budget:
            raise ValueError(f"{self.notebook}: a smoke exercise runs at the smoke budget; "
                             f"drop budget={dict(self.budget)} or smoke=True")

    def markdown(self) -> str:
        sets = ", ".join(f"`{k} = {v!r}`" for k, v in self.parameters.items())
        return f"**Try this.** Set {sets} in the parameters cell and run all. Expected: {self.expect}"

    def reads(self) -> list[str]:
        """The recorded numbers the outcome names (the backquoted names of ``expect``)."""
        return list(dict.fromkeys(re.findall(r"`([a-z_][a-z0-9_]*)`", self.expect)))

    def readout(self, numbers: Mapping, namespace: Mapping) -> str:
        """One line for under the exercise: the parameters it sets as this run had them, and
        the numbers its outcome names as this run recorded them."""
        now = [f"{k} = {namespace.get(k)!r}" for k in self.parameters]
        tried = all(namespace.get(k) == v for k, v in self.parameters.items())
        said = "as the exercise sets" if tried else "the exercise sets " + ", ".join(
            f"{k} = {v!r}" for k, v in self.parameters.items())
        got = [f"{k} = {_brief(numbers[k])}" for k in self.reads() if k in numbers]
        return f"This run: {', '.join(now)} ({said}); " + (", ".join(got) or "no number recorded") + "."


EXERCISES: tuple[Exercise, ...] = (
    Exercise(
        "00_tour", {"max_new_tokens": 4},
        "no fix fits in four tokens, so every rollout fails alike: every group ties "
        "(`nonzero_std_groups` is 0), every advantage is 0 and the GRPO step leaves the "
        "parameters where they were (`param_delta` is 0).",
        check=lambda n, _: n["nonzero_std_groups"] == 0 and n["param_delta"] == 0.0,
        not_before=lambda n: n["nonzero_std_groups"] > 0 and n["param_delta"] > 0.0),
    Exercise(
        "03_counterfactual_forking", {"budget": 1},
        "each rollout is forked at one position at most (`positions_per_rollout_max` is 1), so "
        "there are no more forks than rollouts and far fewer positions with a measured dR.",
        check=lambda n, _: n["positions_per_rollout_max"] == 1 and n["forks"] <= n["rollouts"],
        not_before=lambda n: n["positions_per_rollout_max"] > 1, smoke=True),
    Exercise(
        "01_tasks_and_sandbox", {"reference_id": "HumanEval/23"},
        "`strlen` is one line, `return len(string)`: fewer than half the bug operators find a "
        "site in it (`operators_with_site`), so a short function yields few distinct bugs.",
        check=lambda n, b: 2 * n["operators_with_site"] < b["operators_with_site"]
        and n["operators"] == b["operators"],
        not_before=lambda b: 2 * b["operators_with_site"] >= b["operators"], smoke=True),
    Exercise(
        "02_reward_reshaping", {"warmup_steps": 0},
        "with no warm-up every step of section 2 divides by the batch's own statistics "
        "(`norm_used` reads `batch` eight times), and the output's std is 1 from the first step.",
        check=lambda n, _: set(n["norm_used"]) == {"batch"} and abs(n["norm_batch_out_std"] - 1) < 1e-3,
        not_before=lambda b: "running" in b["norm_used"], smoke=True),
    Exercise(
        "04_anchor_grouping", {"G": 4},
        "four rollouts share fewer edits than eight: fewer anchors form (`anchors`), and the "
        "share of tokens that get anchor credit (`didpo_token_coverage`) falls.",
        check=lambda n, b: n["anchors"] < b["anchors"]
        and n["didpo_token_coverage"] < b["didpo_token_coverage"],
        not_before=lambda b: b["anchors"] > 1, smoke=True),
    Exercise(
        "05_training", {"lr": 0.01},
        "one step at a hundred times the default learning rate wrecks the tiny model: every "
        "method's held-out pass@1 after training (the last of `eval_pass_at_1`) falls to 0.",
        check=lambda n, _: all(v[0] > 0 and v[-1] == 0 for v in n["eval_pass_at_1"].values()),
        not_before=lambda b: all(v[-1] > 0 for v in b["eval_pass_at_1"].values()), smoke=True),
    Exercise(
        "06_mucode", {"iterations": 2},
        "two rounds of collect, train the verifier, relabel and fine-tune: `sft_steps` and "
        "`expert_pass_frac` each get a second entry, the second round collecting with the "
        "first round's fine-tuned model.",
        check=lambda n, _: len(n["sft_steps"]) == 2 and len(n["expert_pass_frac"]) == 2,
        not_before=lambda b: len(b["sft_steps"]) == 1, smoke=True),
    Exercise(
        "07_bring_your_own_model", {"lora_r": 2},
        "a rank-2 adapter has exactly a quarter of rank 8's trainable parameters "
        "(`trainable`), and the base weights still do not move (`base_weight_max_change` is 0).",
        check=lambda n, b: 4 * n["trainable"] == b["trainable"] and n["base_weight_max_change"] == 0,
        not_before=lambda b: b["trainable"] > 0, smoke=True),
    Exercise(
        "08_scale_out", {"group_size": 2},
        "TRL samples two completions per prompt: DiDPO's advantages have two rows per task "
        "(`didpo_advantages_shape`), and labkit's rewards and credit still equal TRL's "
        "(`rewards_equal`, `credit_equal`).",
        check=lambda n, _: n["didpo_advantages_shape"][0] == 2 * n["tasks"]
        and n["rewards_equal"] and n["credit_equal"],
        not_before=lambda b: b["didpo_advantages_shape"][0] != 2 * b["tasks"], smoke=True),
)
"""Every notebook exercise (a notebook may have several)."""


def of(notebook: str) -> list[Exercise]:
    """The exercises of one notebook."""
    return [e for e in EXERCISES if e.notebook == notebook]


def _brief(value: Any) -> str:
    """A recorded number for reading: floats to 4 significant digits, inside lists and dicts too."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_brief(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_brief(v) for v in value) + "]"
    return str(value)


def readout(notebook: str, numbers: Mapping, namespace: Mapping) -> str:
    """The readout under a notebook's exercises (:meth:`Exercise.readout`, one line each), so
    their outcomes can be read in the notebook and not only in its JSON. ``numbers``: what the
    notebook recorded; ``namespace``: its globals (the parameters it ran with)."""
    return "\n".join(e.readout(numbers, namespace) for e in of(notebook))
