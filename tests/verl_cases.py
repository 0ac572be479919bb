"""Inputs shared by tests/test_integrations_verl.py and its verl-side subprocess
(tests/verl_side.py): two synthetic tasks, completions to score, and a verl-shaped batch of
eight completions (two groups of four, rows interleaved, right-padded)."""

from labkit.env.tasks import load_tasks

# (row's task index, completion kind, reward): the batch's rows, deliberately not grouped
BATCH = [(0, "reference", 1.0), (1, "buggy", 0.0), (0, "buggy", 0.0), (1, "reference", 1.0),
         (0, "stray", 0.5), (1, "stray", 0.25), (0, "reference", 1.0), (1, "empty", 0.0)]
PAD = 7  # response padding length beyond the longest row


def tasks():
    return load_tasks("synthetic", "train", n=2, seed=0)


def _fenced(code: str) -> str:
    return f"Fixed:\n```python\n{code.rstrip()}\n```\n"


def _text(task, kind: str) -> str:
    if kind == "reference":
        return _fenced(task.reference_code)
    if kind == "buggy":
        return _fenced(task.buggy_code)
    if kind == "stray":  # the fix plus an unrelated edit: a comment line at the top
        return _fenced("# checked\n" + task.reference_code)
    return "I cannot fix this."


def completions() -> list[tuple[str, str]]:
    """(task id, completion text) pairs the reward functions score."""
    ts = tasks()
    return [(t.task_id, _text(t, kind)) for t in ts for kind in ("reference", "buggy", "stray", "empty")]


def batch_rows(tokenizer) -> dict:
    """The hand-made batch: responses ``[B, T]`` right-padded with the pad id, their mask,
    token rewards (the reward on each row's last token), uids and task ids."""
    ts = tasks()
    ids = [tokenizer(_text(ts[k], kind), add_special_tokens=False)["input_ids"] for k, kind, _ in BATCH]
    T = max(map(len, ids)) + PAD
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows = {"responses": [], "mask": [], "token_rewards": [], "uid": [], "task_ids": [],
            "rewards": [r for _, _, r in BATCH]}
    for (k, _, r), row in zip(BATCH, ids):
        rows["responses"].append(row + [pad] * (T - len(row)))
        rows["mask"].append([1] * len(row) + [0] * (T - len(row)))
        rows["token_rewards"].append([0.0] * (len(row) - 1) + [r] + [0.0] * (T - len(row)))
        rows["uid"].append(f"uid-{k}")
        rows["task_ids"].append(ts[k].task_id)
    return rows
