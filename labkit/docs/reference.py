"""The generated reference (docs/reference.md): written from the code, never by hand.

* every config dataclass a user sets (:data:`CONFIGS`: the training config and everything
  nested in it, evaluation, pre-training, muCODE and each experiment's config) with each
  field's type, default and docstring (the string literal under the field);
* every advantage estimator of :data:`labkit.credit.advantages.ADVANTAGE_ESTIMATORS` with its
  equation (its docstring), what it needs besides rewards and whether it returns sequence or
  token credit; every policy loss;
* the reshaping recipes and the feedback regimes;
* every command of ``python -m labkit`` with each of its arguments, read from the argument
  parsers (:func:`commands`).

``python -m labkit docs`` writes it with the other generated tables; ``--check`` fails when it
is stale (a test runs the check).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import textwrap
from collections.abc import Iterator

import labkit.credit  # noqa: F401 - registers every estimator
from labkit.__main__ import OWN_PARSERS, build_parser
from labkit.config import portable
from labkit.credit.advantages import ADVANTAGE_ESTIMATORS, estimator_options
from labkit.credit.losses import POLICY_LOSSES
from labkit.credit.reshaping import RECIPES, ReshapeConfig
from labkit.env.feedback import FEEDBACK_MODES, r_feedback
from labkit.experiments.methods import METHODS

CONFIGS = [
    "labkit.loops.config:TrainConfig",
    "labkit.policy.evaluate:EvalConfig",
    "labkit.policy.pretrain:PretrainConfig",
    "labkit.mucode.loop:MucodeConfig",
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
            return f"`{section_text(value)}`"
    else:
        return "required"
    return f"`{value!r}`"


def section_text(value) -> str:
    """A config section as the value it is: ``Type()`` when it holds its class's defaults, else
    ``Type(field=value, ...)`` with the fields that differ (whatever made it: a default
    factory such as a named recipe is printed as what it makes)."""
    try:
        base = type(value)()
    except TypeError:  # a class with required fields: every field
        base = None
    differ = [f"{f.name}={getattr(value, f.name)!r}" for f in dataclasses.fields(value)
              if base is None or getattr(value, f.name) != getattr(base, f.name)]
    return f"{type(value).__name__}({', '.join(differ)})"


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
           "rewards (the step supplies `rollouts` and `tasks`; the rollout stage registered "
           "for any other need, `labkit.loops.stages.STAGES`, measures it only when an estimator "
           "needs it); *credit*: one advantage per completion (`sequence`) or per token "
           "(`token`).", ""]
    for name in ADVANTAGE_ESTIMATORS:
        fn, meta = ADVANTAGE_ESTIMATORS[name], ADVANTAGE_ESTIMATORS.meta(name)
        needs = ", ".join(meta.get("needs", ())) or "rewards only"
        options = ", ".join(f"`{k}` ({_type_name(t)})" for k, t in estimator_options(name).items())
        out += [f"### `{name}`", "", f"*needs*: {needs}; *credit*: {meta.get('credit', '?')}; "
                f"`{fn.__module__}.{fn.__name__}`", "", f"*options* (`estimator_options`): "
                f"{options or 'none'}", "", inspect.getdoc(fn) or "(no docstring)", ""]
    out += ["## Policy losses", "", "`TrainConfig.loss.name` names one.", ""]
    for name in POLICY_LOSSES:
        fn = POLICY_LOSSES[name]
        out += [f"### `{name}`", "", f"`{fn.__module__}.{fn.__name__}`", "",
                inspect.getdoc(fn) or "(no docstring)", ""]
    return out


def methods() -> list[str]:
    """Every named method of :data:`labkit.experiments.methods.METHODS`."""
    out = ["## Methods", "",
           "`labkit.experiments.methods.METHODS`: what an experiment's `methods` (and notebook "
           "05) name. A method is config overrides (applied over the experiment's base config, "
           "as `--set` would), the rollout stages its estimator needs, a label, and two "
           "options: `scale` (`rms`: advantages at GRPO's per-group RMS) and `wall` (trained "
           "for the steps that fit in another method's wall time); `variant of` is the method "
           "it varies.", "",
           "| method | label | overrides | stages | options | variant of |", "|---|---|---|---|---|---|"]
    for name, m in METHODS.items():
        sets = ", ".join(f"`{k}={v}`" for k, v in m.overrides.items())
        options = ", ".join(x for x in (f"`scale={m.scale}`" if m.scale != "own" else "",
                                         f"`wall={m.wall}`" if m.wall else "",
                                         "`loop=mucode`" if m.loop != "grpo" else "") if x)
        out.append(f"| `{name}` | {_cell(m.label)} | {_cell(sets)} | {', '.join(m.stages) or '-'} | "
                   f"{options or '-'} | {f'`{m.variant_of}`' if m.variant_of else '-'} |")
    return out + [""]


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


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")


def subcommands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """``(command, help, parser)`` of every command under ``parser``, depth first, in the
    order they were added (``tasks validate`` under ``tasks``); commands that parse their own
    arguments (``labkit.__main__.OWN_PARSERS``) with their own parser."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in action.choices.items():
            command = f"{path} {name}".strip()
            if name in OWN_PARSERS and not path:
                sub = importlib.import_module(OWN_PARSERS[name]).build_parser()
            if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                yield from subcommands(sub, command)
            else:
                yield command, helps.get(name, ""), sub


def argument_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """``(argument, default, help)`` of each argument of ``parser`` (``--help`` left out):
    the flags with their value's name, a positional by its name."""
    rows = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        value = a.metavar or (a.dest.upper() if a.option_strings else a.dest)
        takes = a.nargs != 0
        name = ", ".join(f"{o} {value}" if takes else o for o in a.option_strings) or value
        if a.nargs in ("+", "*", "?"):
            name += {"+": " ...", "*": " ...", "?": " (optional)"}[a.nargs]
        none = a.default is None or a.default is False or a.default == [] \
            or a.default is argparse.SUPPRESS or not takes
        default = "required" if a.required else "-" if none else f"`{portable(a.default)}`"
        help_ = a.help or ""
        if a.choices:
            help_ += f"{'; ' if help_ else ''}one of {', '.join(f'`{c}`' for c in a.choices)}"
        if isinstance(a, argparse._AppendAction) and "repeatable" not in help_:
            help_ += f"{'; ' if help_ else ''}repeatable"
        rows.append((name, default, help_))
    return rows


def commands() -> list[str]:
    """The command-line section: each command, what it does and its arguments, read from the
    argument parsers (``labkit.__main__.build_parser``)."""
    out = ["## Command line", "",
           "`python -m labkit COMMAND ...`, every command and its arguments as its argument "
           "parser defines them (`--help` prints the same). A command's last stdout line is one "
           "JSON object; bad input is one line on stderr and exit status 2; Ctrl-C in `train` "
           "saves a checkpoint and exits with 130.", ""]
    for command, help_, parser in subcommands(build_parser()):
        out += [f"### `{command}`", "", _cell(help_ or parser.description or ""), "",
                "| argument | default | what it is |", "|---|---|---|"]
        out += [f"| `{name}` | {_cell(default)} | {_cell(text)} |"
                for name, default, text in argument_rows(parser)]
        out.append("")
    return out


def markdown() -> str:
    """The whole reference page's generated body."""
    lines = configs() + estimators() + methods() + recipes_and_regimes() + commands()
    return "\n".join(lines).rstrip()
