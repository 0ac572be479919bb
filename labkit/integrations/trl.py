"""labkit's tasks, sandbox rewards and DiDPO credit inside TRL's ``GRPOTrainer``.

Leaving the lab for a bigger model is a config change: the same repair tasks, the same
sandboxed reward (a feedback regime and a reshaping recipe chosen by name) and the same
DiDPO credit, with TRL doing generation (vLLM on a GPU) and the sharded training::

    from trl import GRPOConfig
    from labkit.integrations.trl import DiDPOTrainer, SandboxReward, task_dataset

    tasks = load_tasks("synthetic", "train", n=2000)
    reward = SandboxReward(feedback="binary", recipe="reshaped_grpo")
    trainer = DiDPOTrainer(model=..., args=GRPOConfig(...), train_dataset=task_dataset(tasks),
                           reward_funcs=[reward], processing_class=tokenizer)

* :func:`task_dataset`: a ``datasets.Dataset`` with labkit's prompt (``prompt``), the task id
  and the whole task record (``task``, JSON) a reward needs.
* :class:`SandboxReward`: a TRL reward function; runs every completion's extracted program
  in labkit's sandbox against the hidden tests, turns the result into the regime's signal and
  the recipe's reward, and logs every component through TRL (``log_metric``).
* :class:`CurriculumGRPOTrainer`: ``GRPOTrainer`` that draws each generation batch's prompts
  with labkit's learnability curriculum (:class:`~labkit.env.task_sampling.CurriculumSampler`,
  the sampler labkit's trainer uses) instead of a uniform permutation, steered by what the
  feedback regime told (:class:`CurriculumRepeatSampler`).
* :class:`ForkCreditTrainer`: ``GRPOTrainer`` (the curriculum one) whose advantages are
  labkit's counterfactual-fork credit ``A_E + lambda A_fork`` (``labkit.credit.fork_credit``):
  each process forks its rows with labkit's forking (an EMA baseline proposes, the policy
  continues), the sandbox reward scores the forks, the deltas are normalised over the batch.
* :class:`DiDPOTrainer`: ``GRPOTrainer`` (the curriculum one) whose sequence advantages are replaced by labkit's
  per-token ``A_E + lambda A_D`` over diff anchors (``labkit.credit.anchors.didpo``), with
  exact token offsets from the tokenizer, on any number of processes (each builds the anchors
  of the groups its rows belong to; docs/scale_out.md). TRL's loss accepts ``(B, T)``
  advantages from a subclass (``_compute_loss`` unsqueezes only 1-D ones).

TRL is an optional dependency (``pip install 'labkit[trl]'``); nothing else in labkit imports
this module.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler

from labkit.credit.advantages import AdvantageInput, compute_advantages
from labkit.credit.fork_credit import delta_moments, fork_sites
from labkit.credit.reshaping import ReshapeConfig
from labkit.env.feedback import FeedbackConfig, told_pass
from labkit.env.records import RepairTask
from labkit.env.task_sampling import CurriculumSampler, bucket
from labkit.integrations.credit import didpo_credit, rollout_from_ids
from labkit.integrations.scoring import SandboxScorer
from labkit.policy.forking import ForkConfig, ForkCreditConfig, PositionConfig, fork_and_score
from labkit.policy.loading import Policy, PolicyConfig
from labkit.policy.prompts import extract_code, plain_prompt
from labkit.seeding import derive_seed

try:
    from accelerate.utils import gather_object
    from transformers import TrainerCallback
    from trl import GRPOTrainer
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("labkit.integrations.trl needs TRL: pip install 'labkit[trl]' "
                      "(trl, datasets)") from e


def task_dataset(tasks: Sequence[RepairTask], prompt_fn=plain_prompt):
    """A TRL-ready dataset: ``prompt`` (labkit's plain prompt of each task), ``task_id`` and
    ``task`` (the JSON of ``RepairTask.to_dict()``, what :class:`SandboxReward` rebuilds the
    task from)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [prompt_fn(t) for t in tasks],
                              "task_id": [t.task_id for t in tasks],
                              "task": [json.dumps(t.to_dict()) for t in tasks]})


def _completion_text(completion: Any) -> str:
    """A TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


class SandboxReward(SandboxScorer):
    """labkit's feedback as a TRL reward function (``GRPOTrainer(reward_funcs=[...])``).

    For every completion: extract the program (``labkit.policy.prompts.extract_code``), run it
    in the sandbox against the task's hidden tests (:func:`labkit.env.feedback.evaluate_many`
    under the ``feedback`` regime), and return the recipe's reward
    (:class:`~labkit.integrations.scoring.SandboxScorer`). Every component's batch mean goes to
    TRL's logs as ``labkit/<component>``. ``history`` keeps the last ``keep`` calls (tasks,
    codes, rewards, components) for inspection and tests.

    On several processes TRL calls the reward on each with that process's rows only, so every
    completion runs in one sandbox once; TRL averages the logged means over processes, which
    is the mean over all rows since every process holds the same number of rows."""

    def __init__(self, feedback: str | FeedbackConfig = "dense", recipe_name: str | ReshapeConfig = "raw",
                 sandbox=None, keep: int = 8):
        super().__init__(feedback=feedback, recipe_name=recipe_name, sandbox=sandbox)
        self.__name__ = "labkit_sandbox"  # TRL names a reward function by its __name__
        self.history: list[dict] = []
        self.keep = keep
        self._calls = 0

    def __call__(self, prompts, completions, task, log_metric=None, trainer_state=None,
                 **kwargs) -> list[float]:
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        tasks = [self.task(t) for t in task]
        codes = [extract_code(_completion_text(c)) for c in completions]
        rewards, comps = self.rewards(tasks, codes, step=step, seed=self._calls)
        self._calls += 1
        if log_metric is not None:
            for key in comps[0]:
                log_metric(f"labkit/{key}", sum(c[key] for c in comps) / len(comps))
        self.history = (self.history + [{"tasks": tasks, "codes": codes, "rewards": rewards,
                                         "components": comps,
                                         "completions": [_completion_text(c) for c in completions],
                                         "step": step}])[-self.keep:]
        return rewards


def group_rows(process: int, rows: int, group_size: int) -> tuple[int, int]:
    """The batch rows ``[lo, hi)`` of the groups that one process's rows belong to.

    TRL orders the batch by process: process ``p`` holds rows ``[p B, (p + 1) B)`` of ``N B``
    (``B = rows``), and group ``g`` is rows ``[g G, (g + 1) G)`` (``G = group_size``). So
    ``lo = floor(p B / G) G`` and ``hi = ceil((p + 1) B / G) G``; the span is the process's
    own rows exactly when ``B`` is a multiple of ``G``."""
    if rows < 1 or group_size < 1 or process < 0:
        raise ValueError(f"group_rows: process {process}, {rows} rows, group size {group_size}; "
                         "need a process index >= 0 and rows, group size >= 1")
    first, last = process * rows, (process + 1) * rows
    return first // group_size * group_size, -(-last // group_size) * group_size


def anchor_sums(anchors: dict, group_size: int, own: tuple[int, int]) -> dict[str, float]:
    """Additive parts of the ``anchors/*`` metrics over one process's share.

    ``anchors`` maps group number ``g`` to its anchors (``didpo``'s ``artifacts["anchors"]``),
    member ``m`` of group ``g`` being batch row ``g G + m.rollout``; ``own`` is the process's
    rows ``[first, last)``. A group counts where its first row is (``count``, ``n``, ``gs``:
    the number of anchors, the sum of their group sizes and of their GS); tokens count in
    the row that holds them (``covered``: tokens under an anchor, ``ad_nonzero``: those whose
    ``A_D != 0``; an anchor's tokens in one rollout are disjoint from every other's). Summed
    over processes: ``count``, ``mean_group_size = n / count``, ``mean_gs = gs / count``,
    ``token_coverage = covered / tokens``, ``ad_nonzero_frac = ad_nonzero / tokens``."""
    first, last = own
    sums = dict.fromkeys(("count", "n", "gs", "covered", "ad_nonzero"), 0.0)
    for g, group in anchors.items():
        start = int(g) * group_size
        for a in group:
            if first <= start < last:
                sums["count"] += 1
                sums["n"] += a.n
                sums["gs"] += a.gs
            for m in a.members:
                if first <= start + m.rollout < last:
                    sums["covered"] += len(m.tokens)
                    sums["ad_nonzero"] += len(m.tokens) if m.a_d != 0 else 0
    return sums


class CurriculumRepeatSampler(Sampler):
    """TRL's prompt order (``RepeatSampler``: each generation batch's prompts, each one
    ``num_generations`` times in a row, the batch ``repeat_count`` times for the updates that
    reuse its generations), with the prompts of each generation batch drawn by labkit's
    curriculum: ``prompts`` distinct rows, a bucket by its learnability weight
    ``w_k = eps + s_k (1 - s_k)`` and then a uniform row of it
    (:meth:`~labkit.env.task_sampling.CurriculumSampler.sample`), where labkit's trainer draws
    a step's tasks the same way.

    The draw of a generation batch reads the curriculum when its first row is asked for, so the
    trainer's updates of ``curriculum`` steer the batches after it. DataLoaders ask one batch
    ahead, so the batch after the next is the first a step's rewards steer (labkit's trainer:
    the next one). Every process iterates the same sampler with the same seed and sees the same
    updates (:class:`CurriculumGRPOTrainer` gathers them), so all draw the same prompts, as TRL
    needs for its groups. One pass yields ``len(buckets) // prompts`` generation batches
    (``RepeatSampler``'s epoch); each pass draws with a seed of its own."""

    def __init__(self, buckets: Sequence[str], curriculum: CurriculumSampler, prompts: int,
                 num_generations: int, repeat_count: int = 1, seed: int = 0):
        if not 0 < prompts <= len(buckets):
            raise ValueError(f"a generation batch of {prompts} prompts from {len(buckets)} rows")
        self.buckets, self.curriculum = list(buckets), curriculum
        self.prompts, self.num_generations, self.repeat_count = prompts, num_generations, repeat_count
        self.seed, self.passes = seed, 0

    def __iter__(self):
        rng = random.Random(f"curriculum:{self.seed}:{self.passes}")
        self.passes += 1
        rows = range(len(self.buckets))
        for _ in range(len(self.buckets) // self.prompts):
            chosen = self.curriculum.sample(rows, self.buckets.__getitem__, self.prompts, rng)
            for _ in range(self.repeat_count):
                for row in chosen:
                    yield from [row] * self.num_generations

    def __len__(self) -> int:
        return (len(self.buckets) // self.prompts) * self.prompts * self.num_generations * self.repeat_count


class CurriculumGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with labkit's learnability curriculum (``curriculum``; ``None``: TRL's
    uniform order, the trainer is then ``GRPOTrainer``).

    The prompts come from :class:`CurriculumRepeatSampler` over the dataset's rows, each
    bucketed by its task's bug kinds (:func:`~labkit.env.task_sampling.bucket`, the dataset's
    ``task`` column). After every generation the curriculum learns, per completion in batch
    order, whether the regime *told* a pass (:func:`~labkit.env.feedback.told_pass` of the
    :class:`SandboxReward`'s components, never the hidden tests), as labkit's trainer updates
    it; on several processes the ``(bucket, told)`` pairs are gathered first, so every process's
    curriculum stays the same. Needs a :class:`SandboxReward` among ``reward_funcs``."""

    def __init__(self, *args, curriculum: CurriculumSampler | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.curriculum = curriculum
        self._sandbox_reward = next((f for f in self.reward_funcs if isinstance(f, SandboxReward)), None)
        if curriculum is not None and self._sandbox_reward is None:
            raise ValueError("the curriculum reads what the regime told: give a SandboxReward "
                             "in reward_funcs")

    def _get_train_sampler(self, dataset=None):
        if self.curriculum is None:
            return super()._get_train_sampler(dataset)
        dataset = self.train_dataset if dataset is None else dataset
        buckets = [bucket(self._sandbox_reward.task(t)) for t in dataset["task"]]  # its task cache
        return CurriculumRepeatSampler(
            buckets, self.curriculum, self.args.generation_batch_size // self.num_generations,
            self.num_generations, self.num_iterations * self.args.steps_per_generation,
            seed=self.args.seed)

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.curriculum is not None and self.model.training:
            last = self._sandbox_reward.history[-1]  # this process's rows, in order
            told = [(bucket(t), float(told_pass(c))) for t, c in zip(last["tasks"], last["components"])]
            if self.accelerator.num_processes > 1:
                told = gather_object(told)  # process order: the batch's row order
            for b, success in told:
                self.curriculum.update(b, success)
        return out


class _CreditTrainer(CurriculumGRPOTrainer):
    """A trainer that replaces TRL's advantages with labkit's credit: it keeps TRL's
    rewards of the batch (the weighted sum of the reward functions, gathered over
    processes)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last_credit: dict | None = None
        self._rewards_per_func: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func  # gathered over processes (TRL's contract)
        return rewards_per_func

    def _batch_rewards(self, rows: int) -> torch.Tensor:
        """The whole batch's rewards ``[N B]`` (``B = rows``, this process's rows), the weighted
        sum TRL standardises."""
        n = self.accelerator.num_processes
        rewards = torch.nansum(self._rewards_per_func * self.reward_weights.to(
            self._rewards_per_func.device).unsqueeze(0), dim=1).double().cpu()  # [N B]
        if len(rewards) != n * rows:
            raise RuntimeError(f"{type(self).__name__}: {len(rewards)} gathered rewards for {n} "
                               f"processes of {rows} rows; every process must hold the same "
                               "number of rows")
        return rewards

    def _gathered(self, local: list[float]) -> tuple[list[float], list[float]]:
        """Per-process figures ``local`` summed over processes and their largest value (the
        slowest process's time)."""
        stats = torch.tensor(local, dtype=torch.float64, device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            stats = self.accelerator.gather(stats)
        stats = stats.view(-1, len(local)).cpu()
        return stats.sum(0).tolist(), stats.max(0).values.tolist()

    def _set_advantages(self, out: dict, advantages: torch.Tensor) -> None:
        """This process's ``[B, T]`` credit as TRL's advantages (cut or padded to TRL's width)."""
        local = out["completion_mask"]
        adv = torch.zeros(local.shape, dtype=torch.float32)  # [B, T] of this process
        width = min(adv.size(1), advantages.size(1))
        adv[:, :width] = advantages[:, :width]
        out["advantages"] = adv.to(local.device)


class DiDPOTrainer(_CreditTrainer):
    """``GRPOTrainer`` with DiDPO's per-token credit (arXiv 2608.07147), on any number of
    processes.

    After TRL has generated and scored a batch, every completion becomes a labkit
    :class:`~labkit.env.records.Rollout` (its token ids, the decoded text, exact per-token
    character offsets, the extracted code) and the group's advantages are recomputed by
    labkit's ``didpo`` estimator: ``A(i, t) = A_E(i) + lambda A_D(i, a*(t))``, ``A_E`` the
    group-standardised reward, ``A_D`` the anchor term on tokens of sub-diffs shared across
    the group. The rewards are TRL's (the weighted sum of the reward functions, gathered
    over processes). ``didpo`` options (``lam``, ``eta``, ...) go in ``didpo_options``; the
    dataset needs the ``task`` column of :func:`task_dataset`.

    On ``N`` processes each one builds the anchors of the groups its rows belong to
    (:func:`group_rows`) and keeps its own rows' ``[B, T]`` advantages. When ``B`` is a
    multiple of the group size every process holds whole groups and nothing more is
    exchanged; otherwise a group spans processes and the completions' token ids and lengths
    are all-gathered first (``int32``; the text, offsets and code are decoded from them, the
    task is any of the group's rows', the rewards are TRL's gathered ones). The ``didpo/*``
    metrics are summed over processes (:func:`anchor_sums`); ``didpo/gather_bytes`` and
    ``didpo/gather_s`` are what one process received and the slowest one's wall time of
    that gather (0 when nothing is gathered). ``last_credit`` keeps the rows this process
    built credit for: their rollouts, rewards, group numbers, mask and advantages, ``rows``
    (their batch rows) and ``own`` (the slice of them that is this process's)."""

    def __init__(self, *args, didpo_options: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.didpo_options = dict(didpo_options or {})

    def _gather_completions(self, ids: torch.Tensor, lengths: torch.Tensor):
        """Every process's completion ids (right-padded to the longest) and lengths, in process
        order, with the bytes received and the seconds it took."""
        t0 = time.perf_counter()
        lengths = self.accelerator.gather(lengths)  # [N B]
        width = int(lengths.max()) if lengths.numel() else 0
        ids = ids[:, :width].to(torch.int32)
        if ids.size(1) < width:
            ids = torch.nn.functional.pad(ids, (0, width - ids.size(1)))
        ids = self.accelerator.gather(ids.contiguous())  # [N B, width]
        nbytes = lengths.numel() * lengths.element_size() + ids.numel() * ids.element_size()
        ids, lengths = ids.cpu(), lengths.cpu()
        return ids, lengths, float(nbytes), time.perf_counter() - t0

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        n, p, B = self.accelerator.num_processes, self.accelerator.process_index, len(inputs)
        rewards = self._batch_rewards(B)  # [N B]
        ids, lengths = out["completion_ids"], out["completion_mask"].sum(1)
        nbytes = seconds = 0.0
        lo, hi = group_rows(p, B, G)
        if n > 1 and B % G:  # some group spans processes (the same on every process)
            ids, lengths, nbytes, seconds = self._gather_completions(ids, lengths)
            ids, lengths = ids[lo:hi], lengths[lo:hi]
        else:
            lo, hi = p * B, (p + 1) * B
            ids, lengths = ids.detach().cpu(), lengths.cpu()
        mask = (torch.arange(ids.size(1)) < lengths.unsqueeze(1)).double()  # [hi - lo, T]
        own = [RepairTask.from_dict(json.loads(example["task"])) for example in inputs]
        task_of = {(p * B + b) // G: task for b, task in enumerate(own)}
        groups = [r // G for r in range(lo, hi)]
        tasks = [task_of[g] for g in groups]
        credit, rollouts = didpo_credit(self.processing_class, ids, mask, rewards[lo:hi], groups,
                                        tasks, first_group=lo // G, **self.didpo_options)
        self._log_didpo(credit, G, (p * B, (p + 1) * B), lengths[p * B - lo:p * B - lo + B],
                        nbytes, seconds, mode)
        mine = slice(p * B - lo, p * B - lo + B)
        self.last_credit = {"rollouts": rollouts, "tasks": tasks, "rewards": rewards[lo:hi],
                            "groups": groups, "mask": mask, "advantages": credit.advantages,
                            "rows": range(lo, hi), "own": mine}
        self._set_advantages(out, credit.advantages[mine])
        return out

    def _log_didpo(self, credit, G: int, own: tuple[int, int], lengths: torch.Tensor,
                   nbytes: float, seconds: float, mode: str) -> None:
        """The ``didpo/*`` metrics of the whole batch: :func:`anchor_sums` of every process
        summed, the anchor build and gather times of the slowest process."""
        sums = anchor_sums(credit.artifacts.get("anchors", {}), G, own)
        local = [sums["count"], sums["n"], sums["gs"], sums["covered"], sums["ad_nonzero"],
                 float(lengths.sum()), credit.metrics.get("anchors/build_s", 0.0), seconds, nbytes]
        total, slowest = self._gathered(local)
        count, n, gs, covered, ad_nonzero, tokens = total[:6]
        values = {"count": count, "mean_group_size": n / count if count else 0.0,
                  "mean_gs": gs / count if count else 0.0,
                  "token_coverage": covered / max(tokens, 1.0),
                  "ad_nonzero_frac": ad_nonzero / max(tokens, 1.0), "build_s": slowest[6],
                  "gather_s": slowest[7], "gather_bytes": slowest[8]}
        for k, v in values.items():
            self._metrics[mode][f"didpo/{k}"].append(v)


class _BaselineFollows(TrainerCallback):
    """After every optimizer step, the EMA baseline follows the policy
    (``theta_b <- beta theta_b + (1 - beta) theta``), as labkit's fork stage does."""

    def __init__(self, trainer: ForkCreditTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        if t.fork.baseline == "ema" and t._policy is not None:
            t._policy.update_baseline(t.fork.beta)


class ForkCreditTrainer(_CreditTrainer):
    """``GRPOTrainer`` with labkit's counterfactual-fork credit (the ``didpo_fork`` estimator,
    :mod:`labkit.credit.fork_credit`), on any number of processes.

    After TRL has generated and scored a batch, each process forks its own rows as labkit's
    fork stage does (:func:`labkit.policy.forking.fork_and_score` with ``fork``, a
    :class:`~labkit.policy.forking.ForkCreditConfig`): positions chosen per rollout, a baseline
    policy proposing ``a != y_t`` (the EMA of the policy, updated after every optimizer step,
    or the frozen start), the current policy continuing at TRL's temperature, top-p and
    completion length, every fork's program rewarded by the :class:`SandboxReward` (which must
    be among ``reward_funcs``; ``dR = R(factual) - R(fork)`` with that reward's own values).
    The advantages are then ``A(i, t) = A_E(i) + lambda A_fork(i, t)`` (``fork_options``:
    ``lam``, ``episode``, ``normalise``, ``spread``), ``A_E`` standardised within each group
    of TRL's rewards.

    Several processes: each must hold whole groups (``per_device_train_batch_size`` a multiple
    of ``num_generations``), and the deltas are normalised over the whole batch: each process's
    ``(F, sum dR, sum dR^2)`` (:func:`~labkit.credit.fork_credit.delta_moments`) is summed over
    processes first. The ``fork/*`` metrics are the batch's (counts summed, times the slowest
    process's). ``last_credit`` keeps this process's rollouts, tasks, rewards, groups, mask,
    fork sites, the batch's moments, the forks' programs and rewards, and the advantages. Forks are skipped in evaluation (TRL's
    advantages stand there); the KL term stays TRL's, to the reference model
    (``kl_to_baseline`` is refused)."""

    def __init__(self, *args, fork: ForkCreditConfig | None = None,
                 fork_options: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fork = fork or ForkCreditConfig()
        self.fork.validate()
        if self.fork.kl_to_baseline:
            raise ValueError("fork.kl_to_baseline: TRL's KL term targets its reference model; "
                             "train with kl_to_baseline=false")
        if self._sandbox_reward is None:
            raise ValueError("fork credit rewards every fork as the batch was: give a "
                             "SandboxReward in reward_funcs")
        if self.args.per_device_train_batch_size % self.num_generations:
            raise ValueError(f"fork credit standardises rewards within groups on each process: "
                             f"per_device_train_batch_size ({self.args.per_device_train_batch_size}) "
                             f"must be a multiple of num_generations ({self.num_generations})")
        self.fork_options = dict(fork_options or {})
        self._policy: Policy | None = None
        self.add_callback(_BaselineFollows(self))

    def _fork_policy(self) -> Policy:
        """labkit's view of the model TRL trains (the same parameters), with its baseline."""
        if self._policy is None:
            model = self.accelerator.unwrap_model(self.model)
            self._policy = Policy(model, self.processing_class,
                                  PolicyConfig(spec=str(model.config.name_or_path), reference="none"),
                                  next(model.parameters()).device, torch.float32,
                                  Path(str(model.config.name_or_path)))
            self._policy.baseline()  # the start: frozen, or the EMA's first value
        return self._policy

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return out
        n, p, B, G = (self.accelerator.num_processes, self.accelerator.process_index, len(inputs),
                      self.num_generations)
        rewards = self._batch_rewards(B)[p * B:(p + 1) * B]  # [B] this process's rows
        told = self._sandbox_reward.history[-1]  # the sandbox reward of these rows, in order
        tasks = [self._sandbox_reward.task(example["task"]) for example in inputs]  # its cache
        lengths = out["completion_mask"].sum(1).tolist()
        rollouts = [  # ``sample``: the batch row, unique even where a task fills two groups
            rollout_from_ids(self.processing_class, ids[:k].tolist(), task.task_id, p * B + b,
                             prompt_ids=pids[pmask.bool()].tolist(), temperature=self.temperature)
            for b, (ids, k, pids, pmask, task) in enumerate(zip(
                out["completion_ids"].cpu(), lengths, out["prompt_ids"].cpu(),
                out["prompt_mask"].cpu(), tasks))]
        step = self.state.global_step
        policy = self._fork_policy()
        got = fork_and_score(
            policy, rollouts, tasks,
            lambda ts, codes: self._sandbox_reward.rewards(ts, codes, step=step, seed=derive_seed(
                self.args.seed, "fork-feedback", step, p))[0],
            PositionConfig(self.fork.strategy, self.fork.fraction, self.fork.budget,
                           seed=derive_seed(self.args.seed, "fork-positions", step, p)),
            ForkConfig(temperature=self.temperature, top_p=self.top_p,
                       max_new_tokens=self.max_completion_length, stop_strings=(),
                       batch_size=self.fork.batch_size,
                       seed=derive_seed(self.args.seed, "fork", step, p)))
        sites = fork_sites(got.rows, [f.t for f in got.batch.forks],
                           [told["rewards"][b] for b in got.rows], got.counterfactual)
        moments = torch.tensor(delta_moments(sites.dr), dtype=torch.float64)  # [3]
        if n > 1:
            moments = self.accelerator.gather(moments.to(self.accelerator.device)).view(n, 3).sum(0)
        moments = tuple(moments.cpu().tolist())
        mask = out["completion_mask"].detach().cpu().double()
        groups = [(p * B + b) // G for b in range(B)]
        credit = compute_advantages("didpo_fork", AdvantageInput(
            rewards, groups, mask, rollouts=rollouts, tasks=tasks, forks=sites),
            **{**self.fork_options, "moments": moments})
        self._log_forks(got, moments)
        self.last_credit = {"rollouts": rollouts, "tasks": tasks, "rewards": rewards,
                            "groups": groups, "mask": mask, "sites": sites, "moments": moments,
                            "fork_codes": [f.rollout.code for f in got.batch.forks],
                            "counterfactual": got.counterfactual, "advantages": credit.advantages}
        self._set_advantages(out, credit.advantages)
        return out

    def _log_forks(self, got, moments: tuple[float, float, float]) -> None:
        """``fork/*`` of the whole batch: forks and differing ones summed over processes, the
        deltas' mean and RMS from the batch's moments, the slowest process's times."""
        forks = got.batch.forks
        total, slowest = self._gathered([len(forks), sum(f.differs for f in forks), got.gen_s,
                                          got.exec_s])
        F, s1, s2 = moments
        values = {"n": total[0], "differs_frac": total[1] / max(total[0], 1.0),
                  "dr_mean": s1 / F if F else 0.0, "dr_rms": (s2 / F) ** 0.5 if F else 0.0,
                  "gen_s": slowest[2], "exec_s": slowest[3]}
        for k, v in values.items():
            self._metrics["train"][f"fork/{k}"].append(v)
