"""``python -m labkit.bench trl``: labkit's GRPO trainer vs TRL's ``GRPOTrainer``, one run.

Both train the same model from the same weights on the same prompts with the same cheap,
pure-Python reward (so the trainers' own overhead is compared, not the sandbox): same
group size, prompts per step, completion length, learning rate, ``beta = 0``, one update
per batch, token-mean loss (TRL's ``loss_type="dapo"``), group-std advantages. TRL runs
on CPU with ``use_cpu=True, bf16=False, fp16=False`` set explicitly and gradient
checkpointing off (its default is on).

Runs each trainer ``--repeats`` times, alternating (labkit, TRL, TRL, labkit, ...) so that a
change of machine load weighs on both; prints the median seconds per step of each (after
``--warmup`` steps, pooled over its runs), their ratio, and
both runs' mean rewards; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from labkit.config import from_dict
from labkit.env.records import RepairTask
from labkit.sandbox.records import TestSuite
from labkit.loops.trainer import Trainer, TrainConfig
from labkit.policy import tiny
from labkit.policy.loading import TINY_DIR
from labkit.policy.prompts import plain_prompt
from labkit.policy.rollout import SAMPLERS
from labkit.seeding import derive_seed

TARGET = "class"


def cheap_reward(text: str) -> float:
    """Deterministic and cheap: the share of the first 32 characters that are letters or
    spaces, a shape a small model can move within a few steps."""
    head = text[:32]
    return sum(ch.isalpha() or ch == " " for ch in head) / 32 if head else 0.0


def _model_dir(tmp: Path) -> Path:
    if (TINY_DIR / "config.json").is_file():
        return TINY_DIR
    texts = [f"def f{i}(x):\n    return x + {i}\n" for i in range(200)]
    tok = tiny.train_tokenizer(texts, vocab_size=1024)
    model = tiny.init_model(tok, tiny.TinyModelConfig())
    return tiny.save(model, tok, tmp / "random-tiny")


def _tasks(n: int):
    out = []
    for i in range(n):
        code = f"def f{i}(xs):\n    total = 0\n    for x in xs:\n        total += x * {i % 5}\n    return total\n"
        out.append(RepairTask(task_id=f"bench/{i}", problem_id=f"bench/{i}", source="bench", prompt="",
                              buggy_code=code, reference_code=code, tests=TestSuite(), entry_point=f"f{i}"))
    return out


def run_trl(model_dir: Path, prompts: list[str], args, out_dir: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    stamps: list[float] = []
    rewards: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **k):
            stamps.append(time.perf_counter())

    def reward_fn(prompts, completions, **kw):
        r = [cheap_reward(c) for c in completions]
        rewards.extend(r)
        return r

    cfg = GRPOConfig(
        output_dir=str(out_dir), per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group, max_completion_length=args.tokens, learning_rate=args.lr,
        beta=0.0, loss_type="dapo", scale_rewards="group", num_iterations=1,
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        max_steps=args.steps, logging_steps=1, report_to="none", save_strategy="no",
        temperature=1.0, top_p=1.0, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, seed=args.seed, disable_dropout=True,
        shuffle_dataset=False, dataloader_num_workers=0)
    ds = Dataset.from_dict({"prompt": prompts})
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn], args=cfg, train_dataset=ds,
                          processing_class=tok, callbacks=[Clock()])
    t0 = time.perf_counter()
    stamps.append(t0)
    trainer.train()
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"step_s": steps, "mean_reward": statistics.fmean(rewards) if rewards else 0.0,
            "first_reward": statistics.fmean(rewards[: args.prompts * args.group]),
            "last_reward": statistics.fmean(rewards[-args.prompts * args.group:])}


def run_labkit(model_dir: Path, tasks, args, out_dir: Path) -> dict:
    cfg = from_dict(TrainConfig, {
        "run_dir": str(out_dir), "seed": args.seed, "steps": args.steps,
        "tasks_per_step": args.prompts, "estimator": "grpo",
        "policy": {"spec": str(model_dir), "reference": "none"},
        "sampling": {"group_size": args.group, "temperature": 1.0, "top_p": 1.0,
                     "max_new_tokens": args.tokens, "stop_strings": [], "engine": args.engine,
                     "sampler": args.sampler,
                     "batch_size": args.prompts * args.group},
        "tasks": {"source": "records", "eval_tasks": 0},
        "loss": {"kl_coef": 0.0, "epochs": 1, "agg": "token-mean", "dual_clip": None,
                 "micro_batch_size": args.prompts * args.group, "engine": args.update_engine},
        "optim": {"lr": args.lr, "weight_decay": 0.0, "grad_clip": 1.0, "fused": args.fused},
        "eval_every": 0, "checkpoint_every": 10**6, "log_rollouts": 0,
    })
    rewards: list[float] = []

    def reward_fn(tasks, rollouts):
        out = []
        for r in rollouts:
            v = cheap_reward(r.completion)
            rewards.append(v)
            out.append({"r_test": v, "r_pass": float(v >= 1.0)})
        return out

    trainer = Trainer(cfg, train_tasks=tasks, eval_tasks=[], reward_fn=reward_fn)
    stamps = [time.perf_counter()]
    trainer.events.on("on_step_end", lambda **kw: stamps.append(time.perf_counter()))
    trainer.train(progress=False)
    trainer.close()
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    n = args.prompts * args.group
    return {"step_s": steps, "mean_reward": statistics.fmean(rewards),
            "first_reward": statistics.fmean(rewards[:n]), "last_reward": statistics.fmean(rewards[-n:])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.bench trl", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2,
                   help="runs of each trainer, alternated (medians pool their steps)")
    p.add_argument("--engine", choices=["lean", "loop", "generate"], default="lean",
                   help="labkit's sampling engine (SamplingConfig.engine)")
    p.add_argument("--sampler", choices=SAMPLERS, default="race",
                   help="how labkit's decode draws a token (SamplingConfig.sampler)")
    p.add_argument("--update-engine", choices=["lean", "model"], default="lean",
                   help="how labkit's update attends the shared prompts (LossConfig.engine)")
    p.add_argument("--fused", action=argparse.BooleanOptionalAction, default=True,
                   help="labkit's fused AdamW kernel (OptimConfig.fused; TRL's default optimiser is fused too)")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix="labkit-bench-trl-") as tmp:
        tmp = Path(tmp)
        model_dir = _model_dir(tmp)
        tasks = _tasks(args.prompts * args.steps)
        # labkit samples prompts per step with its own seeded RNG; give TRL the prompts
        # in that order, unshuffled, so both see the same prompts at every step
        import random

        order = []
        for step in range(args.steps):
            order += random.Random(derive_seed(args.seed, "tasks", step)).sample(tasks, args.prompts)
        prompts = [plain_prompt(t) for t in order]
        # alternate the two (labkit, TRL, TRL, labkit, ...) so that a change in machine load
        # during the run weighs on both alike; every run starts from the same weights
        labs, trls = [], []
        for rep in range(args.repeats):
            for who in (("labkit", "trl") if rep % 2 == 0 else ("trl", "labkit")):
                if who == "labkit":
                    labs.append(run_labkit(model_dir, tasks, args, tmp / f"labkit{rep}"))
                else:
                    trls.append(run_trl(model_dir, prompts, args, tmp / f"trl{rep}"))
        lab, trl = labs[0], trls[0]
    med = lambda runs: statistics.median(x for r in runs for x in (r["step_s"][args.warmup:] or r["step_s"]))  # noqa: E731
    out = {
        "bench": "trl", "steps": args.steps, "prompts_per_step": args.prompts, "group": args.group,
        "completion_tokens": args.tokens, "model": str(model_dir.name), "repeats": args.repeats,
        "labkit_step_s": round(med(labs), 4), "trl_step_s": round(med(trls), 4),
        "labkit_step_s_per_repeat": [round(med([r]), 4) for r in labs],
        "trl_step_s_per_repeat": [round(med([r]), 4) for r in trls],
    }
    out["ratio"] = round(out["labkit_step_s"] / out["trl_step_s"], 3)
    out["target"] = "ratio <= 0.6 (goal 0.5)"
    out["labkit_mean_reward"] = round(lab["mean_reward"], 4)
    out["trl_mean_reward"] = round(trl["mean_reward"], 4)
    out["labkit_reward_first_last"] = [round(lab["first_reward"], 4), round(lab["last_reward"], 4)]
    out["trl_reward_first_last"] = [round(trl["first_reward"], 4), round(trl["last_reward"], 4)]
    out["torch_threads"] = torch.get_num_threads()
    out["labkit_engine"] = args.engine
    out["labkit_sampler"] = args.sampler
    out["labkit_fused_adamw"] = args.fused
    out["labkit_update_engine"] = args.update_engine
    print(f"labkit {out['labkit_step_s']} s/step, TRL {out['trl_step_s']} s/step "
          f"(median after {args.warmup} warm-up steps, {args.repeats} alternated runs each): ratio {out['ratio']} (target <= 0.6, goal 0.5)")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
