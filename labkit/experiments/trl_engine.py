"""The TRL engine of the experiments: ``python -m labkit experiment NAME --set engine=trl``.

Each run of a method trains through TRL's ``GRPOTrainer`` (``DiDPOTrainer`` for the ``didpo``
estimator, :mod:`labkit.integrations.trl`; with labkit's curriculum drawing the prompts where
the method asks for it) with labkit's sandboxed reward
(:class:`~labkit.integrations.trl.SandboxReward`), on ``processes`` processes under
``accelerate launch`` (one process: a plain child process). Everything around the training is
the experiment's own: the run's :class:`~labkit.loops.config.TrainConfig` (the same one the
labkit engine would train), its training and evaluation tasks, the held-out evaluation at the
start and the end (:func:`labkit.policy.evaluate.evaluate`, the trainer's settings), the run
folder (``config.json``, ``provenance.json``, ``metrics.jsonl``, ``eval.jsonl``, the final
checkpoint in the labkit format), so the paired evaluation, the statistics and the page read a
TRL run as they read a labkit one.

How a ``TrainConfig`` maps onto ``GRPOConfig`` (:func:`labkit.integrations.trl_train.grpo_config`, in
the child :mod:`labkit.integrations.trl_train`): ``tasks_per_step x G``
rows per step split over the processes, ``num_generations = G``, the sampler's temperature,
top-p and length, AdamW's rate, betas, decay and clipping, a constant schedule, the KL
coefficient as ``beta`` (TRL's estimator is k3), the clip range as ``epsilon`` /
``epsilon_high``, ``loss.epochs`` as ``num_iterations`` and the loss aggregation as TRL's
``loss_type`` (token-mean -> ``dapo``, seq-mean-token-mean -> ``grpo``). What differs: TRL draws
the training prompts with its own sampler (the same training problems, another order; with the
curriculum, labkit's weights steer the batch after next instead of the next), it
samples with ``model.generate`` (another random stream than labkit's sampler), and a run
evaluates at its start and its end only (no periodic evaluations: the page's curves have two
points). An interrupted TRL run trains again from its start (runs are minutes long on the
tiny model); a finished one is reused as a labkit run is.

A config the engine cannot train as asked is refused before anything trains
(:func:`refusal`): estimators other than ``grpo``, ``didpo`` and ``didpo_fork`` (the oracles
and the hunk-value stages need labkit's rollout stages; fork credit trains with
``ForkCreditTrainer``, which forks each process's rows, so ``tasks_per_step`` must split into
whole groups over the processes, and its KL term stays TRL's, to the reference), the advantage-side
transforms of reshaping (batch normalisation, EMA baseline, clipping, amplification, focus),
GRPO's scale matching, an entropy bonus, a KL estimator other than k3 and a policy
loss other than PPO-clip.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from labkit import provenance
from labkit.config import REPO_ROOT, to_dict
from labkit.env.task_sampling import run_tasks
from labkit.experiments.paired import policy_at
from labkit.integrations import TRL_LOSS_TYPES
from labkit.loops.config import TrainConfig
from labkit.loops.trainer import eval_row
from labkit.policy.loading import load_policy
from labkit.runs.events import RunFolder
from labkit.sandbox.pool import Sandbox

class EngineError(ValueError):
    """A run the engine cannot train as asked, or a TRL run that failed: one line (and the
    failed run's log tail) for the command line."""


ENGINES = ("labkit", "trl")
"""What trains an experiment's runs: labkit's trainer, or TRL's."""

ESTIMATORS = ("grpo", "didpo", "didpo_fork")
"""The estimators the TRL engine trains: GRPO (``GRPOTrainer``), DiDPO (``DiDPOTrainer``) and
counterfactual-fork credit (``ForkCreditTrainer``)."""



def refusal(cfg: TrainConfig, processes: int = 1) -> str | None:
    """Why the TRL engine cannot train ``cfg`` as asked on ``processes`` processes (one
    line), or ``None``."""
    r, loss = cfg.reshape, cfg.loss
    forks = cfg.estimator == "didpo_fork"
    reasons = [
        (cfg.estimator not in ESTIMATORS,
         f"estimator {cfg.estimator!r} needs labkit's rollout stages or credit; the TRL engine "
         f"trains {', '.join(ESTIMATORS)}"),
        (forks and cfg.fork.kl_to_baseline,
         "fork.kl_to_baseline: TRL's KL term targets its reference model"),
        (forks and cfg.tasks_per_step % processes,
         f"fork credit standardises rewards within groups on each process: tasks_per_step "
         f"({cfg.tasks_per_step}) must be a multiple of processes ({processes})"),
        (r.normalise != "none" or r.ema_baseline or r.adv_clip or r.amplify != "none"
         or r.focus_threshold,
         "reshaping's advantage transforms (normalise, ema_baseline, adv_clip, amplify, focus) "
         "act in labkit's credit pipeline; TRL standardises per group"),
        (cfg.match_scale, "match_scale (GRPO's scale) is labkit's credit pipeline's"),
        (loss.entropy_coef != 0, "TRL's GRPO loss has no entropy bonus"),
        (loss.kl_coef and loss.kl_estimator != "k3", "TRL's KL estimator is k3"),
        (loss.policy_loss != "ppo_clip", "TRL's policy loss is PPO-clip"),
        (loss.agg not in TRL_LOSS_TYPES, f"loss.agg {loss.agg!r} has no TRL loss_type "
                                     f"(it has {', '.join(TRL_LOSS_TYPES)})"),
    ]
    return next((why for bad, why in reasons if bad), None)


def launch_command(run_dir: str | Path, processes: int) -> list[str]:
    """The child that trains ``run_dir``'s config: this module's ``main`` in one process, or
    under ``accelerate launch`` on ``processes`` CPU or GPU processes."""
    child = ["-m", "labkit.integrations.trl_train", str(run_dir)]
    if processes == 1:
        return [sys.executable, *child]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [str(Path(sys.executable).with_name("accelerate")), "launch", "--multi_gpu",
            "--num_processes", str(processes), "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", str(port), *child]


def train(cfg: TrainConfig, processes: int = 1) -> None:
    """Train ``cfg`` with TRL into ``cfg.run_dir``: evaluate the start, train in a child process
    (or ``processes`` under ``accelerate launch``), evaluate the final checkpoint. Raises
    :class:`EngineError` (one line) for a config :func:`refusal` refuses, or with the child's
    last lines when it fails."""
    why = refusal(cfg, processes)
    if why:
        raise EngineError(f"engine=trl cannot train this run: {why}")
    run = RunFolder(cfg.run_dir)
    for name in ("metrics.jsonl", "eval.jsonl", "trl.log"):  # an interrupted run starts again
        run.file(name).unlink(missing_ok=True)
    run.write_json("config.json", to_dict(cfg))
    provenance.record_start(run.path)
    eval_tasks = run_tasks(cfg.tasks, cfg.seed, "eval")
    with Sandbox(cfg.sandbox) as sandbox:
        run.append("eval.jsonl", eval_row(load_policy(cfg.policy), cfg, eval_tasks, sandbox, 0))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        if processes > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        with open(run.file("trl.log"), "w") as log:
            child = subprocess.run(launch_command(run.path, processes), env=env, cwd=REPO_ROOT,
                                   stdout=log, stderr=subprocess.STDOUT)
        if child.returncode:
            tail = run.file("trl.log").read_text()[-2000:]
            raise EngineError(f"the TRL run in {run.path} failed (exit {child.returncode}); "
                               f"its log ends:\n{tail}")
        run.append("eval.jsonl", eval_row(policy_at(run.path), cfg, eval_tasks, sandbox,
                                           cfg.steps))


