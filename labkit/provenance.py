"""Which code, libraries and machine made a run, and the rule that refuses to mix runs of
other code.

Every run folder holds ``provenance.json``: the code it started under (:func:`code_identity`:
the git commit, whether the files that decide a run differed from it, and a hash of those
differences, whose patch is kept beside as ``provenance.diff``), the library versions, the CPU,
the starting weights when an experiment adds them, and one such snapshot per resume. The rule
(:func:`code_drift`): a run is reused, resumed or paired with new runs only by the same code
(the same commit and the same uncommitted changes, none for a clean tree); otherwise the
refusal names what differs, and ``allow_code_drift`` is the explicit way through.

Only the files that decide what a run does count towards "dirty" (:data:`CODE_PATHS`: the
package, the shipped model and task lists, the pinned dependencies); pages and notes written
into ``docs/`` do not. No module here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

from labkit.machine import run_own_session

ROOT = Path(__file__).resolve().parents[1]
"""The checkout the package runs from (its git work tree, when it is one)."""
CODE_PATHS = ("labkit", "data", "pyproject.toml", "constraints.txt")
"""What decides a run's result, relative to :data:`ROOT`: uncommitted changes here make a tree
dirty; elsewhere (docs, notebooks, tests) they do not."""
FILE = "provenance.json"
"""The record in each run folder."""
DIFF_FILE = "provenance.diff"
"""The uncommitted patch a dirty run started under (tracked changes; untracked files listed
with their hashes), so its code can be rebuilt."""
LIBRARIES = ("torch", "transformers", "peft", "trl", "accelerate", "numpy", "tokenizers")
"""Library versions recorded with every run."""


class CodeDriftError(RuntimeError):
    """Runs of different code were about to be mixed; the message names the difference and the
    way through (``allow_code_drift``)."""


def _git(*args: str, root: Path = ROOT) -> str | None:
    try:
        p = run_own_session(["git", *args], cwd=root, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.decode("utf-8", "replace") if p.returncode == 0 else None


def _patch(root: Path = ROOT) -> tuple[str, list[str]] | None:
    """The uncommitted changes under :data:`CODE_PATHS`: the tracked diff against HEAD and the
    untracked files (``path sha256`` lines), or ``None`` outside a git checkout."""
    diff = _git("diff", "HEAD", "--binary", "--", *CODE_PATHS, root=root)
    others = _git("ls-files", "--others", "--exclude-standard", "-z", "--", *CODE_PATHS, root=root)
    if diff is None or others is None:
        return None
    untracked = []
    for name in sorted(n for n in others.split("\0") if n):
        try:
            untracked.append(f"{name} {hashlib.sha256((root / name).read_bytes()).hexdigest()}")
        except OSError:
            continue
    return diff, untracked


def code_identity(root: Path = ROOT) -> dict:
    """``{"commit", "dirty", "diff_sha256"}``: the checkout's commit (``None`` outside git),
    whether :data:`CODE_PATHS` differ from it, and the SHA-256 of those differences (``None``
    when clean)."""
    head = _git("rev-parse", "HEAD", root=root)
    patch = _patch(root) if head else None
    if not head or patch is None:
        return {"commit": None, "dirty": False, "diff_sha256": None}
    diff, untracked = patch
    dirty = bool(diff or untracked)
    digest = hashlib.sha256((diff + "\n".join(untracked)).encode()).hexdigest()[:16] if dirty else None
    return {"commit": head.strip(), "dirty": dirty, "diff_sha256": digest}


def label(identity: dict | None) -> str:
    """``1a2b3c4d5e6f``, ``1a2b3c4d5e6f+dirty.0f1e2d3c`` (the changes' hash) or ``unknown``."""
    if not identity or not identity.get("commit"):
        return "unknown"
    base = identity["commit"][:12]
    return f"{base}+dirty.{identity['diff_sha256'][:8]}" if identity.get("dirty") else base


def versions() -> dict:
    """Python's version and each of :data:`LIBRARIES`' installed versions (``None`` when absent)."""
    out = {"python": platform.python_version()}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def snapshot(root: Path = ROOT) -> dict:
    """What a run is made with now: code, library versions, CPU, UTC time."""
    return {"code": code_identity(root), "versions": versions(), "cpu": cpu_model(),
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def read(run_dir: str | Path) -> dict | None:
    """A run folder's ``provenance.json`` (``None`` when it has none)."""
    try:
        return json.loads((Path(run_dir) / FILE).read_text())
    except (OSError, ValueError):
        return None


def _write(run_dir: Path, rec: dict) -> None:
    tmp = run_dir / (FILE + ".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(run_dir / FILE)


def record_start(run_dir: str | Path, root: Path = ROOT) -> dict:
    """A fresh run starts: write its ``provenance.json`` (and the patch of a dirty tree),
    keeping the starting weights' fingerprint when it was recorded first."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    snap = snapshot(root)
    weights = (read(d) or {}).get("weights_sha256")
    rec = {"started": snap, "resumed": [], **({"weights_sha256": weights} if weights else {})}
    _write(d, rec)
    _write_patch(d, snap["code"], root)
    return rec


def record_resume(run_dir: str | Path, root: Path = ROOT) -> dict:
    """A run resumes: append this process's snapshot (a run from before runs recorded their
    code gets a record whose start is unknown)."""
    d = Path(run_dir)
    rec = read(d) or {"started": None, "resumed": []}
    snap = snapshot(root)
    rec.setdefault("resumed", []).append(snap)
    _write(d, rec)
    _write_patch(d, snap["code"], root)
    return rec


def record_weights(run_dir: str | Path, weights: str) -> None:
    """Add the starting policy's weights fingerprint to the run's record."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    rec = read(d) or {"started": None, "resumed": []}
    rec["weights_sha256"] = weights
    _write(d, rec)


def _write_patch(d: Path, identity: dict, root: Path) -> None:
    if not identity.get("dirty"):
        return
    patch = _patch(root)
    if patch:
        diff, untracked = patch
        name = DIFF_FILE if not (d / DIFF_FILE).exists() else f"provenance-{identity['diff_sha256']}.diff"
        (d / name).write_text(diff + "".join(f"# untracked: {u}\n" for u in untracked))


def identities(rec: dict | None) -> list[dict | None]:
    """Every code identity a run trained under (its start and each resume); ``[None]`` for a
    run that recorded none."""
    if not rec:
        return [None]
    snaps = [rec.get("started"), *rec.get("resumed", [])]
    return [s["code"] if s else None for s in snaps]


def drift(theirs: list[dict | None], now: dict) -> str | None:
    """What separates runs made under ``theirs`` from code ``now``, in a few words, or ``None``
    when every one is the same code (same commit and the same uncommitted changes)."""
    for ident in theirs:
        if not ident or not ident.get("commit"):
            return "it recorded no code commit (made before runs recorded their code, or outside git)"
        if not now.get("commit"):
            return "this code is not a git checkout, so it cannot be matched to the run's"
        if ident["commit"] != now["commit"]:
            return f"it was trained at commit {label(ident)}, this code is {label(now)}"
        if ident.get("diff_sha256") != now.get("diff_sha256"):
            return (f"it was trained on {label(ident)}, this code is {label(now)} (other "
                    "uncommitted changes)")
    return None


def code_drift(run_dir: str | Path, now: dict | None = None) -> str | None:
    """:func:`drift` between the run in ``run_dir`` and the code ``now`` (default: this
    checkout)."""
    return drift(identities(read(run_dir)), now if now is not None else code_identity())


def refuse_drift(run_dir: str | Path, what: str, allow: bool = False, now: dict | None = None) -> str | None:
    """Raise :class:`CodeDriftError` (``what`` the run: "resume", "reuse" ...) when the run's
    code differs from ``now``, unless ``allow``; returns the difference when allowed."""
    why = code_drift(run_dir, now)
    if why and not allow:
        raise CodeDriftError(f"{run_dir}: will not {what} it: {why}; rerun it on this code, or "
                             "pass allow_code_drift=true to mix code versions (the results then say so)")
    return why
