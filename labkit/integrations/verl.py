"""labkit's tasks, sandbox rewards and DiDPO credit for verl (0.9).

Three parts, each in the format verl expects:

* :func:`task_rows` / :func:`write_parquet`: verl's RL dataset (``RLHFDataset``): one row per
  task with ``data_source``, ``prompt`` (chat messages holding labkit's prompt), ``ability``,
  ``reward_model`` (``{"style": "rule", "ground_truth": task_id}``) and ``extra_info``
  (``task_id``, ``index`` and ``task``, the JSON of ``RepairTask.to_dict()`` that the reward
  rebuilds the task from).
* :func:`compute_score` (verl's custom reward function: ``custom_reward_function.path`` =
  this file, ``name=compute_score``) and :func:`compute_score_batch` (the signature of verl's
  ``batch`` reward manager, which hands over the whole batch so the sandbox runs it in one
  pool call): sandbox execution against the hidden tests under a feedback regime, the
  reshaping recipe's reward as ``score`` and every component beside it (verl logs them).
  ``reward_kwargs`` choose the regime and recipe by name: ``feedback=binary``,
  ``recipe=reshaped_grpo``.
* :func:`compute_advantage`: a drop-in for ``verl.trainer.ppo.ray_trainer.compute_advantage``
  that adds the estimator ``labkit_didpo`` (``A_E + lambda A_D`` over diff anchors, the same
  function labkit's own trainer runs) and hands every other estimator to verl's own function
  unchanged. Why a drop-in and not a registered estimator: verl 0.9 calls a registered
  estimator with ``token_level_rewards``, ``response_mask``, ``index`` (the ``uid``) and
  ``config`` only, while DiDPO needs the responses and the buggy code (docs/scale_out.md
  weighs the alternatives). A trainer's advantage step (``_compute_advantage`` of verl's v1
  trainer) calls this function with the batch that holds ``responses`` and ``extra_info``.

verl is an optional dependency (``make verl-extra`` installs it beside the virtualenv, see
docs/scale_out.md); nothing else in labkit imports this module.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from labkit.env.records import RepairTask
from labkit.integrations.credit import didpo_credit
from labkit.integrations.scoring import SandboxScorer
from labkit.policy.prompts import plain_prompt

try:
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer as _verl_ray_trainer
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("labkit.integrations.verl needs verl 0.9: `make verl-extra` installs it "
                      "(without its dependencies, keeping the CPU torch) into .venv/verl; put "
                      "that folder on PYTHONPATH (docs/scale_out.md)") from e

DIDPO = "labkit_didpo"
DATA_SOURCE = "labkit"


def task_rows(tasks: Sequence[RepairTask], prompt_fn=plain_prompt, data_source: str = DATA_SOURCE,
              split: str = "train") -> list[dict]:
    """verl dataset rows for ``tasks``: the prompt as one user message (verl applies the
    model's chat template), the task id as ``ground_truth``, the whole task in ``extra_info``."""
    return [{"data_source": data_source,
             "prompt": [{"role": "user", "content": prompt_fn(t)}],
             "ability": "code_repair",
             "reward_model": {"style": "rule", "ground_truth": t.task_id},
             "extra_info": {"split": split, "index": i, "task_id": t.task_id,
                            "task": json.dumps(t.to_dict())}}
            for i, t in enumerate(tasks)]


def write_parquet(tasks: Sequence[RepairTask], path: str | Path, **kwargs) -> Path:
    """Write :func:`task_rows` to ``path`` (verl's ``data.train_files`` / ``val_files``)."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(task_rows(tasks, **kwargs)).to_parquet(path, index=False)
    return path


@functools.lru_cache(maxsize=None)
def _reward(feedback: str, recipe: str) -> SandboxScorer:
    """One :class:`~labkit.integrations.scoring.SandboxScorer` per (regime, recipe) and
    process (verl's reward workers are separate processes; each keeps its own sandbox)."""
    return SandboxScorer(feedback=feedback, recipe_name=recipe)


def _task(extra_info: dict | None, ground_truth: str) -> dict:
    if not extra_info or "task" not in extra_info:
        raise ValueError(f"task {ground_truth!r}: the row has no extra_info['task']; build the "
                         "dataset with labkit.integrations.verl.write_parquet")
    return extra_info["task"]


def compute_score_batch(data_sources: Sequence[str], solution_strs: Sequence[str],
                        ground_truths: Sequence[str], extra_infos: Sequence[dict],
                        feedback: str = "dense", recipe: str = "raw", **kwargs) -> list[dict]:
    """verl's batch reward signature: one dict per response, ``score`` (the recipe's reward)
    and the feedback components (``r_test``, ``r_pass``, ...)."""
    scorer = _reward(feedback, recipe)
    tasks = [scorer.task(_task(e, g)) for e, g in zip(extra_infos, ground_truths)]
    rewards, comps = scorer.score(tasks, list(solution_strs))
    return [{"score": r, **{k: float(v) for k, v in c.items()}} for r, c in zip(rewards, comps)]


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None, feedback: str = "dense", recipe: str = "raw",
                  **kwargs) -> dict:
    """verl's custom reward function (one response): see :func:`compute_score_batch`."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info],
                               feedback=feedback, recipe=recipe)[0]


def didpo_advantage(data: DataProto, tokenizer, **options) -> DataProto:
    """Fill ``advantages`` and ``returns`` of a verl batch with labkit's ``didpo`` credit.

    Reads ``responses`` and ``response_mask`` (right-padded ``[B, T]``),
    ``token_level_rewards`` (its row sum is the sequence reward), ``uid`` (the group) and
    ``extra_info['task']`` (each row's task). ``options`` go to the estimator."""
    batch, extra = data.batch, data.non_tensor_batch
    missing = [k for k in ("responses", "response_mask", "token_level_rewards") if k not in batch]
    missing += [k for k in ("uid", "extra_info") if k not in extra]
    if missing:
        raise ValueError(f"{DIDPO}: the batch lacks {missing}; DiDPO needs the responses, their "
                         "mask and rewards, the uid of each group and the task in extra_info")
    tasks = [RepairTask.from_dict(json.loads(_task(e, str(u))))
             for e, u in zip(extra["extra_info"], extra["uid"])]
    mask = batch["response_mask"]
    rewards = batch["token_level_rewards"].sum(-1)
    out, _ = didpo_credit(tokenizer, batch["responses"], mask, rewards, list(extra["uid"]), tasks,
                          **options)
    adv = out.advantages.to(mask.device, dtype=torch.float32) * mask
    batch["advantages"] = adv
    batch["returns"] = adv.clone()
    data.meta_info.setdefault("labkit_metrics", {}).update(out.metrics)
    return data


def compute_advantage(data: DataProto, adv_estimator, *args, tokenizer=None,
                      didpo_options: dict | None = None, **kwargs) -> DataProto:
    """verl's ``compute_advantage`` with one more estimator, ``labkit_didpo`` (needs
    ``tokenizer``); any other name goes to verl's own function with the same arguments."""
    if str(getattr(adv_estimator, "value", adv_estimator)) != DIDPO:
        return _verl_ray_trainer.compute_advantage(data, adv_estimator, *args, **kwargs)
    if tokenizer is None:
        raise ValueError(f"{DIDPO} decodes the responses: pass tokenizer=")
    return didpo_advantage(data, tokenizer, **(didpo_options or {}))
