"""``python -m labkit.integrations.trl_train RUN_DIR``: train a run folder's config with TRL.

The child process of the experiments' TRL engine (:mod:`labkit.experiments.trl_engine`, which
writes ``RUN_DIR/config.json``, evaluates the start and the end, and launches this module,
under ``accelerate launch`` for several processes). It reads the config as the plain record
it is (this floor sits below the trainer's), maps it onto TRL's ``GRPOConfig``
(:func:`grpo_config`), trains ``GRPOTrainer`` (``DiDPOTrainer`` for the ``didpo`` estimator,
``ForkCreditTrainer`` for ``didpo_fork``;
both with labkit's curriculum when the config asks for it, ``CurriculumGRPOTrainer``)
with labkit's :class:`~labkit.integrations.trl.SandboxReward` on the run's training tasks,
LoRA adapters where the config's policy asks for them (``peft_config``, the same adapters labkit's
policy makes), and writes (process 0) ``metrics.jsonl`` (TRL's log of every step, ``reward/mean`` and
``time/step`` beside TRL's own figures under ``trl/``) and the final checkpoint in the lab's
format (``checkpoints/step_<steps>/trainable.pt`` and ``COMPLETE``), which the paired
evaluation loads as it loads a labkit run's.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig

from labkit.config import from_dict
from labkit.credit.reshaping import ReshapeConfig
from labkit.env.feedback import FeedbackConfig
from labkit.env.task_sampling import CurriculumSampler, TaskConfig, run_tasks
from labkit.integrations import TRL_LOSS_TYPES
from labkit.integrations.trl import (CurriculumGRPOTrainer, DiDPOTrainer, ForkCreditTrainer,
                                     SandboxReward, task_dataset)
from labkit.policy.forking import ForkCreditConfig
from labkit.policy.loading import PolicyConfig, lora_config, resolve_spec
from labkit.sandbox.config import SandboxConfig
from labkit.sandbox.pool import Sandbox



def grpo_config(cfg: Mapping[str, Any], processes: int, out: Path):
    """TRL's ``GRPOConfig`` for the training config record ``cfg`` (``to_dict(TrainConfig)``)
    on ``processes`` processes: ``tasks_per_step x group_size`` rows per step split over the
    processes, ``num_generations = group_size``, the sampler's temperature, top-p and length,
    AdamW's rate, betas, decay and clipping, the schedule's warm-up at a constant rate, the KL
    coefficient as ``beta`` (k3), the clip range, ``loss.epochs`` as ``num_iterations``, the
    loss aggregation as ``loss_type`` and per-group standardised rewards."""
    s, o, loss = cfg["sampling"], cfg["optim"], cfg["loss"]
    rows = cfg["tasks_per_step"] * s["group_size"]
    if rows % processes:
        raise ValueError(f"tasks_per_step x group_size = {rows} rows do not split over {processes} "
                         "processes; make it a multiple")
    return GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=rows // processes,
        num_generations=s["group_size"], max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"], top_p=s["top_p"], learning_rate=o["lr"],
        adam_beta1=o["betas"][0], adam_beta2=o["betas"][1], weight_decay=o["weight_decay"],
        max_grad_norm=o["grad_clip"], lr_scheduler_type="constant", warmup_steps=o["warmup_steps"],
        beta=loss["kl_coef"], epsilon=loss["eps_low"], epsilon_high=loss["eps_high"],
        num_iterations=loss["epochs"], loss_type=TRL_LOSS_TYPES[loss["agg"]], scale_rewards="group",
        use_cpu=not torch.cuda.is_available(), bf16=False, fp16=False,
        gradient_checkpointing=False, max_steps=cfg["steps"], logging_steps=1, report_to="none",
        save_strategy="no", seed=cfg["seed"], dataloader_num_workers=0, disable_dropout=True)


def metrics_rows(log_history: list[dict], step_s: list[float]) -> list[dict]:
    """TRL's per-step logs as ``metrics.jsonl`` rows: ``reward/mean`` and ``time/step`` (what
    the experiments read) and TRL's own numbers under ``trl/``."""
    logged = [r for r in log_history if "reward" in r]
    return [{"step": i + 1, "reward/mean": r["reward"], "time/step": dt,
             **{f"trl/{k}": v for k, v in r.items() if isinstance(v, (int, float))}}
            for i, (r, dt) in enumerate(zip(logged, step_s))]


def main(argv: list[str] | None = None) -> None:
    """Train ``RUN_DIR``'s config with TRL; process 0 writes the metrics and the checkpoint."""
    p = argparse.ArgumentParser(prog="python -m labkit.integrations.trl_train",
                                description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    run = Path(p.parse_args(argv).run_dir)
    cfg = json.loads((run / "config.json").read_text())
    state = PartialState(cpu=not torch.cuda.is_available())
    model_dir = str(resolve_spec(cfg["policy"]["spec"]))
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tasks = run_tasks(from_dict(TaskConfig, cfg["tasks"]), cfg["seed"], "train")
    reward = SandboxReward(feedback=from_dict(FeedbackConfig, cfg["feedback"]),
                           recipe_name=from_dict(ReshapeConfig, cfg["reshape"]),
                           sandbox=Sandbox(from_dict(SandboxConfig, cfg["sandbox"])), keep=1)
    policy = from_dict(PolicyConfig, cfg["policy"])
    kwargs = dict(model=model, reward_funcs=[reward], train_dataset=task_dataset(tasks),
                  processing_class=tok, args=grpo_config(cfg, state.num_processes, run / "trl"),
                  curriculum=CurriculumSampler() if cfg["curriculum"] else None,
                  peft_config=lora_config(model, policy) if policy.lora else None)
    options = dict(cfg["estimator_options"])
    if cfg["estimator"] == "didpo":
        trainer = DiDPOTrainer(**kwargs, didpo_options=options)
    elif cfg["estimator"] == "didpo_fork":
        trainer = ForkCreditTrainer(**kwargs, fork=from_dict(ForkCreditConfig, cfg["fork"]),
                                    fork_options=options)
    else:
        trainer = CurriculumGRPOTrainer(**kwargs)
    step_s: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            step_s.append(time.perf_counter() - self.t0)

    trainer.add_callback(Clock())
    trainer.train()
    if state.is_main_process:
        with open(run / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in metrics_rows(trainer.state.log_history, step_s))
        ckpt = run / "checkpoints" / f"step_{cfg['steps']:06d}"
        ckpt.mkdir(parents=True, exist_ok=True)
        trained = trainer.accelerator.unwrap_model(trainer.model)
        torch.save({k: v.detach().cpu() for k, v in trained.named_parameters() if v.requires_grad},
                   ckpt / "trainable.pt")  # LoRA: the adapters, named as labkit's policy names them
        (ckpt / "COMPLETE").write_text("")
    state.wait_for_everyone()


if __name__ == "__main__":
    main()
