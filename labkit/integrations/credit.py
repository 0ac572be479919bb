"""DiDPO credit for completions that another trainer generated (shared by the TRL and verl
adapters).

Another trainer hands over token ids; labkit's ``didpo`` estimator needs
:class:`~labkit.env.records.Rollout` records (the decoded text, exact per-token character
offsets, the extracted program) and each row's task. :func:`didpo_credit` builds them and
returns ``A(i, t) = A_E(i) + lambda A_D(i, a*(t))`` (``labkit.credit.anchors``) as a
``[B, T]`` tensor aligned with the ids.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from labkit.credit.advantages import AdvantageInput, AdvantageOutput, compute_advantages
from labkit.env.records import RepairTask
from labkit.policy.prompts import extract_code
from labkit.policy.rollout import Rollout, token_offsets


def rollout_from_ids(tokenizer, ids: Sequence[int], task_id: str, sample: int,
                     prompt_ids: Sequence[int] = (), temperature: float = 1.0) -> Rollout:
    """One completion's :class:`Rollout` from its token ids (special tokens dropped from the
    text, offsets exact: ``"".join(text[a:b] for a, b in offsets) == text``); ``prompt_ids``
    (unpadded) and the sampling ``temperature`` where forks continue it."""
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    code = extract_code(text)
    return Rollout(task_id=task_id, sample=sample, prompt="", prompt_ids=[int(i) for i in prompt_ids],
                   completion_ids=ids, logprobs=[0.0] * len(ids), completion=text, code=code,
                   code_start=text.find(code.rstrip("\n")) if code else -1,
                   offsets=token_offsets(tokenizer, ids) if ids else [], finished=True,
                   temperature=temperature)


def didpo_credit(tokenizer, ids: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor,
                 groups: Sequence[Hashable], tasks: Sequence[RepairTask], first_group: int = 0,
                 **options) -> tuple[AdvantageOutput, list[Rollout]]:
    """labkit's ``didpo`` advantages for right-padded completions.

    ``ids``/``mask`` are ``[B, T]`` (row b's completion is ``ids[b, :mask[b].sum()]``),
    ``rewards`` ``[B]`` scalar scores, ``groups[b]`` the id shared by one prompt's samples
    (any hashable, in any row order), ``tasks[b]`` row b's task. The groups are numbered
    ``first_group, first_group + 1, ...`` in order of first appearance; the estimator seeds
    group k's pair draws with its number, so rows that are a slice of a larger batch (one
    process's share) pass the number of their first group there and get the whole batch's
    draws. ``options`` go to the estimator (``lam``, ``eta``, ...). Returns the estimator's
    output (``advantages [B, T]``, 0 at padding; ``artifacts["anchors"]`` keyed by group
    number) and the rollouts it was computed from."""
    if not (len(ids) == len(mask) == len(rewards) == len(groups) == len(tasks)):
        raise ValueError(f"didpo_credit: {len(ids)} id rows, {len(mask)} mask rows, "
                         f"{len(rewards)} rewards, {len(groups)} group ids and {len(tasks)} tasks; "
                         "give one of each per completion")
    mask = mask.detach().cpu().double()
    ids = ids.detach().cpu()
    seen: dict[Hashable, int] = {}
    rollouts = []
    for b, (task, group) in enumerate(zip(tasks, groups)):
        sample = seen.get(group, 0)
        seen[group] = sample + 1
        n = int(mask[b].sum())
        rollouts.append(rollout_from_ids(tokenizer, ids[b, :n].tolist(), task.task_id, sample))
    index = {g: first_group + k for k, g in enumerate(dict.fromkeys(groups))}
    out = compute_advantages("didpo", AdvantageInput(
        rewards.detach().cpu().double(), [index[g] for g in groups], mask,
        rollouts=rollouts, tasks=list(tasks)), **options)
    return out, rollouts
