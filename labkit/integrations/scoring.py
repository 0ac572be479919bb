"""labkit's sandboxed reward for completions another trainer generated (TRL, verl).

:class:`SandboxScorer` is the one place both adapters score with: extract the program from a
completion, run it in labkit's sandbox against the task's hidden tests under a feedback
regime (:func:`labkit.env.feedback.evaluate_many`), and turn the components into the
reshaping recipe's reward (stage 1 of :class:`labkit.credit.pipeline.Credit`, its precision
gate against the buggy code's own signal, :class:`labkit.env.feedback.BuggyBaselines`): the
functions labkit's own trainer calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from labkit.credit.pipeline import Credit
from labkit.credit.reshaping import ReshapeConfig, check_regime, recipe
from labkit.env.feedback import BuggyBaselines, FeedbackConfig, evaluate_many
from labkit.env.records import Components, RepairTask
from labkit.sandbox.pool import default_sandbox
from labkit.policy.prompts import extract_code


class SandboxScorer:
    """Rewards of completions for repair tasks under a regime (``dense``, ``binary``,
    ``public``, ``noisy``, ``coarse``) and a recipe (``raw``, ``reshaped_grpo``, ...), each
    chosen by name or given as its config."""

    def __init__(self, feedback: str | FeedbackConfig = "dense", recipe_name: str | ReshapeConfig = "raw",
                 sandbox=None):
        self.feedback = feedback if isinstance(feedback, FeedbackConfig) else FeedbackConfig(mode=feedback)
        self.feedback.validate()
        self.reshape = recipe_name if isinstance(recipe_name, ReshapeConfig) else recipe(recipe_name)
        self.reshape.validate()
        check_regime(self.reshape, self.feedback.mode)
        self.sandbox = sandbox if sandbox is not None else default_sandbox()
        self._tasks: dict[str, RepairTask] = {}
        self.baselines = BuggyBaselines(self.feedback, self.sandbox)

    def task(self, record: str | dict) -> RepairTask:
        """The task of one dataset row (the JSON of ``RepairTask.to_dict()``), rebuilt once
        and cached."""
        data = json.loads(record) if isinstance(record, str) else record
        if data["task_id"] not in self._tasks:
            self._tasks[data["task_id"]] = RepairTask.from_dict(data)
        return self._tasks[data["task_id"]]

    def rewards(self, tasks: Sequence[RepairTask], codes: Sequence[str], step: int = 0,
                seed: int = 0) -> tuple[list[float], list[Components]]:
        """The recipe's rewards of programs ``codes`` for ``tasks`` and their components."""
        baselines = self.baselines.of(tasks)  # the precision gate's, once per task
        fb = evaluate_many(tasks, codes, config=self.feedback, sandbox=self.sandbox, seed=seed)
        credit = Credit(self.reshape)
        credit.step = step
        comps = [f.components for f in fb]
        rewards, _ = credit.rewards(comps, baselines)
        return rewards.tolist(), comps

    def score(self, tasks: Sequence[RepairTask], completions: Sequence[str], step: int = 0,
              seed: int = 0) -> tuple[list[float], list[Components]]:
        """:meth:`rewards` of the programs extracted from decoded ``completions``."""
        return self.rewards(tasks, [extract_code(c) for c in completions], step=step, seed=seed)
