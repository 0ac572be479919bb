"""The labkit command line: ``python -m labkit <command> ...``.

Commands grow floor by floor. Every command prints a human-readable report and, as its
last line, one JSON object that scripts and CI parse. Bad input gives one clear line on
stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SOURCES = ("humaneval", "synthetic", "humanevalpack")
OWN_PARSERS = {"paired": "labkit.experiments.paired"}
"""Commands that parse their own arguments: the module whose ``build_parser`` and ``main``
they are (their options come after the run folders)."""


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status ``status`` (2: bad input; 130:
    stopped by Ctrl-C)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in one line (the usage is one ``--help`` away)."""

    def error(self, message: str):
        command = self.prog if self.prog.startswith("python") else f"python -m {self.prog}"
        self.exit(2, f"{self.prog}: error: {message} (see {command} --help)\n")


def _emit(obj: dict) -> None:
    print(json.dumps(obj, sort_keys=False, default=str), flush=True)


def _load(args) -> list:
    from labkit.env.tasks import load_tasks

    if args.source == "humanevalpack" and not args.path:
        raise CLIError("--source humanevalpack needs --path FILE (a HumanEvalPack-format JSONL)")
    if args.source == "synthetic" and not args.n:
        raise CLIError("--source synthetic is unlimited: pass --n N (the number of problems)")
    if args.path and not Path(args.path).is_file():
        raise CLIError(f"--path {args.path!r}: no such file")
    try:
        return load_tasks(args.source, split=args.split, n=args.n, seed=args.seed, path=args.path)
    except (ValueError, FileNotFoundError) as e:
        raise CLIError(str(e)) from None


def _load_balanced(args) -> list:
    """``args.n`` tasks of the split with at most ``args.per_template`` per template."""
    from labkit.env.balanced import balanced_synthetic

    try:
        return balanced_synthetic(args.split, args.n, args.per_template, seed=args.seed)
    except ValueError as e:
        raise CLIError(str(e)) from None


# ----------------------------------------------------------------------------- tasks


def cmd_tasks_validate(args) -> int:
    from labkit.env.tasks import validate_tasks

    tasks = _load(args)
    report = validate_tasks(tasks)
    by_kind: dict[str, int] = {}
    for t in tasks:
        for k in t.bug_kinds:
            by_kind[k] = by_kind.get(k, 0) + 1
    print(f"{report['tasks']} tasks from {args.source}"
          f"{' (' + args.split + ')' if args.split else ''}: "
          f"reference passes {report['reference_pass']}, buggy fails {report['buggy_fail']}")
    for k, v in sorted(by_kind.items()):
        print(f"  {k:18s} {v}")
    _emit(report)
    return 0 if not report["failures"] else 1


def cmd_tasks_ship(args) -> int:
    from labkit.env.tasks import ship, shipped_specs

    specs = shipped_specs(args.out)
    for log in args.log:
        try:
            specs += [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as e:
            raise CLIError(f"{log}: cannot read it as the JSONL spec log $LABKIT_TASK_LOG "
                           f"writes ({e})") from None
    manifest = ship(specs, args.out, progress=True)
    print(f"shipped {len(manifest['lists'])} task lists "
          f"({sum(e['tasks'] for e in manifest['lists'])} tasks) to {args.out or 'data/tasks'}")
    return 0


def cmd_tasks_overlap(args) -> int:
    from labkit.env.overlap import overlap_report
    from labkit.env.tasks import synthetic_problems

    if args.source != "synthetic":
        raise CLIError(f"tasks overlap compares generated problems: --source synthetic only "
                       f"(got {args.source!r})")
    if args.split == "train":
        raise CLIError("--split must be a held-out split (val, test or in_template), not train")
    if args.split == args.against:
        raise CLIError(f"--split and --against are both {args.split!r}; compare two splits")
    train = synthetic_problems(args.against, args.train_n, seed=args.seed)
    held = synthetic_problems(args.split, args.n or 400, seed=args.seed)
    rep = overlap_report(train, held, split=args.split)
    manifest = Path(args.model, "manifest.json") if args.model else None
    if manifest is not None and manifest.is_file():
        sft = set(json.loads(manifest.read_text()).get("sft_templates", []))
        rep["sft_templates"] = len(sft)
        rep["sft_shared_templates"] = len({h.template for h in held} & sft)
    rep["against"] = args.against
    print(f"{rep['problems']} {args.split} problems vs {rep['train_problems']} {args.against} "
          f"problems (synthetic, seed {args.seed}):")
    print(f"  solved by a training reference: {rep['solved_by_train_frac']:.1%}")
    print(f"  text similarity to the nearest training problem: median "
          f"{rep['median_similarity']:.3f}, max {rep['max_similarity']:.3f}")
    print(f"  function name also in training: {rep['shared_names_frac']:.1%}; templates shared: "
          f"{rep['shared_templates']} of {rep['held_templates']}")
    if "sft_shared_templates" in rep:
        print(f"  templates shared with the model's SFT data: {rep['sft_shared_templates']}")
    rep.pop("solved_by_train")
    _emit(rep)
    return 0


def cmd_tasks_show(args) -> int:
    tasks = {t.task_id: t for t in _load(args)}
    if args.task not in tasks:
        raise CLIError(f"unknown task {args.task!r} in source {args.source}; "
                       f"e.g. {', '.join(list(tasks)[:3])}")
    t = tasks[args.task]
    print(t.buggy_code)
    _emit({k: v for k, v in t.to_dict().items() if k not in ("tests", "public_tests", "reference_code")})
    return 0


# ----------------------------------------------------------------------------- sandbox


def _read_code(path_text: str, max_bytes: int) -> str:
    """The candidate file's text, or a CLIError naming the problem: missing, larger than the
    sandbox's ``max_code_bytes`` (only that much is ever read), binary, or not UTF-8."""
    code_path = Path(path_text)
    if not code_path.is_file():
        raise CLIError(f"--code {path_text!r}: no such file")
    with code_path.open("rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise CLIError(f"--code {path_text!r}: larger than {max_bytes} bytes, the sandbox's "
                       "limit (SandboxConfig.max_code_bytes); pass a smaller Python file")
    if b"\0" in data:
        raise CLIError(f"--code {path_text!r}: a binary file (it holds NUL bytes), not Python "
                       "source; pass a .py text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CLIError(f"--code {path_text!r}: not UTF-8 text (byte {e.start}); pass a Python "
                       "source file saved as UTF-8") from None


def cmd_sandbox_run(args) -> int:
    from labkit.sandbox.records import Candidate
    from labkit.sandbox.pool import Sandbox
    from labkit.sandbox.config import SandboxConfig

    config = SandboxConfig()
    code = _read_code(args.code, config.max_code_bytes)
    code_path = Path(args.code)
    tasks = {t.task_id: t for t in _load(args)}
    task = tasks.get(args.task)
    if task is None:
        known = ", ".join(list(tasks)[:3])
        raise CLIError(f"unknown task {args.task!r} in source {args.source}; task ids look like: {known}")
    try:  # bounded: at most max_code_bytes of source
        compile(code, str(code_path), "exec")
    except SyntaxError as e:
        # Still run it: a syntax error is a graded outcome (status 'error'), but say so.
        print(f"warning: {code_path}: invalid code (line {e.lineno}: {e.msg})", file=sys.stderr)
    except (ValueError, RecursionError, MemoryError) as e:
        print(f"warning: {code_path}: invalid code ({type(e).__name__}: {e})", file=sys.stderr)
    with Sandbox(config) as sb:
        result = sb.run(Candidate(code=code, tests=task.tests, entry_point=task.entry_point,
                                  id=task.task_id))
        out = result.to_dict()
        out["task"] = task.task_id
    print(f"{task.task_id}: {result.status.value} ({result.passed}/{result.total} tests)"
          f"{'  flags: ' + ','.join(result.flags) if result.flags else ''}")
    _emit(out)
    return 0 if result.ok else 1


# ----------------------------------------------------------------------------- policy


def cmd_pretrain_tiny(args) -> int:
    from labkit.config import ConfigError, apply_overrides
    from labkit.policy.pretrain import PretrainConfig, pretrain_tiny, remeasure_quality

    try:
        cfg = apply_overrides(PretrainConfig(), args.set)
    except (ConfigError, ValueError) as e:
        raise CLIError(str(e)) from None
    if args.evaluate_only:
        try:
            manifest = remeasure_quality(cfg, argv=[a for a in sys.argv[2:] if a != "--evaluate-only"])
        except FileNotFoundError as e:
            raise CLIError(str(e)) from None
    else:
        manifest = pretrain_tiny(cfg, argv=sys.argv[2:])
    q = manifest["quality"]
    _emit({"out": cfg.out, "parameters": manifest["model"]["parameters"],
           "sft_s": manifest["timings_s"]["sft_s"],
           "synthetic_pass_at_1": q["synthetic_test"]["pass_at_1"],
           "synthetic_pass_at_8": q["synthetic_test"].get("pass_at_8"),
           "humaneval_pass_at_1": q["humaneval_test"]["pass_at_1"]})
    return 0


def eval_config(args):
    """``eval``'s :class:`~labkit.policy.evaluate.EvalConfig`: its defaults, with the flags
    given (one default temperature: ``EvalConfig.temperature``, the trainer's evaluations')."""
    from labkit.policy.evaluate import EvalConfig

    flags = {"k": args.k, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens}
    return EvalConfig(**{k: v for k, v in flags.items() if v is not None})


def cmd_eval(args) -> int:
    from labkit.sandbox.pool import Sandbox
    from labkit.env.tasks import load_tasks
    from labkit.policy.evaluate import evaluate
    from labkit.policy.loading import PolicyLoadError, check_completion_length, load_policy

    cfg = eval_config(args)
    try:
        cfg.validate()
        check_completion_length(args.policy, cfg.max_new_tokens, "--max-new-tokens")
    except ValueError as e:
        raise CLIError(str(e)) from None
    if args.per_template is not None and args.source != "synthetic":
        raise CLIError(f"--per-template needs --source synthetic (its tasks have templates), "
                       f"not {args.source!r}")
    if args.per_template is not None and args.per_template < 1:
        raise CLIError(f"--per-template must be >= 1 (tasks per template), got {args.per_template}")
    try:
        policy = load_policy(args.policy, reference="none")
    except PolicyLoadError as e:
        raise CLIError(str(e)) from None
    if args.source == "synthetic" and not args.n:
        args.n = 200
    if args.per_template is not None:
        tasks = _load_balanced(args)
    else:
        tasks = _load(args)
    if not tasks:
        raise CLIError(f"no {args.source} tasks in split {args.split!r}")
    # out-of-distribution rows beside the main one: bug-injected HumanEval (test split) and,
    # when a file is given, HumanEvalFix's human-written bugs
    ood: dict[str, list] = {}
    if args.ood and args.source == "synthetic":
        ood["humaneval_injected"] = load_tasks("humaneval", split="test", seed=args.seed)
    if args.humanevalfix:
        if not Path(args.humanevalfix).is_file():
            raise CLIError(f"--humanevalfix {args.humanevalfix!r}: no such file")
        ood["humanevalfix"] = load_tasks("humanevalpack", path=args.humanevalfix)
    with Sandbox() as sb:
        rep = evaluate(policy, tasks, cfg, sandbox=sb, progress=True)
        ood_reps = {name: evaluate(policy, ts, cfg, sandbox=sb, progress=True)
                    for name, ts in ood.items() if ts}
    import pandas as pd

    table = pd.DataFrame(rep["per_task"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "eval_per_task.csv", index=False)
    cap = f", at most {args.per_template} per template" if args.per_template else ""
    print(f"{rep['tasks']} {args.source} {args.split} tasks{cap}, {cfg.k} samples each at "
          f"T={cfg.temperature}")
    print(pd.Series(rep["by_bug_kinds"], name="pass@1 by bug kind").to_string())
    rows = {f"{args.source}/{args.split}": rep, **ood_reps}
    keys = ("tasks", "pass_at_1", f"pass_at_{cfg.k}", "token_entropy", "zero_var_groups_frac",
            "name_kept_rate")
    print(pd.DataFrame({name: {k: r.get(k) for k in keys} for name, r in rows.items()}).T
          .to_string(float_format=lambda x: f"{x:.3f}"))
    summary = {k: v for k, v in rep.items() if k != "per_task"}
    summary["per_template"] = args.per_template
    summary["out_of_distribution"] = {name: {k: r.get(k) for k in keys} for name, r in ood_reps.items()}
    (out / "eval_summary.json").write_text(json.dumps(summary, indent=2))
    print(f"per-task table: {out / 'eval_per_task.csv'}")
    _emit(summary)
    return 0


# ----------------------------------------------------------------------------- train


def _train_config(args):
    """The config ``train`` runs (a new run's, or a resumed run's with its accepted changes)
    and what the resume changes (``{}`` for a new run); config-time errors as CLIError."""
    from labkit.config import ConfigError, apply_overrides, load_yaml
    from labkit.loops.trainer import TrainConfig

    try:
        if args.resume:
            from labkit.loops.resume import resume_config

            if not Path(args.resume, "config.json").is_file():
                raise CLIError(f"--resume {args.resume!r}: not a run folder (no config.json)")
            if args.config:
                raise CLIError(f"--resume reads the run's own config ({args.resume}/config.json); "
                               "drop --config and pass changes with --set")
            return resume_config(args.resume, args.set)
        if args.config:
            return load_yaml(TrainConfig, args.config, args.set), {}
        return apply_overrides(TrainConfig(), args.set), {}
    except (ConfigError, ValueError) as e:
        raise CLIError(str(e)) from None


def _forget_run(run, held_before: bool) -> None:
    """Remove what a new run wrote before its first step (its files, checkpoints, tracker
    folders, running mark, and the folder itself when it was made for it and is empty)."""
    run.clear()
    run.file(run.RUNNING).unlink(missing_ok=True)
    if not held_before and run.path.is_dir() and not any(run.path.iterdir()):
        run.path.rmdir()


class _Stop:
    """Ctrl-C during training: the first asks the trainer to stop after the step it is in (the
    step is logged and checkpointed); a second stops at once (KeyboardInterrupt)."""

    def __init__(self, trainer):
        self.trainer, self.asked, self._old = trainer, False, None

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread() and self.trainer.world == 1:
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True
        self.trainer.request_stop()
        print("\nstopping when the step under way ends (it is logged and checkpointed); Ctrl-C "
              "again stops at once", flush=True)

    def __exit__(self, *exc):
        if self._old is not None:
            import signal

            signal.signal(signal.SIGINT, self._old)
        return False


def cmd_train(args) -> int:
    from labkit.runs.events import RunFolder
    from labkit.loops.resume import checkpoint_step
    from labkit.runs.history import record_changes
    from labkit.runs.trackers import TrackerError
    from labkit import provenance
    from labkit.loops.trainer import CheckpointError, RunFolderError, Trainer, latest_checkpoint
    from labkit.policy.loading import PolicyLoadError

    cfg, changes = _train_config(args)
    resume = f"python -m labkit train --resume {cfg.run_dir}"
    if args.quiet:  # nor the model loader's bar
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    from labkit.loops.preflight import check_run, first_process

    try:
        if args.resume and latest_checkpoint(cfg.run_dir) is not None:  # before anything loads
            provenance.refuse_drift(cfg.run_dir, "resume", args.allow_code_drift)
        train_tasks, eval_tasks = check_run(cfg, resume=bool(args.resume), overwrite=args.overwrite)
    except (ValueError, RunFolderError, TrackerError, provenance.CodeDriftError) as e:
        raise CLIError(str(e)) from None
    run = RunFolder(cfg.run_dir)
    held_before, trainer, start, undo, entered, stop = run.holds_run(), None, 0, None, False, None
    try:
        try:
            trainer = Trainer(cfg, train_tasks=train_tasks, eval_tasks=eval_tasks,
                              overwrite=args.overwrite)
            if args.resume:
                start = trainer.resume(allow_code_drift=args.allow_code_drift)
                if changes and trainer.is_main:
                    undo = record_changes(trainer.run, cfg, changes, start)
            entered = True
            with _Stop(trainer) as stop:
                trainer.train(progress=not args.quiet)
        finally:
            if trainer is not None:
                trainer.close()
    except BaseException as e:
        stepped = trainer is not None and trainer.step > start
        if not stepped and undo is not None:
            undo()
        if not stepped and not args.resume and (entered or not held_before) and first_process():
            _forget_run(run, held_before)
        if isinstance(e, KeyboardInterrupt):
            if not stepped and not args.resume:
                raise CLIError("stopped before the first step; nothing was saved", 130) from None
            ckpt = checkpoint_step(run.path)
            at = (f"stopped at step {ckpt} (the last checkpoint)" if ckpt
                  else "stopped before the first checkpoint (a resume starts at step 0)")
            raise CLIError(f"{at}; resume with {resume}", 130) from None
        if isinstance(e, (CheckpointError, RunFolderError, TrackerError, PolicyLoadError,
                          provenance.CodeDriftError)):
            raise CLIError(str(e)) from None
        raise
    if stop is not None and stop.asked and trainer.step < cfg.steps:
        if trainer.step == 0 and not args.resume and trainer.is_main:
            _forget_run(run, held_before)
            raise CLIError("stopped before the first step; nothing was saved", 130)
        _emit({"run_dir": cfg.run_dir, "steps": trainer.step, "stopped": True})
        raise CLIError(f"stopped at step {trainer.step}; resume with {resume}", 130)
    rows = trainer.run.read("metrics.jsonl")
    evals = trainer.run.read("eval.jsonl")
    _emit({"run_dir": cfg.run_dir, "steps": trainer.step,
           "reward_mean_last": rows[-1]["reward/mean"] if rows else None,
           "eval_pass_at_1_first": evals[0]["eval/pass_at_1"] if evals else None,
           "eval_pass_at_1_last": evals[-1]["eval/pass_at_1"] if evals else None})
    return 0


# ----------------------------------------------------------------------------- runs


def cmd_docs(args) -> int:
    from labkit.docs import findings

    stale = findings.write_all(check=args.check)
    for page in stale:
        print(f"{page.relative_to(findings.ROOT)}: {'stale' if args.check else 'written'}")
    if args.check and stale:
        print("run `python -m labkit docs` and commit the pages", file=sys.stderr)
        return 1
    rel = [str(p.relative_to(findings.ROOT)) for p in findings.GENERATED_PAGES]
    _emit({"check": args.check, "pages": rel,
           "stale" if args.check else "written": [str(p.relative_to(findings.ROOT)) for p in stale]})
    return 0


def cmd_runs(args) -> int:
    from labkit.runs.table import format_table, runs_table

    root = Path(args.dir)
    if not root.is_dir():
        raise CLIError(f"{args.dir!r}: no such folder (run folders live under runs/ by default)")
    table = runs_table(root)
    if args.json:
        _emit(table)
        return 0
    print(format_table(table))
    counts = {s: sum(r["status"] == s for r in table["runs"])
              for s in ("running", "finished", "stopped")}
    _emit({"dir": table["dir"], "runs": len(table["runs"]), **counts,
           "differing": table["differing"]})
    return 0


# ----------------------------------------------------------------------------- mucode


def cmd_mucode(args) -> int:
    from labkit.config import ConfigError, apply_overrides, load_yaml
    from labkit.mucode.loop import MucodeConfig, run_mucode
    from labkit.policy.loading import PolicyLoadError

    try:
        cfg = (load_yaml(MucodeConfig, args.config, args.set) if args.config
               else apply_overrides(MucodeConfig(), args.set))
        cfg.validate()
    except (ConfigError, ValueError) as e:
        raise CLIError(str(e)) from None
    try:
        result = run_mucode(cfg)
    except PolicyLoadError as e:
        raise CLIError(str(e)) from None
    last = result.rows[-1] if result.rows else {}
    evals = result.evals
    _emit({"run_dir": cfg.run_dir, "iterations": len(result.rows),
           "collect_pass_final_last": last.get("collect/pass/final"),
           "expert_pass_frac_last": last.get("expert/pass_frac"),
           "eval_first": {k: v for k, v in (evals[0] if evals else {}).items() if "/final" in k},
           "eval_last": {k: v for k, v in (evals[-1] if evals else {}).items() if "/final" in k}})
    return 0


# ----------------------------------------------------------------------------- experiments


def cmd_experiment(args) -> int:
    from labkit import experiments
    from labkit.config import ConfigError, apply_overrides
    from labkit.experiments.config import ReuseError, smoke_config
    from labkit.experiments.pages import PublishError
    from labkit.experiments.stats import verdict
    from labkit.experiments.trl_engine import EngineError
    from labkit.loops.checkpoints import RunFolderError
    from labkit.provenance import CodeDriftError

    try:
        module = experiments.load(args.name)
        base = smoke_config(module) if args.smoke else module.Config()
        exp = apply_overrides(base, args.set)
    except (ConfigError, ValueError) as e:
        raise CLIError(str(e)) from None
    try:
        md = module.run(exp)
    except (CodeDriftError, PublishError, ReuseError, EngineError, RunFolderError) as e:
        raise CLIError(str(e)) from None
    print(md.read_text())
    results = json.loads(md.with_suffix(".json").read_text())
    groups = {"": results} if "methods" in results else {f"{k}/": v for k, v in results.get("regimes", {}).items()}
    summary = {}
    for prefix, res in groups.items():
        for m, r in res.get("methods", {}).items():
            if "delta" in r:
                summary[f"{prefix}{m}_delta"] = round(r["delta"]["mean"], 4)
            if r.get("paired_change"):
                summary[f"{prefix}{m}_paired_change"] = round(r["paired_change"]["mean"], 4)
                summary[f"{prefix}{m}_verdict"] = verdict(r["paired_change"])
    _emit({"experiment": args.name, "report": str(md), **summary})
    return 0


def cmd_results(args) -> int:
    from labkit.experiments import EXPERIMENTS
    from labkit.experiments.pages import restat

    done = []
    for f in args.files:
        path = Path(f)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise CLIError(f"{f}: cannot read a results JSON ({e})") from None
        if str(data.get("experiment", "")).split("/")[0] not in EXPERIMENTS:
            print(f"{f}: not an experiment's results; left alone")
            continue
        done.append(str(restat(path)))
        print(f"{f}: statistics computed again; {done[-1]} rendered")
    _emit({"action": args.action, "pages": done})
    return 0


# ----------------------------------------------------------------------------- lab


def cmd_lab(args) -> int:
    """The lab's main job: the notebook sequence run headless with papermill into
    ``runs/lab-<UTC timestamp>/`` (executed notebooks, their JSON numbers, report.html)."""
    from labkit.lab import LabError, run_lab

    only = [x for part in (args.only or []) for x in part.split(",") if x.strip()]
    print(f"labkit lab: running the notebooks{' (smoke budget)' if args.smoke else ''} "
          "with papermill (kernel python3, --cwd notebooks)")
    try:
        summary = run_lab(out=args.out, smoke=args.smoke, only=only or None, record_to=args.record,
                          jobs=args.jobs)
    except LabError as e:
        raise CLIError(str(e)) from None
    out = Path(summary["out"])
    print(f"done in {summary['seconds']:.0f} s. Look at:")
    print(f"  {out / 'report.html'}   (every notebook, figures inline; open it in a browser)")
    print(f"  {out}/NN_*.ipynb          (the executed notebooks)")
    print(f"  {out}/NN_*.json           (the key numbers of each notebook)")
    print("  make jupyter                       (the notebooks live, with their widgets)")
    if summary["failed"]:
        print(f"FAILED: {', '.join(summary['failed'])} (the error is in the executed notebook)")
    _emit({"out": str(out), "report": summary.get("report"), "seconds": summary["seconds"],
           "cpu_seconds": summary["cpu_seconds"],
           "notebooks": {r["notebook"]: {"status": r["status"], "seconds": r["seconds"],
                                         "cpu_seconds": r["cpu_seconds"]}
                         for r in summary["notebooks"]},
           "failed": summary["failed"]})
    return 1 if summary["failed"] else 0


# ----------------------------------------------------------------------------- parser


def _own_parser(command: str, argv: list[str]) -> int:
    """Run a command of :data:`OWN_PARSERS` once its run folders are known to be run folders."""
    import importlib
    import types

    module = importlib.import_module(OWN_PARSERS[command])
    parser = module.build_parser()
    parser.error = types.MethodType(_Parser.error, parser)  # one line, as every command's
    args = parser.parse_args(argv)
    for run in getattr(args, "runs", []):
        if not Path(run, "config.json").is_file():
            raise CLIError(f"{command}: {run!r} is not a run folder (no config.json)")
    return module.main(argv)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="labkit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def task_args(sp, *, split_default=None):
        sp.add_argument("--source", choices=SOURCES, default="humaneval")
        sp.add_argument("--path", help="HumanEvalPack-format JSONL (for --source humanevalpack)")
        sp.add_argument("--split", choices=("train", "val", "test", "in_template"),
                        default=split_default)
        sp.add_argument("--n", type=int, default=None, help="number of problems (synthetic: required size)")
        sp.add_argument("--seed", type=int, default=0, help="seed of task generation and bug injection")

    tasks = sub.add_parser("tasks", help="repair tasks").add_subparsers(dest="action", required=True)
    v = tasks.add_parser("validate", help="execute every task's reference and buggy code")
    task_args(v)
    v.set_defaults(func=cmd_tasks_validate)
    o = tasks.add_parser("overlap", help="how far a held-out synthetic split is from training")
    o.add_argument("--source", choices=SOURCES, default="synthetic")
    o.add_argument("--split", choices=("val", "test", "in_template"), default="test")
    o.add_argument("--n", type=int, default=400, help="held-out problems")
    o.add_argument("--train-n", type=int, default=2000, help="training problems")
    o.add_argument("--against", choices=("train", "val"), default="train",
                   help="the split trained on (val: the RL-on-new-templates setting)")
    o.add_argument("--seed", type=int, default=0, help="seed of problem generation")
    o.add_argument("--model", default=str(Path(__file__).resolve().parent.parent / "data" / "models" / "tiny"),
                   help="model folder whose manifest lists its SFT templates ('' = none)")
    o.set_defaults(func=cmd_tasks_overlap)
    sh = tasks.add_parser("ship", help="build the shipped task lists (data/tasks) again: those "
                          "already shipped, and those of spec logs ($LABKIT_TASK_LOG)")
    sh.add_argument("--log", action="append", default=[], help="a spec log to add (repeatable)")
    sh.add_argument("--out", default=None, help="folder (default data/tasks)")
    sh.set_defaults(func=cmd_tasks_ship)
    s = tasks.add_parser("show", help="print one task")
    task_args(s)
    s.add_argument("--task", required=True, help="task id, e.g. humaneval/HumanEval-0/bug0")
    s.set_defaults(func=cmd_tasks_show)

    sb = sub.add_parser("sandbox", help="the code sandbox").add_subparsers(dest="action", required=True)
    r = sb.add_parser("run", help="run one candidate against one task's tests")
    task_args(r)
    r.add_argument("--task", required=True, help="task id, e.g. humaneval/HumanEval-0/bug0")
    r.add_argument("--code", required=True, help="file holding the candidate program")
    r.set_defaults(func=cmd_sandbox_run)

    pt = sub.add_parser("pretrain-tiny", help="train the embedded tiny model from scratch")
    pt.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override PretrainConfig fields, e.g. --set sft.time_budget_s=60")
    pt.add_argument("--evaluate-only", action="store_true",
                    help="do not train: measure the model already in --set out=DIR again (e.g. at "
                         "another eval_temperature) and rewrite its manifest's quality")
    pt.set_defaults(func=cmd_pretrain_tiny)

    ev = sub.add_parser("eval", help="held-out pass@k of a policy")
    ev.add_argument("--policy", default="tiny", help="'tiny' or a local HF model folder")
    task_args(ev, split_default="test")
    ev.add_argument("--k", type=int, default=None,
                    help="samples per task (default: EvalConfig.k)")
    ev.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature (default: EvalConfig.temperature, the trainer's "
                         "eval_temperature too)")
    ev.add_argument("--no-ood", dest="ood", action="store_false",
                    help="skip the out-of-distribution row (bug-injected HumanEval)")
    ev.add_argument("--humanevalfix", metavar="FILE",
                    help="also evaluate on a HumanEvalPack-format file (HumanEvalFix)")
    ev.add_argument("--per-template", type=int, default=None, metavar="CAP",
                    help="synthetic: at most CAP tasks of any one template, the --n tasks filled "
                         "from further down the stream (default: the split's first --n as drawn)")
    ev.add_argument("--max-new-tokens", type=int, default=None,
                    help="longest completion in tokens (default: EvalConfig.max_new_tokens)")
    ev.add_argument("--out", default="runs/eval", help="folder of the per-task table and summary")
    ev.set_defaults(func=cmd_eval)

    tr = sub.add_parser("train", help="RL training (GRPO and friends) from a config")
    tr.add_argument("--config", help="YAML file with TrainConfig fields")
    tr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field, e.g. --set loss.kl_coef=0.01 --set steps=50")
    tr.add_argument("--resume", metavar="RUN_DIR",
                    help="resume a run from its last checkpoint; --set may change steps, "
                         "checkpoint_every, keep_checkpoints, log_rollouts, report_to and "
                         "trackers.* (recorded in config_history.jsonl), and nothing else")
    tr.add_argument("--allow-code-drift", action="store_true",
                    help="with --resume: continue a run trained by other code (another commit or "
                         "other uncommitted changes; default: refuse)")
    tr.add_argument("--quiet", action="store_true", help="no progress bars")
    tr.add_argument("--overwrite", action="store_true",
                    help="replace a run already in run_dir (default: refuse)")
    tr.set_defaults(func=cmd_train)

    rn = sub.add_parser("runs", help="list run folders side by side (status, steps, reward, "
                                     "pass@1, the config fields that differ)")
    rn.add_argument("dir", nargs="?", default="runs", help="folder holding run folders")
    rn.add_argument("--json", action="store_true", help="one JSON object (every row) for scripts")
    rn.set_defaults(func=cmd_runs)

    mc = sub.add_parser("mucode", help="muCODE expert iteration (multi-turn, learned verifier)")
    mc.add_argument("--config", help="YAML file with MucodeConfig fields")
    mc.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field, e.g. --set iterations=1 --set verifier.loss=bce")
    mc.set_defaults(func=cmd_mucode)

    from labkit.experiments import EXPERIMENTS

    ex = sub.add_parser("experiment", help="multi-seed comparisons with paired held-out "
                                           "evaluation, controls and verdicts (runs/results/ by "
                                           "default; --set out=docs/results publishes)")
    ex.add_argument("name", help=f"the experiment: {', '.join(EXPERIMENTS)}")
    ex.add_argument("--smoke", action="store_true",
                    help="the experiment's tiny budget: the whole pipeline in minutes; its page "
                         "says its numbers decide nothing")
    ex.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override the experiment's config, e.g. --set steps=30 --set seeds=[0,1,2]")
    ex.set_defaults(func=cmd_experiment)

    rs = sub.add_parser("results", help="committed results: compute their statistics again "
                                        "(restat) from their per-task data, without training")
    rs.add_argument("action", choices=["restat"], help="restat: every change, claim and control "
                                                       "read again with this code's statistics")
    rs.add_argument("files", nargs="+", help="results JSON files (e.g. docs/results/*.json)")
    rs.set_defaults(func=cmd_results)

    dc = sub.add_parser("docs", help="write the generated tables of the README and docs/ (results "
                                     "findings, benchmarks, model quality, the reference) from "
                                     "the records and the code")
    dc.add_argument("--check", action="store_true", help="write nothing; fail when a page is stale")
    dc.set_defaults(func=cmd_docs)

    sub.add_parser("paired", help="start vs final checkpoint of runs on the same held-out tasks "
                                  "(paired); options after the run folders")

    lab = sub.add_parser("lab", help="run the notebook sequence headless (papermill) and "
                                     "write runs/lab-<timestamp>/ with an HTML report")
    lab.add_argument("--smoke", action="store_true", help="the tiny CI budget of every notebook")
    lab.add_argument("--only", action="append", metavar="NN[,NN]",
                     help="run only these notebooks, by number or name, e.g. --only 00,02")
    lab.add_argument("--out", help="output folder (default runs/lab-<UTC timestamp>)")
    lab.add_argument("--record", metavar="FILE",
                     help="append the notebooks' times and the machine's facts to FILE (JSON lines; "
                          "docs/benchmarks/lab.jsonl feeds the README's minutes)")
    lab.add_argument("--jobs", type=int, default=1, metavar="N",
                     help="notebooks run at once, each in its own kernel (default 1; more cores "
                          "finish sooner, but the times are then not recorded)")
    lab.set_defaults(func=cmd_lab)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] and argv[0] in OWN_PARSERS:
            return _own_parser(argv[0], argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except CLIError as e:
        print(f"labkit: {'error: ' if e.status == 2 else ''}{e}", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:
        print("labkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
