"""Experiment trackers: a run's metrics in TensorBoard, Weights & Biases, MLflow or trackio.

``TrainConfig.report_to`` names the trackers (TRL's names: ``tensorboard``, ``wandb``,
``mlflow``, ``trackio``; ``none`` for none). Each is a subscriber of the trainer's event
bus, like the dashboard: it writes every ``metrics.jsonl`` row (``on_step_end``) and every
``eval.jsonl`` row (``on_eval``) as scalars at their step, the run's config as
hyper-parameters when the run starts, and (TensorBoard, W&B, MLflow) a sample of the
step's completions with their rewards every ``trackers.samples_every`` steps.

Everything stays on the machine: TensorBoard event files, W&B in offline mode and an MLflow
SQLite store live in the run folder's ``trackers/`` folder, trackio in its own local store
(``TRACKIO_DIR``). ``trackers.json`` in the run folder records each tracker's run (ids,
folders), so a resumed run continues the same tracker runs: TensorBoard drops what it holds
past the resumed step (its ``purge_step``) and is written again from there; W&B, MLflow and
trackio are append-only, so a step they already hold (logged before a kill, past the last
checkpoint) is not sent again, and a step they lack (W&B and trackio buffer what they write;
a kill loses the buffer) is sent from ``metrics.jsonl`` / ``eval.jsonl`` when the run goes on.
A tracker added when a run is resumed gets the earlier steps the same way. Every row reaches
each tracker once, at its step.

The packages are the optional extra ``trackers``; a tracker asked for and not installed
stops the trainer at its start (:class:`TrackerError`, with the install line). A tracker
that fails during the run logs one warning and is dropped; training goes on.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from labkit.config import to_dict
from labkit.runs.events import RunFolder

WATCH_FIELDS = ("report_to", "trackers")
"""``TrainConfig`` fields that say where a run is watched, not what it trains: two configs
that differ only there train the same run (the experiments reuse and resume across them)."""

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
"""The trackers ``report_to`` may name, in TRL's spelling."""
INSTALL = "pip install -e '.[trackers]'"
"""The one line that installs every tracker (the ``trackers`` extra of pyproject.toml)."""
STATE_FILE = "trackers.json"
"""The run folder's record of its tracker runs (what a resumed run continues)."""
SAMPLE_COLUMNS = ("task_id", "sample", "reward", "r_test", "status", "completion")
"""Columns of the completion samples (TensorBoard text, W&B table, MLflow text artifact)."""

log = logging.getLogger(__name__)


@dataclass
class TrackerConfig:
    """Where the trackers named by ``TrainConfig.report_to`` write, and what beyond scalars."""

    project: str = "labkit"
    """W&B project, MLflow experiment and trackio project the run is logged under."""
    name: str | None = None
    """Run name in every tracker; ``None``: the run folder's name and an 8-hex id drawn when
    the run starts (``train-1a2b3c4d``), kept in ``trackers.json`` for a resumed run."""
    samples_every: int = 10
    """A sample of the step's completions with their rewards every N steps (TensorBoard
    text, W&B table, MLflow text artifact); 0 = none."""
    samples: int = 8
    """Completions in each sample (one per task first, then second samples, ...)."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """W&B mode: ``offline`` writes the run to ``trackers/wandb/wandb/offline-run-*/``, one
    folder per session (``wandb sync`` uploads them later); ``online`` needs an API key and
    the network."""
    mlflow_uri: str | None = None
    """MLflow tracking URI; ``None``: a SQLite store in the run folder,
    ``sqlite:///<run_dir>/trackers/mlflow/mlflow.db``, artifacts beside it."""

    def validate(self) -> None:
        if self.samples_every < 0 or self.samples < 1:
            raise ValueError(f"trackers.samples_every must be >= 0 and trackers.samples >= 1, "
                             f"got {self.samples_every} and {self.samples}")


class TrackerError(RuntimeError):
    """A tracker cannot start: not installed (the message holds the install line), or its
    run cannot be continued."""


# ----------------------------------------------------------------------------- pure helpers


def report_to_names(value: str | Sequence[str] | None) -> list[str]:
    """The trackers a ``report_to`` value names, in the order given, each once: a list or a
    comma-separated string; ``none`` (or nothing) is no tracker. An unknown name, or
    ``none`` beside a tracker, is a ``ValueError`` naming the valid ones."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    names = [str(n).strip().lower() for n in items if str(n).strip()]
    unknown = [n for n in names if n not in TRACKERS and n != "none"]
    if unknown:
        raise ValueError(f"report_to: unknown tracker(s) {unknown}; choose from "
                         f"{list(TRACKERS)} or none")
    if "none" in names and len(set(names)) > 1:
        raise ValueError(f"report_to: 'none' beside trackers {names}; give trackers or none")
    return list(dict.fromkeys(n for n in names if n != "none"))


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics or eval row a tracker plots: every finite int, float or bool
    value except ``step`` (the x axis), as floats; ``None`` (a non-finite value as
    ``metrics.jsonl`` writes it) and text are left out."""
    out = {}
    for k, v in row.items():
        if k == "step" or not isinstance(v, (int, float)):
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


def flat_config(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, str | int | float | bool]:
    """A nested config dict as ``{"a.b.c": value}`` hyper-parameters: numbers, strings and
    bools as they are, lists and ``None`` as their JSON text (``"[0.9, 0.99]"``, ``"null"``);
    an empty section leaves no key."""
    out: dict[str, str | int | float | bool] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat_config(v, key + "."))
        elif isinstance(v, (str, int, float, bool)):
            out[key] = v
        else:
            out[key] = json.dumps(v)
    return out


_MLFLOW_BAD = re.compile(r"[^\w./\- :]")


def mlflow_key(key: str) -> str:
    """``key`` as an MLflow metric or parameter name: characters MLflow refuses (outside
    letters, digits, ``_ - . / : `` and space) become ``_``."""
    return _MLFLOW_BAD.sub("_", key)


def pick_samples(records: Sequence[Mapping[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` of a step's rollout records for a completion sample, spread over the tasks:
    every task's first sample, then every task's second, ... (records in their order), each
    as the :data:`SAMPLE_COLUMNS` (``r_test`` from its components)."""
    ranked = sorted(enumerate(records), key=lambda ir: (ir[1].get("sample", 0), ir[0]))
    return [{"task_id": r.get("task_id", ""), "sample": r.get("sample", 0),
             "reward": r.get("reward"), "r_test": (r.get("components") or {}).get("r_test"),
             "status": r.get("status", ""), "completion": r.get("completion", "")}
            for _, r in ranked[:n]]


def samples_markdown(step: int, rows: Sequence[Mapping[str, Any]]) -> str:
    """A completion sample as Markdown (TensorBoard's text panel, an MLflow artifact): one
    heading per completion with its task, reward, test fraction and status, the completion
    in a code block."""
    def num(x: Any) -> str:
        return f"{x:.3f}" if isinstance(x, (int, float)) else "-"

    parts = [f"### Completions at step {step}"]
    for r in rows:
        fence = "````" if "```" in r["completion"] else "```"
        parts.append(f"**{r['task_id']}** sample {r['sample']}: reward {num(r['reward'])}, "
                     f"r_test {num(r['r_test'])}, {r['status']}\n\n{fence}\n{r['completion']}\n"
                     f"{fence}")
    return "\n\n".join(parts)


def earlier_rows(run: RunFolder, before: int) -> list[tuple[str, dict]]:
    """``(stream, row)`` of the run folder's metrics (``train``) and eval rows of steps before
    ``before``, in the order the trainer logged them (by step, a step's eval after its
    metrics): what a continued tracker run may lack (lost in a kill) and a tracker added to
    a resumed run never had."""
    rows = [("train", r) for r in run.read("metrics.jsonl") if r.get("step", before) < before]
    rows += [("eval", r) for r in run.read("eval.jsonl") if r.get("step", before) < before]
    return sorted(rows, key=lambda sr: (sr[1]["step"], sr[0] == "eval"))


def read_state(run: RunFolder) -> dict[str, Any]:
    """``trackers.json`` of a run folder (``{}`` when it has none)."""
    return run.read_json(STATE_FILE) if run.file(STATE_FILE).is_file() else {}


# ----------------------------------------------------------------------------- trackers


@dataclass
class Opening:
    """What a tracker is told when it opens its run."""

    run_dir: Path
    """The run folder (trackers write under ``<run_dir>/trackers/<name>/``)."""
    name: str
    """The run's name in every tracker."""
    run_id: str
    """The run's 8-hex id (W&B's run id)."""
    config: dict
    """The run's ``TrainConfig`` as a dict (the hyper-parameters)."""
    settings: TrackerConfig
    """The ``trackers`` section of the config."""
    previous: dict | None
    """This tracker's record in ``trackers.json`` when the run is continued, else ``None``."""
    first_step: int
    """The first step this session logs (0 for a new run, a resumed run's next step)."""


class Tracker:
    """One tracker's run. Subclasses open it, write scalars, samples and flush, close it;
    :class:`Trackers` calls them and turns any exception into one warning."""

    name = ""
    modules: tuple[str, ...] = ()
    """Modules imported at the trainer's start (a missing one is a :class:`TrackerError`)."""
    append_only = True
    """Whether its store only grows (all but TensorBoard): a continued run skips the steps
    it holds and is sent the earlier steps it lacks from the run folder."""

    def open(self, at: Opening) -> dict:
        """Start or continue the run; returns what ``trackers.json`` keeps for a resume."""
        raise NotImplementedError

    def held(self) -> dict[str, set[int]]:
        """Steps the tracker's store already holds, per stream (``train``, ``eval``)."""
        return {"train": set(), "eval": set()}

    def log(self, stream: str, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def samples(self, step: int, rows: list[dict]) -> None:
        """A completion sample at ``step`` (trackers without one ignore it)."""

    def flush(self) -> None:
        """Make what was logged durable (trackers that write synchronously do nothing)."""

    def close(self, finished: bool) -> None:
        raise NotImplementedError


def _folder(at: Opening, name: str) -> Path:
    path = at.run_dir / "trackers" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


class TensorBoardTracker(Tracker):
    """Event files in ``trackers/tensorboard/`` (``tensorboard --logdir runs``): one scalar
    per metric, the config as HPARAMS and as text, samples as Markdown text. A resumed run
    writes to the same folder with ``purge_step`` set to its next step, so TensorBoard drops
    what the interrupted session logged past the checkpoint."""

    name = "tensorboard"
    modules = ("tensorboard", "torch.utils.tensorboard")
    append_only = False

    def open(self, at: Opening) -> dict:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        folder = _folder(at, self.name)
        self.writer = SummaryWriter(str(folder), purge_step=at.first_step if at.previous else None)
        if at.first_step == 0:  # a new run, or one restarted from step 0 (all purged)
            flat = flat_config(at.config)
            for event in hparams(flat, {"eval/pass_at_1": 0.0}):
                self.writer.file_writer.add_summary(event)
            self.writer.add_text("config", "```json\n" + json.dumps(at.config, indent=2) + "\n```")
        return {"logdir": str(folder.relative_to(at.run_dir))}

    def log(self, stream: str, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def samples(self, step: int, rows: list[dict]) -> None:
        self.writer.add_text("samples", samples_markdown(step, rows), step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self, finished: bool) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A W&B run (offline by default) under ``trackers/wandb/`` (W&B's own ``wandb/`` folder
    in it), run id = the run's id; a resumed run opens the same id (offline: one
    ``wandb/offline-run-*`` folder per session, all of that id). Samples are a ``wandb.Table``."""

    name = "wandb"
    modules = ("wandb",)

    def open(self, at: Opening) -> dict:
        import wandb

        self.folder = _folder(at, self.name)
        self.run = wandb.init(
            project=at.settings.project, name=at.name, id=at.run_id, dir=str(self.folder),
            mode=at.settings.wandb_mode, resume="allow" if at.previous else None,
            config=at.config, reinit="create_new",
            settings=wandb.Settings(console="off", x_disable_stats=True, save_code=False,
                                    disable_git=True, silent=True))
        return {"id": at.run_id, "dir": str(self.folder.relative_to(at.run_dir)),
                "mode": at.settings.wandb_mode}

    def held(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {"train": set(), "eval": set()}
        for path in sorted(self.folder.glob("wandb/*-run-*/run-*.wandb")):
            for step, keys in wandb_history(path):
                if "reward/mean" in keys:
                    out["train"].add(step)
                if "eval/pass_at_1" in keys:
                    out["eval"].add(step)
        return out

    def log(self, stream: str, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def samples(self, step: int, rows: list[dict]) -> None:
        import wandb

        table = wandb.Table(columns=list(SAMPLE_COLUMNS),
                            data=[[r[c] for c in SAMPLE_COLUMNS] for r in rows])
        self.run.log({"samples": table}, step=step)

    def close(self, finished: bool) -> None:
        self.run.finish()


def wandb_records(path: str | Path) -> Iterator[Any]:
    """The records of a W&B run file (``run-<id>.wandb``, what offline mode writes), as
    W&B's own ``Record`` protobufs: a 7-byte W&B header, then a LevelDB log (32 KiB blocks
    of pieces with a 7-byte header: CRC, length, type). A record torn by a kill ends it."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        if pos + 7 + n > len(data):
            return
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # a whole record, or the last piece of one
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def wandb_history(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``(step, {key: value})`` of every history row of a W&B run file
    (:func:`wandb_records`)."""
    return [(rec.history.step.num,
             {"/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json)
              for i in rec.history.item})
            for rec in wandb_records(path) if rec.WhichOneof("record_type") == "history"]


class MlflowTracker(Tracker):
    """An MLflow run in a SQLite store under ``trackers/mlflow/`` (or ``mlflow_uri``): the
    config as parameters, metrics with their step, samples as Markdown artifacts
    (``samples/step_NNNNNN.md``). A resumed run reopens the same run id; the run ends
    ``FINISHED`` or, stopped before its last step, ``KILLED``."""

    name = "mlflow"
    modules = ("mlflow", "sqlalchemy", "alembic")

    def open(self, at: Opening) -> dict:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        given = at.previous["uri"] if at.previous else at.settings.mlflow_uri
        uri, artifacts = given, None
        if given is None:  # the run folder's own store (found again wherever the folder moves)
            folder = _folder(at, self.name).resolve()
            uri, artifacts = f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        if at.previous:
            self.run_id = at.previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            exp = self.client.get_experiment_by_name(at.settings.project)
            exp_id = (exp.experiment_id if exp is not None else
                      self.client.create_experiment(at.settings.project, artifacts))
            self.run_id = self.client.create_run(exp_id, run_name=at.name,
                                                 tags={"labkit.run_dir": str(at.run_dir)}).info.run_id
            params = [Param(mlflow_key(k)[:250], str(v)[:6000])
                      for k, v in flat_config(at.config).items()]
            for i in range(0, len(params), 100):  # MLflow takes 100 parameters per batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        return {"uri": given, "run_id": self.run_id}

    def held(self) -> dict[str, set[int]]:
        return {stream: {m.step for m in self.client.get_metric_history(self.run_id, key)}
                for stream, key in (("train", "reward/mean"), ("eval", "eval/pass_at_1"))}

    def log(self, stream: str, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # and 1000 metrics
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def samples(self, step: int, rows: list[dict]) -> None:
        self.client.log_text(self.run_id, samples_markdown(step, rows),
                             f"samples/step_{step:06d}.md")

    def close(self, finished: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if finished else "KILLED")


class TrackioTracker(Tracker):
    """A trackio run in trackio's local store (``TRACKIO_DIR``, by default
    ``~/.cache/huggingface/trackio``; ``trackio show --project labkit``), found again by its
    name on resume (and checked against the recorded id)."""

    name = "trackio"
    modules = ("trackio",)

    def open(self, at: Opening) -> dict:
        import trackio
        from trackio import utils

        self.project = at.settings.project
        self.run = trackio.init(project=self.project, name=at.name, config=at.config,
                                resume="must" if at.previous else "never", embed=False,
                                auto_log_cpu=False, auto_log_gpu=False)
        if at.previous and self.run.id != at.previous["id"]:
            raise TrackerError(f"trackio project {self.project!r} holds a newer run named "
                               f"{at.name!r} (id {self.run.id}, not {at.previous['id']})")
        return {"project": self.project, "id": self.run.id, "dir": str(utils.TRACKIO_DIR)}

    def held(self) -> dict[str, set[int]]:
        from trackio.sqlite_storage import SQLiteStorage

        out: dict[str, set[int]] = {"train": set(), "eval": set()}
        for row in SQLiteStorage.get_logs(self.project, run_id=self.run.id):
            if "reward/mean" in row:
                out["train"].add(row["step"])
            if "eval/pass_at_1" in row:
                out["eval"].add(row["step"])
        return out

    def log(self, stream: str, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self, finished: bool) -> None:
        from trackio import context_vars

        self.run.finish()
        if context_vars.current_run.get() is self.run:  # not finished again at exit
            context_vars.current_run.set(None)


TRACKER_CLASSES: dict[str, type[Tracker]] = {
    "tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker,
    "trackio": TrackioTracker}


def check_installed(names: Iterable[str]) -> None:
    """Import each named tracker's modules; any missing is one :class:`TrackerError` naming
    the trackers and the install line."""
    missing = []
    for name in names:
        for mod in TRACKER_CLASSES[name].modules:
            try:
                importlib.import_module(mod)
            except ImportError:
                missing.append(name)
                break
    if missing:
        raise TrackerError(f"report_to asks for {', '.join(missing)}, not installed: {INSTALL}")


# ----------------------------------------------------------------------------- the subscriber


class Trackers:
    """The trackers of one trainer: checks they are installed when built, opens their runs
    at the first event, forwards rows, samples and flushes, closes them when training ends
    and with the trainer.

    A tracker that raises is warned about once (logger ``labkit.runs.trackers``) and
    dropped; the trainer never sees the exception."""

    def __init__(self, names: Sequence[str], settings: TrackerConfig):
        self.names = report_to_names(names)
        check_installed(self.names)
        self.settings = settings
        self.live: list[Tracker] = []
        self.held: dict[str, dict[str, set[int]]] = {}
        self.trainer: Any = None
        self._opened = False

    def attach(self, trainer: Any) -> Trackers:
        """Subscribe to ``trainer.events`` (nothing when no tracker is named)."""
        if self.names:
            self.trainer = trainer
            for event, fn in self._handlers():
                trainer.events.on(event, fn)
        return self

    def _handlers(self) -> tuple[tuple[str, Callable], ...]:
        return (("on_train_start", self._on_train_start), ("on_step_end", self._on_step_end),
                ("on_eval", self._on_eval), ("on_checkpoint", self._on_checkpoint),
                ("on_train_end", self._on_train_end))

    # ------------------------------------------------------------------ events
    def _on_train_start(self, trainer: Any) -> None:
        self._open(trainer, 0)

    def _on_step_end(self, trainer: Any, step: int, metrics: Mapping, records: Sequence) -> None:
        self._open(trainer, step)
        self._write("train", step, metrics)
        every = self.settings.samples_every
        if every and step % every == 0 and records:
            rows = pick_samples(records, self.settings.samples)
            for t in list(self.live):
                self._guard(t, "writing samples", lambda t=t: t.samples(step, rows))
        self._flush()

    def _on_eval(self, trainer: Any, step: int, metrics: Mapping) -> None:
        self._open(trainer, step)
        self._write("eval", step, metrics)
        self._flush()

    def _on_checkpoint(self, trainer: Any, step: int, path: Any) -> None:
        self._flush()

    def _on_train_end(self, trainer: Any) -> None:
        self.finish(finished=True)  # a later step (more steps asked for) opens them again

    def _write(self, stream: str, step: int, row: Mapping) -> None:
        values = scalars(row)
        for t in list(self.live):
            if step in self.held.get(t.name, {}).get(stream, ()):
                continue  # logged before the interruption: the store keeps it
            self._guard(t, f"logging step {step}", lambda t=t: t.log(stream, step, values))

    def _flush(self) -> None:
        for t in list(self.live):
            self._guard(t, "flushing", t.flush)

    # ------------------------------------------------------------------ open / close
    def _open(self, trainer: Any, first_step: int) -> None:
        if self._opened:
            return
        self._opened = True
        run = trainer.run
        state = read_state(run)
        if "id" not in state:
            state = {"id": uuid.uuid4().hex[:8]}
        state.setdefault("name", self.settings.name or f"{run.path.name}-{state['id']}")
        config = to_dict(trainer.cfg)
        for name in self.names:
            tracker = TRACKER_CLASSES[name]()
            at = Opening(run_dir=run.path, name=state["name"], run_id=state["id"], config=config,
                         settings=self.settings, previous=state.get(name), first_step=first_step)

            def start(tracker=tracker, at=at) -> None:
                state[tracker.name] = tracker.open(at)
                if at.previous and not tracker.append_only:
                    self.live.append(tracker)  # TensorBoard: purged past first_step
                    return
                held = tracker.held() if at.previous else {"train": set(), "eval": set()}
                self.held[tracker.name] = held
                for stream, row in earlier_rows(run, first_step):
                    if row["step"] not in held[stream]:
                        tracker.log(stream, row["step"], scalars(row))
                        held[stream].add(row["step"])
                self.live.append(tracker)

            self._guard(tracker, "opening its run", start)
        run.write_json(STATE_FILE, state)

    def finish(self, finished: bool) -> None:
        """Close every tracker's run (``finished``: the run reached its last step); the next
        event opens them again, continuing the same runs."""
        for t in list(self.live):
            self._guard(t, "closing its run", lambda t=t: t.close(finished))
        self.live, self.held, self._opened = [], {}, False

    def close(self, finished: bool) -> None:
        """:meth:`finish`, and unsubscribe from the trainer."""
        self.finish(finished)
        if self.trainer is not None:
            for event, fn in self._handlers():
                self.trainer.events.off(event, fn)
            self.trainer = None

    def _guard(self, tracker: Tracker, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a tracker must never stop training
            if tracker in self.live:
                self.live.remove(tracker)
            log.warning("tracker %s failed %s (%s: %s); training goes on without it",
                        tracker.name, what, type(e).__name__, e)
