"""Typed configuration: dataclasses in, dataclasses out, with clear errors.

Every concern has its own dataclass (``SandboxConfig``, ``FeedbackConfig``, ...). This
module turns nested dicts (from YAML or JSON) and ``key=value`` overrides (from the CLI
or a papermill parameter) into those dataclasses, checking every key and value type, so
a typo fails loudly instead of silently training with a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message says which and what is allowed."""


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and gently convert) ``value`` to the annotated type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: {value!r} matches none of {tp}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, str) and hasattr(tp, "named"):
            try:
                return tp.named(value)
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, _where=where)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        elif value is None:  # `--set seeds=` (empty)
            value = []
        elif isinstance(value, (int, float, bool)):  # `--set seeds=0`: one element
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
        if f != int(f):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return int(f)
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    if isinstance(tp, type) and issubclass(tp, Path):
        return Path(value)
    return value


def coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked (and gently converted) as a config value of type ``tp``; a
    :class:`ConfigError` naming ``where`` when it is not one."""
    return _coerce(value, tp, where)


def from_dict(cls: type[T], data: Mapping[str, Any], *, _where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and bad values raise ConfigError.

    A section (a mapping given for a dataclass-valued field) merges onto that *field's*
    default, not onto its class's defaults: ``TrainConfig.reshape`` defaults to
    ``ReshapeConfig.raw()``, so ``reshape: {normalise: batch}`` in a YAML file means raw plus
    batch normalisation, exactly as ``--set reshape.normalise=batch`` does."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where or cls.__name__}: expected a mapping, got {data!r}")
    hints = _field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{_where or cls.__name__}: unknown key(s) {unknown}"
                          f"{did_you_mean(unknown[0], fields)}; valid keys: {sorted(fields)}")
    kwargs = {}
    for k, v in data.items():
        default = _field_default(fields[k])
        if isinstance(v, Mapping) and dataclasses.is_dataclass(default):
            v = _deep_merge(to_dict(default), v)
        kwargs[k] = _coerce(v, hints[k], f"{_where + '.' if _where else ''}{k}")
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if callable(check):
        check()
    return obj


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _deep_merge(base: dict, over: Mapping) -> dict:
    """``base`` with ``over``'s keys replaced, nested mappings merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def to_dict(cfg: Any) -> dict:
    """A plain, YAML-able dict of a config dataclass (nested ones included)."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            v = to_dict(v)
        elif isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, Path):
            v = str(v)
        out[f.name] = v
    return out


REPO_ROOT = Path(__file__).resolve().parents[1]


def portable(value: Any) -> Any:
    """``value`` with every absolute path inside the repository (in it, or in its dicts and
    lists) written relative to the repository's root, so a committed file names no folder of
    the machine that made it."""
    if isinstance(value, dict):
        return {k: portable(x) for k, x in value.items()}
    if isinstance(value, list):
        return [portable(x) for x in value]
    if isinstance(value, str) and value.startswith("/"):
        try:
            return str(Path(value).resolve().relative_to(REPO_ROOT))
        except ValueError:
            return value
    return value


def to_record(cfg: Any) -> dict:
    """:func:`to_dict` for files the project commits (results, model manifests): a path
    inside the repository is written relative to its root (:func:`portable`)."""
    return portable(to_dict(cfg))


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean 'x'?)`` naming the choice closest to ``word``, or nothing."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"a.b=3"`` -> (["a", "b"], 3) with the value parsed as YAML (numbers, bools, lists,
    the flow mapping ``{lam: 0.5}``)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value (e.g. sandbox.workers=2)")
    key, raw = item.split("=", 1)
    path = key.strip().split(".")
    if any(not part.strip() for part in path):
        raise ConfigError(f"override {item!r}: the key {key.strip()!r} has an empty part; write "
                          "dotted keys like loss.kl_coef=0.01")
    import yaml

    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return [part.strip() for part in path], value


def _optional_inner(tp: Any) -> Any:
    """``X`` for ``X | None`` (the one type besides ``None``), else ``tp``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return tp


def _is_mapping_type(tp: Any) -> bool:
    return tp is dict or typing.get_origin(tp) is dict


def _set_override(data: dict, cls: type, path: list[str], value: Any, item: str) -> None:
    """Set ``path`` of the nested dict ``data`` (a dataclass ``cls`` as a dict) to ``value``,
    walking the types alongside: a dataclass section takes its own fields only, a mapping
    field (``estimator_options``) any key; a section's name (``reshape=reshaped_grpo``) is
    replaced by its fields (the dataclass's ``named`` constructor)."""
    node, tp = data, cls
    for i, part in enumerate(path):
        here = ".".join(path[: i + 1])
        if dataclasses.is_dataclass(tp):
            fields = [f.name for f in dataclasses.fields(tp) if f.init]
            if part not in fields:
                raise ConfigError(f"override {item!r}: unknown key {here!r}"
                                  f"{did_you_mean(part, fields)}; valid keys here: {sorted(fields)}")
            tp = _optional_inner(_field_types(tp)[part])
        elif _is_mapping_type(tp):
            args = typing.get_args(tp)
            tp = args[1] if len(args) == 2 else Any
        else:
            above = ".".join(path[:i])
            raise ConfigError(f"override {item!r}: {above!r} is a value, not a section; set it "
                              f"as {above}=VALUE")
        if i == len(path) - 1:
            if isinstance(value, str) and dataclasses.is_dataclass(tp) and hasattr(tp, "named"):
                try:
                    value = to_dict(tp.named(value))
                except ValueError as e:
                    raise ConfigError(f"override {item!r}: {e}") from None
            node[part] = value
        else:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]


def apply_overrides(cfg: T, overrides: list[str] | tuple[str, ...]) -> T:
    """Return a copy of ``cfg`` with ``key.sub=value`` overrides applied and re-validated.

    Keys are checked against the dataclasses as they are walked: an unknown key names the
    closest valid one; a mapping field takes any key (``estimator_options.lam=0.5``, checked
    by the config's own ``validate``); a section given a name (``reshape=reshaped_grpo``) is
    that named config (its class's ``named``), and later overrides edit it."""
    data = to_dict(cfg)
    for item in overrides:
        path, value = parse_override(item)
        _set_override(data, type(cfg), path, value, item)
    return from_dict(type(cfg), data)


def apply_values(cfg: T, values: Mapping[str, Any]) -> T:
    """Return a copy of ``cfg`` with each dotted key set to its value (a Python value, not
    text), in order, checked as :func:`apply_overrides` checks them and re-validated: what a
    named method (:mod:`labkit.experiments.methods`) does to a config."""
    data = to_dict(cfg)
    for key, value in values.items():
        _set_override(data, type(cfg), key.split("."), value, f"{key}={value!r}")
    return from_dict(type(cfg), data)


def load_yaml(cls: type[T], path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> T:
    """Load ``cls`` from a YAML file, then apply overrides."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass an existing YAML file")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({what}); fix that line of the file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text file (not UTF-8); pass a YAML config file") from None
    return apply_overrides(from_dict(cls, data, _where=p.name), list(overrides))
