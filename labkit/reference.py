"""The generated reference (docs/reference.md): written from the code, never by hand.

* every config dataclass a user sets (:data:`CONFIGS`: the training config and everything
  nested in it, evaluation, pre-training, muCODE and each experiment's config) with each
  field's type, default and docstring (the string literal under the field);
* every advantage estimator of :data:`labkit.credit.advantages.ADVANTAGE_ESTIMATORS` with its
  equation (its docstring), what it needs besides rewards and whether it returns sequence or
  token credit; every policy loss;
* the reshaping recipes and the feedback regimes.

``python -m labkit docs`` writes it with the other generated tables; ``--check`` fails when it
is stale (a test runs the check).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
from collections.abc import Iterator

import labkit.credit  # noqa: F401 - registers every estimator
from labkit.credit.advantages import ADVANTAGE_ESTIMATORS
from labkit.credit.losses import POLICY_LOSSES
from labkit.credit.reshaping import RECIPES, ReshapeConfig
from labkit.env.feedback import FEEDBACK_MODES, r_feedback

CONFIGS = [
    "labkit.loops.config:TrainConfig",
    "labkit.policy.evaluate:EvalConfig",
    "labkit.policy.pretrain:PretrainConfig",
    "labkit.loops.mucode:MucodeConfig",
    "labkit.experiments.config:ExperimentConfig",
    "labkit.experiments.learning:Config",
    "labkit.experiments.reshaping:Config",
    "labkit.experiments.didpo:Config",
    "labkit.experiments.credit:Config",
    "labkit.experiments.mucode:Config",
]
"""The top-level configs (``module:Class``); nested config dataclasses follow their parent."""


def _resolve(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _class_bodies(cls: type) -> Iterator[list[ast.stmt]]:
    """The class bodies of ``cls``'s dataclass bases, then its own."""
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            yield ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError):
            continue


def computed_defaults(cls: type) -> dict[str, str]:
    """Fields whose default is an expression computed where the code runs (``os.cpu_count()``,
    a folder of the checkout): the expression as written, so the page is the same anywhere."""
    out: dict[str, str] = {}
    for body in _class_bodies(cls):
        for stmt in body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
                node = stmt.value
                is_field = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "field"
                try:
                    ast.literal_eval(node)
                    literal = True
                except ValueError:
                    literal = False
                if not is_field and not literal and not isinstance(node, (ast.Name, ast.Attribute)):
                    out[stmt.target.id] = ast.unparse(node)
    return out


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring: the string literal right after its annotated assignment, in
    ``cls`` or the dataclass it inherits the field from."""
    docs: dict[str, str] = {}
    for body in _class_bodies(cls):
        for stmt, nxt in zip(body, body[1:] + [None]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _default(f: dataclasses.Field, computed: dict[str, str]) -> str:
    if f.name in computed:
        return f"`{computed[f.name]}`"
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return f"`{type(value).__name__}()`"
    else:
        return "required"
    return f"`{value!r}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _nested(cls: type) -> Iterator[type]:
    """The config dataclasses held by ``cls``'s fields (their default values), depth first."""
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            if dataclasses.is_dataclass(value):
                yield type(value)
                yield from _nested(type(value))


def config_section(cls: type, title: str | None = None) -> list[str]:
    docs, computed = field_docs(cls), computed_defaults(cls)
    head = (inspect.getdoc(cls) or "").split("\n\n")[0]
    lines = [f"### `{title or cls.__name__}` (`{cls.__module__}`)", "", _cell(head), "",
             "| field | type | default | what it is |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        lines.append(f"| `{f.name}` | `{_cell(str(kind))}` | {_cell(_default(f, computed))} | "
                     f"{_cell(docs.get(f.name, ''))} |")
    return lines + [""]


def configs() -> list[str]:
    out, seen = ["## Configs", "",
                 "Every field of a YAML config or `--set key=value` (nested keys with dots: "
                 "`loss.kl_coef`). Unknown keys are errors.", ""], set()
    for spec in CONFIGS:
        cls = _resolve(spec)
        title = f"{cls.__module__.rsplit('.', 1)[-1]}.Config" if cls.__name__ == "Config" else None
        for klass in [cls, *_nested(cls)]:
            if klass in seen:
                continue
            seen.add(klass)
            out += config_section(klass, title if klass is cls else None)
    return out


def estimators() -> list[str]:
    out = ["## Advantage estimators", "",
           "`TrainConfig.estimator` names one. *needs*: what the estimator reads besides the "
           "rewards (the trainer's rollout stages measure `forks` and `hunks` only when an "
           "estimator needs them); *credit*: one advantage per completion (`sequence`) or per "
           "token (`token`).", ""]
    for name in ADVANTAGE_ESTIMATORS:
        fn, meta = ADVANTAGE_ESTIMATORS[name], ADVANTAGE_ESTIMATORS.meta(name)
        needs = ", ".join(meta.get("needs", ())) or "rewards only"
        out += [f"### `{name}`", "", f"*needs*: {needs}; *credit*: {meta.get('credit', '?')}; "
                f"`{fn.__module__}.{fn.__name__}`", "", inspect.getdoc(fn) or "(no docstring)", ""]
    out += ["## Policy losses", "", "`TrainConfig.loss.name` names one.", ""]
    for name in POLICY_LOSSES:
        fn = POLICY_LOSSES[name]
        out += [f"### `{name}`", "", f"`{fn.__module__}.{fn.__name__}`", "",
                inspect.getdoc(fn) or "(no docstring)", ""]
    return out


def recipes_and_regimes() -> list[str]:
    base = ReshapeConfig()
    out = ["## Reshaping recipes", "",
           "`labkit.credit.reshaping.RECIPES`: named `ReshapeConfig`s; each row lists the fields "
           "that differ from `ReshapeConfig()`'s defaults.", "",
           "| recipe | differs from the defaults in | what it is |", "|---|---|---|"]
    for name, make in RECIPES.items():
        cfg = make()
        diff = ", ".join(f"`{f.name}={getattr(cfg, f.name)!r}`" for f in dataclasses.fields(cfg)
                         if getattr(cfg, f.name) != getattr(base, f.name)) or "nothing"
        doc = (inspect.getdoc(make) or "").split("\n\n")[0]
        out.append(f"| `{name}` | {_cell(diff)} | {_cell(doc)} |")
    out += ["", "## Feedback regimes", "",
            f"`TrainConfig.feedback.mode`: one of {', '.join(f'`{m}`' for m in FEEDBACK_MODES)}. "
            "What each reveals and what every reward component reads under it: "
            "[feedback.md](feedback.md).", "", inspect.getdoc(r_feedback) or "", ""]
    return out


def markdown() -> str:
    """The whole reference page's generated body."""
    lines = configs() + estimators() + recipes_and_regimes()
    return "\n".join(lines).rstrip()
