"""The GRPO trainer: one readable loop.

    for step:
        tasks    <- pick tasks_per_step training tasks              (uniform or curriculum)
        rollouts <- sample G completions per task                   (labkit.policy.rollout)
        feedback <- run every program in the sandbox, components     (labkit.env.feedback)
        measured <- the rollout stages the estimator needs          (labkit.loops.stages:
                    counterfactual forks, hunk values, by need)
        credit   <- reward -> normalised -> [B, T] advantages        (labkit.credit.pipeline)
        update   <- PPO-clip (+ KL to the reference, - entropy)      (labkit.credit.losses)
        metrics  -> metrics.jsonl, rollouts.jsonl, events

The loop draws nothing: it emits events (``on_rollout``, ``on_step_end``, ``on_eval``,
``on_checkpoint``) and writes a run folder. Everything random is derived from
``(seed, step)``, so a run killed at any point and resumed from its last checkpoint
produces the same metrics as an uninterrupted one (on CPU). Several processes (``accelerate
launch`` / ``torchrun``) train data-parallel behind one seam (:class:`DataParallel`).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import torch

from labkit.config import to_dict
from labkit.credit.anchors import anchor_records
from labkit.credit.losses import POLICY_LOSSES, agg_loss, kl_penalty
from labkit.credit.pipeline import Credit, CreditInput, baseline_term
from labkit.env.feedback import BuggyBaselines, ProgressTracker, evaluate_many, told_pass
from labkit.env.records import Components, RepairTask
from labkit.sandbox.pool import Sandbox
from labkit.env.task_sampling import (CurriculumSampler, bucket, check_train_tasks, pick_tasks,
                                      run_tasks)
from labkit import provenance
from labkit.runs import metrics as M
from labkit.runs.background import TrainingStopped, stopped_line
from labkit.loops.checkpoints import (CheckpointError, Checkpointing, OptimiserPart,  # noqa: F401
                                      Part, RunFolderError, StagePart, StatePart, WeightsPart,
                                      held_run_error, latest_checkpoint, refuse_busy)
from labkit.loops.config import OptimConfig, TrainConfig, load_config  # noqa: F401
from labkit.runs.events import EventBus, RunFolder
from labkit.loops.parallel import DataParallel
from labkit.runs.records import RolloutRecord
from labkit.loops.stages import Stage, StepContext, stages_for
from labkit.runs.trackers import Trackers
from labkit.policy.evaluate import EvalConfig, evaluate
from labkit.policy.loading import load_policy
from labkit.policy.rollout import (Rollout, SamplingConfig, collate, micro_batches, sample,
                                   sample_with_cache, select_rows, sequence_logprobs)
from labkit.seeding import derive_seed, seed_everything

# ============================================================================= trainer



def eval_row(policy, cfg: TrainConfig, tasks, sandbox, step: int) -> dict:
    """A run's held-out evaluation at ``step``, as ``eval.jsonl`` holds it: pass@1 and
    pass@``eval_k`` of ``cfg.eval_k`` samples per task at ``cfg.eval_temperature``, with the
    run's own evaluation sampling seed (the same at every step), the copy rate, the mean tests
    passed and the seconds it took. The trainer's periodic evaluation, and the TRL engine's at
    a run's start and end (:mod:`labkit.experiments.trl_engine`)."""
    t0 = time.time()
    ecfg = EvalConfig(k=cfg.eval_k, temperature=cfg.eval_temperature, greedy=False,
                      max_new_tokens=cfg.sampling.max_new_tokens, seed=derive_seed(cfg.seed, "eval"),
                      parallel_chunks=cfg.sampling.parallel_chunks)
    rep = evaluate(policy, tasks, ecfg, sandbox=sandbox)
    return {"step": step, "eval/pass_at_1": rep["pass_at_1"],
            f"eval/pass_at_{cfg.eval_k}": rep[f"pass_at_{cfg.eval_k}"],
            "eval/copy_rate": rep["copy_rate"], "eval/mean_tests": rep["mean_tests_passed"],
            "eval/tasks": rep["tasks"], "time/eval": time.time() - t0}


class Trainer(Checkpointing):
    """Holds the policy, optimiser and running state; :meth:`train` runs the loop
    (checkpoints: :class:`labkit.loops.checkpoints.Checkpointing`)."""

    def __init__(self, cfg: TrainConfig, *, policy=None, train_tasks: Sequence[RepairTask] | None = None,
                 eval_tasks: Sequence[RepairTask] | None = None, sandbox=None, reward_fn=None,
                 overwrite: bool = False):
        """``reward_fn(tasks, rollouts) -> list[dict]`` (optional) replaces the sandbox and
        feedback floor with your own component dicts (they need ``r_test`` and ``r_pass``);
        the reshaping, estimator and update stay the same. A run folder that holds another
        run is refused when training starts (:class:`RunFolderError`) unless ``overwrite``
        (its run files are then removed) or the run is resumed (:meth:`resume`)."""
        cfg.validate()
        self.trackers = Trackers(cfg.report_to, cfg.trackers)  # not installed: fails here
        self.reward_fn = reward_fn
        self.overwrite = overwrite
        self._resumed = False
        self.cfg = cfg
        self.events = EventBus()
        self.run = RunFolder(cfg.run_dir)
        seed_everything(cfg.seed)
        self.policy = policy or load_policy(cfg.policy)
        self.train_tasks = (list(train_tasks) if train_tasks is not None
                            else run_tasks(cfg.tasks, cfg.seed, "train"))
        self.eval_tasks = (list(eval_tasks) if eval_tasks is not None
                           else run_tasks(cfg.tasks, cfg.seed, "eval"))
        check_train_tasks(self.train_tasks, cfg.tasks)
        self._own_sandbox = sandbox is None and reward_fn is None
        if sandbox is None and reward_fn is None:
            sandbox = Sandbox(cfg.sandbox)
        self.sandbox = sandbox
        self.params = self.policy.trainable_parameters()
        o = cfg.optim
        self.opt = torch.optim.AdamW(self.params, lr=o.lr, weight_decay=o.weight_decay,
                                     betas=tuple(o.betas), fused=o.fused or None)
        self.dist = DataParallel(self.policy, self.opt)  # one process: a no-op seam
        self.opt, self.train_model = self.dist.opt, self.dist.model
        self.world, self.rank, self.is_main = self.dist.world, self.dist.rank, self.dist.rank == 0
        if self.is_main:
            self.trackers.attach(self)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._lr_factor)
        self.credit = Credit(cfg.reshape, cfg.estimator, cfg.estimator_options, cfg.match_scale)
        self.progress = ProgressTracker(cfg.feedback.progress_patience, cfg.feedback.progress_bonus)
        self.curriculum = CurriculumSampler() if cfg.curriculum else None
        self.baselines = BuggyBaselines(cfg.feedback, sandbox, seed=derive_seed(cfg.seed, "buggy"))
        self.stages: list[Stage] = stages_for(cfg, self.policy)  # what the estimator needs
        self.step = 0
        self._stop = False
        # what a checkpoint saves and a resume restores, part by part: new state is a new part
        cur = self.curriculum
        self.parts: list[Part] = [
            WeightsPart(self.policy), OptimiserPart(self.opt, self.sched),
            StatePart("lora", lambda: self.policy.is_lora, check=self._lora_differs),
            StatePart("reshaper", self.credit.state_dict, self.credit.load_state_dict),
            StatePart("progress", self.progress.state_dict, self.progress.load_state_dict),
            StatePart("curriculum", lambda: cur.state_dict() if cur else None,
                      lambda s: cur.load_state_dict(s) if cur is not None and s else None),
            StatePart("baselines", self.baselines.state_dict, self.baselines.load_state_dict),
            *(StagePart(stage, self.policy, cfg.estimator) for stage in self.stages)]

    # ------------------------------------------------------------------ setup helpers
    def _lr_factor(self, step: int) -> float:
        o = self.cfg.optim
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant":
            return 1.0
        frac = min(1.0, (step - o.warmup_steps) / max(1, self.cfg.steps - o.warmup_steps))
        if o.schedule == "linear":
            return 1.0 - (1.0 - o.min_lr_ratio) * frac
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))

    def _seed(self, *names) -> int:
        """A seed of this step: ``derive_seed(seed, *names, step)``, plus the process's rank
        when several train (none in a single process, so results match)."""
        rank = ("rank", self.rank) if self.world > 1 else ()
        return derive_seed(self.cfg.seed, *names, self.step, *rank)

    def _lora_differs(self, saved: bool) -> str:
        return "" if saved == self.policy.is_lora else \
            f"was saved with lora={saved}, but this policy has lora={self.policy.is_lora}"

    def request_stop(self) -> None:
        """Stop between steps: after the current one finishes, is logged and checkpointed."""
        self._stop = True

    def close(self) -> None:
        """End the trackers' runs, drop the folder's running mark, stop an own sandbox."""
        self.trackers.close(finished=self.step >= self.cfg.steps)
        if self.is_main:
            self.run.mark_stopped()
        if self._own_sandbox and self.sandbox is not None:
            self.sandbox.close()

    # ------------------------------------------------------------------ the loop
    def train(self, steps: int | None = None, progress: bool = True) -> list[dict]:
        """Run until ``cfg.steps`` (or ``steps`` more); returns this call's metrics rows."""
        cfg = self.cfg
        end = cfg.steps if steps is None else min(cfg.steps, self.step + steps)
        self._stop = False
        rows = []
        if self.is_main:
            refuse_busy(self.run)
        if self.step == 0:
            if self.is_main and not self._resumed and self.run.holds_run():
                if not self.overwrite:
                    raise held_run_error(self.run)
                self.run.clear()
            if self.is_main:
                self.run.write_json("config.json", to_dict(cfg))
                provenance.record_start(self.run.path)
        if self.is_main:
            self.run.mark_running()
        bar = None
        try:
            if self.step == 0:
                self.events.emit("on_train_start", trainer=self)
                if cfg.eval_every:
                    self._evaluate()
            if progress:
                from tqdm.auto import tqdm

                bar = tqdm(total=end, initial=self.step, desc="train", unit="step")
            while self.step < end and not self._stop:
                row = self.train_step()
                rows.append(row)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{row['reward/mean']:.3f}", pass1=f"{row['train/pass_at_1']:.2f}")
                if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.steps):
                    self._evaluate()
                if self.is_main and (self.step % cfg.checkpoint_every == 0 or self.step == end
                                     or self._stop):  # a stop asked for keeps the step it finished
                    self.save_checkpoint()
        except TrainingStopped:
            raise
        except KeyboardInterrupt:  # the kernel's interrupt or Ctrl-C: one line, no traceback
            raise TrainingStopped(stopped_line(self)) from None
        finally:
            if bar is not None:
                bar.close()
            if self.is_main:
                self.run.mark_stopped()
        if self.step >= cfg.steps:
            self.events.emit("on_train_end", trainer=self)
        return rows

    def train_step(self) -> dict:
        cfg, step = self.cfg, self.step
        t_step, timings = time.time(), {}

        # -- pick tasks --------------------------------------------------------------
        tasks = pick_tasks(self.train_tasks, cfg.tasks_per_step, random.Random(self._seed("tasks")),
                           self.curriculum)

        # -- generate ----------------------------------------------------------------
        t0 = time.time()
        scfg = dataclasses.replace(cfg.sampling, seed=self._seed("sample"))
        rollouts, kv = self._sample(tasks, scfg)  # kv: prefix caches, when a stage keeps them
        timings["time/generate"] = time.time() - t0
        self.events.emit("on_rollout", trainer=self, step=step, rollouts=rollouts)

        # -- execute + feedback --------------------------------------------------------
        t0 = time.time()
        task_of = [tasks[i // scfg.group_size] for i in range(len(rollouts))]
        fb, baselines = self._feedback(task_of, rollouts)
        timings["time/execute"] = time.time() - t0

        # -- rollout stages the estimator needs (forks, hunk values, ...) ----------------------
        measured, stage_metrics = {}, {}
        ctx = StepContext(step, self.policy, rollouts, task_of,
                          factual=lambda: self._program_rewards([f.components for f in fb], baselines),
                          baseline=lambda: self._program_rewards(baselines, baselines),
                          score=self._score_programs, sampling=scfg, seed=self._seed, kv=kv)
        for stage in self.stages:
            t0 = time.time()
            measured[stage.need] = stage.measure(ctx)
            timings[f"time/{stage.name}"] = time.time() - t0
            stage_metrics.update(stage.metrics(measured[stage.need]))
        del kv, ctx  # the caches are large; the update does not need them

        # -- credit: reward -> normalised -> [B, T] advantages --------------------------------
        t0 = time.time()
        batch = collate(rollouts, self.policy.tokenizer.pad_token_id, self.policy.device)
        credit = self.credit(CreditInput([f.components for f in fb], [r.task_id for r in rollouts],
                                         batch["completion_mask"], baselines, rollouts=rollouts,
                                         tasks=task_of, measured=measured))
        timings["time/reward"] = time.time() - t0

        # -- update ---------------------------------------------------------------------
        t0 = time.time()
        mask = batch["completion_mask"]
        old_logp = torch.zeros_like(mask)
        for b, r in enumerate(rollouts):
            old_logp[b, :len(r.logprobs)] = torch.tensor(r.logprobs, dtype=mask.dtype)
        upd = self._update(batch, old_logp, credit.advantages, scfg.temperature)
        for stage in self.stages:
            stage.after_update(self.policy)  # e.g. the fork baseline's EMA follows the policy
        timings["time/update"] = time.time() - t0
        self.sched.step()
        self.credit.advance()
        if self.curriculum is not None:  # steered by what the regime told, not the hidden tests
            for t, f in zip(task_of, fb):
                self.curriculum.update(bucket(t), float(told_pass(f.components)))

        # -- metrics ----------------------------------------------------------------------
        self.step += 1
        row = self._metrics(rollouts, fb, credit, upd, stage_metrics, timings, t_step)
        records = self._records(rollouts, task_of, fb, baselines, credit)
        if self.is_main:
            self.run.append("metrics.jsonl", row)
            self._log_rollouts(records)
            self._log_anchors(credit.artifacts.get("anchors"))
        self.events.emit("on_step_end", trainer=self, step=self.step, metrics=row, records=records)
        return row

    # ------------------------------------------------------------------ step pieces
    def _sample(self, tasks: Sequence[RepairTask], scfg: SamplingConfig):
        """The step's rollouts, and the prefix caches when a stage keeps them (else None)."""
        if any(s.keeps_caches for s in self.stages):
            return sample_with_cache(self.policy, tasks, scfg)
        return sample(self.policy, tasks, scfg), None

    def _feedback(self, task_of: Sequence[RepairTask], rollouts: Sequence[Rollout]):
        """Each row's feedback (components and sandbox result) and its task's buggy-code
        baseline (``None`` with a custom ``reward_fn``)."""
        if self.reward_fn is not None:
            comps = self.reward_fn(task_of, rollouts)
            return [_CustomFeedback(Components.from_dict(c)) for c in comps], [None] * len(rollouts)
        baselines = self.baselines.of(task_of)
        fb = evaluate_many(task_of, [r.code for r in rollouts], config=self.cfg.feedback,
                           sandbox=self.sandbox, progress=self.progress, seed=self._seed("feedback"))
        return fb, baselines

    def _program_rewards(self, components, baselines) -> list[float]:
        """Rewards of programs as a stage compares them with the step's: the step's recipe
        without the one-off ``r_progress`` bonus (it belongs to the step, not to the program)."""
        comps = [{**c, "r_progress": 0.0} if c is not None else {"r_test": 0.0, "r_pass": 0.0}
                 for c in components]
        return self.credit.rewards(comps, baselines)[0].tolist()

    def _score_programs(self, tasks: Sequence[RepairTask], codes: Sequence[str]) -> list[float]:
        """A stage's programs (forks, hunk subsets) executed and rewarded like a step's own."""
        if self.reward_fn is not None:
            rolls = [Rollout(task_id=t.task_id, sample=i, prompt="", prompt_ids=[], completion_ids=[],
                             logprobs=[], completion=c, code=c, code_start=0, offsets=[], finished=True)
                     for i, (t, c) in enumerate(zip(tasks, codes))]
            return self._program_rewards(self.reward_fn(list(tasks), rolls), [None] * len(codes))
        fb = evaluate_many(tasks, list(codes), config=self.cfg.feedback, sandbox=self.sandbox,
                           seed=derive_seed(self.cfg.seed, "fork-feedback", self.step))
        return self._program_rewards([f.components for f in fb], self.baselines.of(tasks))

    def _metrics(self, rollouts, fb, credit, upd: dict, stage_metrics: dict, timings: dict,
                 t_step: float) -> dict:
        """The step's row of ``metrics.jsonl`` (flat, namespaced: ``reward/*``, ``adv/*``, ...)."""
        comps = [f.components for f in fb]
        groups = defaultdict(list)
        for r in rollouts:
            groups[r.task_id].append(r.code)
        terms = credit.terms
        row = {"step": self.step,
               **M.reward_metrics(credit.rewards.tolist(), comps),
               **{f"reward_term/{k}": sum(t[k] for t in terms) / len(terms) for k in terms[0]},
               **credit.metrics, **upd,
               "train/pass_at_1": sum(f.components["r_pass"] for f in fb) / len(fb),
               **M.length_metrics([r.n_tokens for r in rollouts], [r.finished for r in rollouts]),
               **M.diversity_metrics(groups),
               **M.hack_metrics([f.hack_flags for f in fb]),
               **M.compile_metrics([f.result is not None and "syntax_error" in f.result.flags
                                    for f in fb], [f.components["r_compile"] for f in fb]),
               **M.status_metrics([f.result.status.value for f in fb if f.result is not None]),
               "lr": self.opt.param_groups[0]["lr"],
               **stage_metrics, **timings, "time/step": time.time() - t_step}
        for stage in self.stages:  # what a stage adds to a step without it
            row.update(stage.cost_metrics(timings[f"time/{stage.name}"], row["time/step"]))
        row["dist/world_size"] = self.world
        return row

    def _kl_target(self):
        """The policy the KL term is measured against: the reference, unless a stage moves it
        (the fork baseline under ``fork.kl_to_baseline``)."""
        for stage in self.stages:
            if type(stage).kl_target is not Stage.kl_target:
                return stage.kl_target(self.policy)
        return Stage().kl_target(self.policy)

    @property
    def loss_horizon(self) -> int:
        """``T`` of the ``seq-mean-token-sum-norm`` aggregation: ``loss.horizon``, else
        ``sampling.max_new_tokens``; a constant of the run, not of the batch."""
        return self.cfg.loss.horizon or self.cfg.sampling.max_new_tokens

    def _update(self, batch: dict, old_logp: torch.Tensor, adv: torch.Tensor, temperature: float) -> dict:
        """``epochs`` passes of micro-batched PPO-clip (+ beta KL - entropy), aggregated over
        the whole batch exactly (each micro-batch weighted by its share of the aggregate)."""
        cfg = self.cfg.loss
        model = self.train_model
        mask = batch["completion_mask"]
        # groups ordered by their longest completion, then cut: each micro-batch pads little
        mbs = micro_batches(batch, cfg.micro_batch_size)
        subs = [select_rows(batch, mb) for mb in mbs]  # each only the columns its rows use
        ref_logp = None
        clock = {"reference": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        t0 = time.perf_counter()
        if cfg.kl_coef > 0:
            ref_logp = torch.zeros_like(mask)  # [B, T]
            with torch.no_grad(), self._kl_target() as ref:
                for mb, sub in zip(mbs, subs):
                    lp = sequence_logprobs(ref, sub, temperature, engine=cfg.engine)[0]
                    ref_logp[mb, :lp.shape[1]] = lp
        clock["reference"] += time.perf_counter() - t0
        loss_fn = POLICY_LOSSES.get(cfg.policy_loss)
        horizon = self.loss_horizon
        weight_total, scale = self.dist.global_weight(_agg_weight(mask, cfg.agg))
        model.train()
        acc: dict[str, list[float]] = defaultdict(list)
        for _ in range(cfg.epochs):
            self.opt.zero_grad(set_to_none=True)
            for mb, sub in zip(mbs, subs):
                t0 = time.perf_counter()
                m = sub["completion_mask"]
                t = m.shape[1]
                logp, ent = sequence_logprobs(model, sub, temperature, with_entropy=True,
                                              engine=cfg.engine)  # [b, t]
                pg, pm = loss_fn(logp, old_logp[mb, :t], adv[mb, :t], m, eps_low=cfg.eps_low,
                                 eps_high=cfg.eps_high, dual_clip=cfg.dual_clip, agg=cfg.agg,
                                 horizon=horizon)
                loss = pg
                if ref_logp is not None:
                    ref_mb = ref_logp[mb, :t]
                    kl = kl_penalty(logp, ref_mb, cfg.kl_estimator)
                    loss = loss + cfg.kl_coef * agg_loss(kl, m, cfg.agg, horizon)
                    acc["kl/k1"].append(agg_loss(logp.detach() - ref_mb, m).item())
                    acc["kl/k3"].append(agg_loss(kl_penalty(logp.detach(), ref_mb, "k3"), m).item())
                if cfg.entropy_coef:
                    loss = loss - cfg.entropy_coef * agg_loss(ent, m, cfg.agg, horizon)
                share = _agg_weight(m, cfg.agg) / max(weight_total, 1e-12)
                last = mb is mbs[-1]
                sync = self.dist.no_sync(model, last)
                t1 = time.perf_counter()
                clock["forward"] += t1 - t0
                with sync:
                    (loss * share * scale).backward()
                clock["backward"] += time.perf_counter() - t1
                acc["loss/policy"].append(pg.item() * share)
                acc["entropy"].append(agg_loss(ent.detach(), m).item())
                for k, v in pm.items():
                    acc[k].append(v)
            t0 = time.perf_counter()
            gn = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.grad_clip)
            acc["grad/norm"].append(float(gn))
            self.opt.step()
            clock["optimizer"] += time.perf_counter() - t0
        model.eval()
        out = {k: (sum(v) if k == "loss/policy" else sum(v) / len(v)) for k, v in acc.items()}
        out["loss/policy"] /= cfg.epochs
        out.update({f"time/update_{k}": v for k, v in clock.items()})
        return out

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self) -> dict | None:
        if not self.eval_tasks or not self.is_main:
            return None
        row = eval_row(self.policy, self.cfg, self.eval_tasks, self.sandbox, self.step)
        self.run.append("eval.jsonl", row)
        self.events.emit("on_eval", trainer=self, step=self.step, metrics=row)
        return row

    # ------------------------------------------------------------------ records
    def _records(self, rollouts: list[Rollout], tasks, fb, baselines, credit) -> list[dict]:
        """The step's :class:`RolloutRecord` rows (as dicts: what ``rollouts.jsonl`` holds)."""
        out = []
        for b, (r, t, f) in enumerate(zip(rollouts, tasks, fb)):
            res = f.result
            out.append(RolloutRecord(
                step=self.step, task_id=r.task_id, sample=r.sample, buggy_code=t.buggy_code,
                completion=r.completion, code=r.code, code_start=r.code_start,
                offsets=[list(o) for o in r.offsets], completion_ids=r.completion_ids,
                logprobs=r.logprobs, components=f.components.to_dict(),
                reward=float(credit.rewards[b]),
                buggy_r_test=baseline_term(baselines[b], self.cfg.reshape),
                advantages=credit.advantages[b, :r.n_tokens].tolist(),
                status=res.status.value if res is not None else "custom",
                tests=[[o.name, o.ok] for o in res.outcomes] if res is not None else [],
                tests_total=res.total if res is not None else None,
                public_tests=[c.name for c in t.public_tests.cases],
                flags=list(f.hack_flags)).to_dict())
        return out

    def _log_rollouts(self, records: list[dict]) -> None:
        n = self.cfg.log_rollouts
        if n == 0:
            return
        keep = records if n < 0 else records[:n]
        flagged = [r for r in records[len(keep):] if r["flags"]]  # always keep flagged samples
        for rec in keep + flagged:
            self.run.append("rollouts.jsonl", rec)

    def _log_anchors(self, anchors_by_task: dict | None) -> None:
        """DiDPO anchors of this step (when the estimator built them) to anchors.jsonl."""
        if not anchors_by_task:
            return
        for task_id, anchors in anchors_by_task.items():
            for rec in anchor_records(anchors, step=self.step, task_id=task_id):
                self.run.append("anchors.jsonl", rec)

# ============================================================================= helpers


@dataclass(frozen=True)
class _CustomFeedback:
    """What a user ``reward_fn`` gives in place of the feedback floor's ``Feedback``: its
    components, and no sandbox result (records say status ``custom``, no tests)."""

    components: Components
    hack_flags: tuple = ()
    result: None = None


def _agg_weight(mask: torch.Tensor, mode: str) -> float:
    """How much of an aggregate a (micro-)batch holds: tokens for token-mean, non-empty
    sequences for the seq-mean modes."""
    if mode == "token-mean":
        return float(mask.sum())
    return float((mask.sum(-1) > 0).sum())


def train_from_config(cfg: TrainConfig, resume: bool = False, progress: bool = True,
                      allow_code_drift: bool = False, **kwargs) -> Trainer:
    """Build a trainer (resuming the run in its folder if asked: :meth:`Trainer.resume`, which
    refuses a run of other code unless ``allow_code_drift``) and train."""
    trainer = Trainer(cfg, **kwargs)
    if resume:
        trainer.resume(allow_code_drift=allow_code_drift)
    try:
        trainer.train(progress=progress)
    finally:
        trainer.close()
    return trainer
