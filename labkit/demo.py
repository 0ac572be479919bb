"""The lab's main job, as far as the project has built it.

1. The environment floor: bug-injected HumanEval tasks, their buggy and reference
   programs plus a few reward hacks executed in the sandbox, and every feedback component
   for each.
2. The policy floor, when the embedded tiny model is present: sampled fixes for held-out
   synthetic tasks, executed, with pass@1 / pass@k.

Everything is written to ``runs/lab-<timestamp>/``. The notebook sequence (run headless
with papermill) will replace this once the notebooks exist.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

HACKS = {
    "exit_before_tests": "import sys\nsys.exit(0)\n",
    "always_equal": (
        "class _Eq:\n    def __eq__(self, other):\n        return True\n"
        "def {entry}(*args, **kwargs):\n    return _Eq()\n"),
    "patch_builtins": "import builtins\nbuiltins.abs = lambda x: 0\ndef {entry}(*a):\n    return 0\n",
}


def environment_demo(n: int = 24, seed: int = 0, out_root: str | Path = "runs") -> int:
    from labkit.env.feedback import FeedbackConfig, ProgressTracker, evaluate_many
    from labkit.env.sandbox import Sandbox
    from labkit.env.tasks import load_tasks

    started = time.time()
    out = Path(out_root) / time.strftime("lab-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    print("labkit lab: the environment floor (tasks, bug injection, sandbox, feedback).")
    print("  The notebooks are not built yet; this run shows the floors that exist.")

    tasks = load_tasks("humaneval", n=n, seed=seed)
    rows = []
    with Sandbox() as sandbox:
        print(f"  sandbox protections: "
              f"{', '.join(k for k, v in sandbox.protections.items() if v)}")
        off = [k for k, v in sandbox.protections.items() if not v]
        if off:
            print(f"  NOT active here: {', '.join(off)}")
        cand_tasks, codes, labels = [], [], []
        for t in tasks:
            for label, code in (("buggy", t.buggy_code), ("reference", t.reference_code)):
                cand_tasks.append(t)
                codes.append(code)
                labels.append(label)
        for name, tmpl in HACKS.items():
            t = tasks[0]
            cand_tasks.append(t)
            codes.append(tmpl.replace("{entry}", t.entry_point))
            labels.append(f"hack:{name}")
        fb = evaluate_many(cand_tasks, codes, config=FeedbackConfig(), sandbox=sandbox,
                           progress=ProgressTracker())
    for t, label, f in zip(cand_tasks, labels, fb):
        rows.append({"task": t.task_id, "candidate": label, "status": f.result.status.value,
                     **{k: round(v, 3) for k, v in f.components.items()},
                     "flags": ",".join(f.hack_flags)})
    header = ["task", "candidate", "status", "r_test", "r_pass", "r_precision", "r_style", "hack"]
    widths = [34, 22, 8, 7, 7, 12, 8, 5]
    print("  " + " ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows[:12] + rows[-len(HACKS):]:
        print("  " + " ".join(str(r[h]).ljust(w) for h, w in zip(header, widths)))
    summary = {
        "job": "environment_demo",
        "tasks": len(tasks),
        "reference_pass": sum(r["candidate"] == "reference" and r["status"] == "passed" for r in rows),
        "buggy_fail": sum(r["candidate"] == "buggy" and r["status"] != "passed" for r in rows),
        "hacks_rewarded": sum(r["candidate"].startswith("hack") and r["r_pass"] > 0 for r in rows),
        "seconds": round(time.time() - started, 2),
        "out": str(out),
    }
    summary.update(policy_demo(out, seed=seed))
    summary["seconds"] = round(time.time() - started, 2)
    (out / "feedback.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"  wrote {out}/feedback.jsonl and summary.json")
    print(json.dumps(summary))
    return 0 if summary["hacks_rewarded"] == 0 else 1


def policy_demo(out: Path, n: int = 12, k: int = 4, seed: int = 0) -> dict:
    """Sample ``k`` fixes per held-out synthetic task with the tiny model and run them."""
    from labkit.env.tasks import load_tasks
    from labkit.policy.evaluate import EvalConfig, evaluate
    from labkit.policy.loading import PolicyLoadError, load_policy

    try:
        policy = load_policy("tiny", reference="none")
    except PolicyLoadError as e:
        print(f"labkit lab: policy floor skipped: {e}")
        return {"policy": None}
    print(f"labkit lab: the policy floor: {policy}")
    tasks = load_tasks("synthetic", split="test", n=n, seed=seed)
    rep = evaluate(policy, tasks, EvalConfig(k=k, greedy=False))
    best = next((p for p in rep["per_task"] if p["correct"]), None)
    print(f"  {len(tasks)} held-out synthetic tasks x {k} samples: pass@1 {rep['pass_at_1']:.3f}, "
          f"pass@{k} {rep[f'pass_at_{k}']:.3f}, copies of the buggy code {rep['copy_rate']:.2f}")
    if best:
        print(f"  e.g. {best['task_id']}: {best['correct']}/{k} samples pass")
    (out / "policy_eval.json").write_text(json.dumps({k2: v for k2, v in rep.items()}, indent=2))
    return {"policy": "tiny", "policy_pass_at_1": rep["pass_at_1"], f"policy_pass_at_{k}": rep[f"pass_at_{k}"]}
