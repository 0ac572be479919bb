"""``accelerate launch [--num_processes N] -m labkit.integrations.trl_run``: DiDPO in TRL.

:class:`~labkit.integrations.trl.DiDPOTrainer` with :class:`~labkit.integrations.trl.SandboxReward`
on labkit's tasks, on as many processes as ``accelerate launch`` starts (one without it).
``--prompts`` is the whole batch's prompt count: each of the ``N`` processes gets
``prompts * group / N`` rows (groups may span processes). Writes ``record.json`` (process 0):
the setup, the training wall time, the machine's load and TRL's log of every step, whose
``didpo/gather_bytes`` and ``didpo/gather_s`` (also listed per step as ``gather_bytes`` and
``gather_s``) are the cost of the completions' all-gather. ``--curriculum`` draws the prompts
with labkit's learnability curriculum (:class:`~labkit.integrations.trl.CurriculumGRPOTrainer`).

``--completions fixed`` replaces sampling with known completions (TRL's ``rollout_func``):
sample ``s`` of a task's group is :func:`fixed_completion` ``(task, s)``, whatever process
holds the row, so runs on any number of processes train on the same batch; their advantages
and weights must agree. ``--dump`` adds, per process, the rows it held at every step
(``rows.<process>.jsonl``: batch rows, completion ids, per-token advantages, rewards,
scored programs and their components, task ids, the curriculum's state after the step) and
process 0's trained weights (``weights.pt``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig

from labkit import provenance
from labkit.env.records import RepairTask
from labkit.env.task_sampling import CurriculumSampler
from labkit.env.tasks import load_tasks
from labkit.integrations.trl import DiDPOTrainer, SandboxReward, task_dataset
from labkit.policy.loading import TINY_DIR, weights_fingerprint

#: The line :func:`fixed_completion` adds as a stray edit.
STRAY_LINE = "CHECKED = True"


def fixed_completion(task: RepairTask, sample: int) -> str:
    """Known completion ``sample`` of ``task``: the reference fix (even samples) or the buggy
    code unchanged (odd ones), with the stray line :data:`STRAY_LINE` appended when
    ``sample // 2`` is odd, in a fenced block. Samples 0 and 2 share the fix and 2 and 3 the
    stray line: the group has anchors whose members earn different rewards."""
    code = task.reference_code if sample % 2 == 0 else task.buggy_code
    code = code.rstrip("\n")
    if sample // 2 % 2:
        code += f"\n\n{STRAY_LINE}"
    return f"```python\n{code}\n```\n"


def fixed_rollout(tasks: dict[str, RepairTask]):
    """TRL ``rollout_func`` returning :func:`fixed_completion` for each row: row ``b`` of
    process ``p`` is batch row ``r = p B + b`` (TRL's order), sample ``r mod G`` of its
    group. ``tasks`` maps each prompt to its task."""

    def rollout(prompts, trainer) -> dict:
        tok = trainer.processing_class
        first = trainer.accelerator.process_index * len(prompts)
        G = trainer.num_generations
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completion_ids = [tok(fixed_completion(tasks[p], (first + b) % G),
                              add_special_tokens=False)["input_ids"] + eos
                          for b, p in enumerate(prompts)]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m labkit.integrations.trl_run",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for record.json (and the dumps)")
    p.add_argument("--model", default="tiny", help="'tiny' or a Hugging Face model folder")
    p.add_argument("--source", default="synthetic", help="labkit task source (load_tasks)")
    p.add_argument("--tasks", type=int, default=6, help="training tasks, cycled")
    p.add_argument("--prompts", type=int, default=3, help="prompts per step, all processes")
    p.add_argument("--group", type=int, default=4, help="completions per prompt (G)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96, help="max_completion_length")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--optim", default=None,
                   help="Hugging Face optimizer name (default: the Trainer's AdamW); the checks "
                        "against one process use sgd, whose step is proportional to the gradient")
    p.add_argument("--feedback", default="dense", help="SandboxReward's feedback regime")
    p.add_argument("--recipe", default="raw", help="SandboxReward's reshaping recipe")
    p.add_argument("--lam", type=float, default=1.0, help="DiDPO's lambda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--completions", choices=("sample", "fixed"), default="sample",
                   help="sample from the model, or the known completions of fixed_completion")
    p.add_argument("--curriculum", action="store_true",
                   help="draw the prompts with labkit's learnability curriculum")
    p.add_argument("--dump", action="store_true",
                   help="write each process's rows per step and process 0's trained weights")
    return p.parse_args(argv)


def _dump_rows(trainer, reward, step: int) -> dict:
    """This process's rows of the last batch: what the comparison of runs reads."""
    c = trainer.last_credit
    own, rows = c["own"], list(c["rows"])[c["own"]]
    lengths = c["mask"][own].sum(1).long().tolist()
    last = reward.history[-1]
    return {"step": step, "process": trainer.accelerator.process_index, "rows": rows,
            "completion_ids": [r.completion_ids for r in c["rollouts"][own]],
            "advantages": [a[:n].tolist() for a, n in zip(c["advantages"][own], lengths)],
            "rewards": c["rewards"][own].tolist(), "codes": last["codes"],
            "components": [dict(x) for x in last["components"]],
            "task_ids": [t.task_id for t in last["tasks"]],
            "curriculum": trainer.curriculum.state_dict() if trainer.curriculum else None}


def command(argv: list[str], processes: int) -> str:
    """The command line that reruns this script with ``argv`` on ``processes`` processes (the
    documented CPU launch for more than one)."""
    import shlex

    script = "-m labkit.integrations.trl_run " + " ".join(shlex.quote(a) for a in argv)
    if processes == 1:
        return f"python {script}"
    return (f"accelerate launch --multi_gpu --num_processes {processes} --num_machines 1 "
            f"--mixed_precision no --dynamo_backend no {script}")


def main(argv: list[str] | None = None) -> dict:
    """Train, write ``record.json`` (process 0), return the record."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    state = PartialState(cpu=not torch.cuda.is_available())
    rows = args.prompts * args.group
    if rows % state.num_processes:
        raise SystemExit(f"--prompts {args.prompts} x --group {args.group} = {rows} rows do not "
                         f"split over {state.num_processes} processes; make it a multiple")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = str(TINY_DIR) if args.model == "tiny" else args.model
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tasks = load_tasks(args.source, "train", n=args.tasks, seed=args.seed)
    dataset = task_dataset(tasks)
    optim = {"optim": args.optim} if args.optim else {}
    cfg = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=rows // state.num_processes,
        num_generations=args.group, max_completion_length=args.max_tokens,
        learning_rate=args.lr, **optim, beta=0.0, loss_type="dapo",
        use_cpu=not torch.cuda.is_available(), bf16=False, fp16=False,
        gradient_checkpointing=False, max_steps=args.steps, logging_steps=1, report_to="none",
        save_strategy="no", temperature=1.0, seed=args.seed, shuffle_dataset=False,
        dataloader_num_workers=0, disable_dropout=True)
    reward = SandboxReward(feedback=args.feedback, recipe_name=args.recipe, keep=args.steps)
    rollout = None
    if args.completions == "fixed":
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental
        rollout = fixed_rollout(dict(zip(dataset["prompt"], tasks)))
    trainer = DiDPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=dataset,
                           processing_class=tok, rollout_func=rollout,
                           didpo_options={"lam": args.lam},
                           curriculum=CurriculumSampler() if args.curriculum else None)
    dumped: list[dict] = []
    if args.dump:
        class Dump(TrainerCallback):
            def on_step_end(self, *a, **k):
                dumped.append(_dump_rows(trainer, reward, len(dumped)))

        trainer.add_callback(Dump())
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    steps = [r for r in trainer.state.log_history if "didpo/gather_bytes" in r]
    record = {
        "command": command(argv, state.num_processes),
        "code_commit": provenance.label(provenance.code_identity()),
        "model_sha256": weights_fingerprint(model_dir), "cpu": provenance.cpu_model(),
        "processes": state.num_processes, "backend": str(state.backend),
        "device": str(state.device), "rows_per_process": rows // state.num_processes,
        "group": args.group, "prompts": args.prompts, "steps": args.steps,
        "completions": args.completions, "model": Path(model_dir).name, "train_s": wall,
        "gather_bytes": [r["didpo/gather_bytes"] for r in steps],
        "gather_s": [r["didpo/gather_s"] for r in steps],
        "step_s": [r.get("step_time") for r in steps],
        "completion_mean_length": [r.get("completions/mean_length") for r in steps],
        "torch_threads": torch.get_num_threads(), "load_avg_1m": os.getloadavg()[0],
        "log_history": trainer.state.log_history}
    if args.dump:
        with open(out / f"rows.{state.process_index}.jsonl", "w") as f:
            f.writelines(json.dumps(d) + "\n" for d in dumped)
    if state.is_main_process:
        if args.dump:
            weights = trainer.accelerator.unwrap_model(trainer.model).state_dict()
            torch.save({k: v.detach().cpu() for k, v in weights.items()}, out / "weights.pt")
        (out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    state.wait_for_everyone()
    return record


if __name__ == "__main__":
    main()
