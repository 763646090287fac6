"""The config check: a config group's values against its params dataclass's annotated types and its fields'
limits (field metadata, :mod:`tasks.core.limits`), every problem named in one line (``method.alpha='abc' is not a
float in [0, 1]``). Generic: it knows no group; ``flows.runtime.config`` runs it over each of conf/'s groups."""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Literal, Mapping, Union

from tasks.core.limits import in_interval, limits_of


class ConfigError(ValueError):
    """A config group does not match its schema; the message names the group and the keys."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The fields' annotations, resolved (none when one cannot be: the dataclass alone checks then)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - e.g. a name imported only under TYPE_CHECKING
        return {}


def _optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` → (X, True); anything else → (tp, False)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(tp)):
            return args[0], True
    return tp, False


def _accept(tp: Any, limit: str | tuple | None, value: Any) -> tuple[bool, Any]:
    """Whether ``value`` is a valid ``tp`` within ``limit``, and the value to use (lists become tuples,
    numbers given for a string become that string)."""
    tp, nullable = _optional(tp)
    if value is None:
        return nullable, value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return value in args, value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if not isinstance(value, (list, tuple)):  # one value for a list field: a list of one
            ok, one = _accept(args[0], limit, value)
            return ok, (one,)
        checked = [_accept(args[0], limit, v) for v in value]
        return all(ok for ok, _ in checked), tuple(v for _, v in checked)
    if tp is bool:
        return isinstance(value, bool), value
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # Hydra reads dataset.name=2021 as an int
        return isinstance(value, str) and (not isinstance(limit, tuple) or value in limit), value
    if tp in (int, float):
        numeric = (int,) if tp is int else (int, float)  # Hydra gives 1 for method.alpha=1
        ok = isinstance(value, numeric) and not isinstance(value, bool)
        return ok and (not isinstance(limit, str) or in_interval(value, limit)), value
    return True, tuple(value) if isinstance(value, list) else value  # a type not known here: the dataclass decides


def _describe(tp: Any, limit: str | tuple | None, plural: bool = False) -> str:
    """What a field allows, in words: ``a float in [0, 1]``, ``one of ['a', 'b']``, ``a list of ints``."""
    tp, nullable = _optional(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal or (isinstance(limit, tuple) and tp is str):
        text = f"one of {list(args if origin is Literal else limit)}"
    elif origin is tuple:
        text = "a list of " + _describe(args[0], limit, plural=True)
    else:
        name = {bool: "bool", int: "int", float: "float", str: "string"}.get(tp, getattr(tp, "__name__", str(tp)))
        text = (f"{name}s" if plural else ("an " if name[0] in "aeiou" else "a ") + name) + (
            " (true or false)" if tp is bool else f" in {limit}" if isinstance(limit, str) else "")
    return text + (" or null" if nullable else "")


def _show(value: Any) -> str:
    """A value as the user would type it (YAML words for None and booleans)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def check_values(cls: type, group: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor arguments of ``cls`` from a config group, checked against the fields' annotated
    types and their limits (field metadata, :mod:`tasks.core.limits`); every problem is named (``method.alpha='abc' is not a float in [0, 1]``)."""
    hints, limits = _hints(cls), limits_of(cls)
    kwargs, problems = {}, []
    for key, value in values.items():
        tp = hints.get(key, Any)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
            kwargs[key] = nested(tp, f"{group}.{key}", value)  # a nested group (dataset.split)
            continue
        ok, kwargs[key] = _accept(tp, limits.get(key), value)
        if value == "???":  # OmegaConf's mandatory value, left unset
            problems.append(f"{group}.{key} must be set: add {group}.{key}=...")
        elif not ok:
            problems.append(f"{group}.{key}={_show(value)} is not {_describe(tp, limits.get(key))}")
    if problems:
        raise ConfigError("; ".join(problems))
    return kwargs


def nested(cls: type, group: str, values: Mapping[str, Any]) -> Any:
    """A nested group's dataclass (``dataset.split``), its keys known and checked like its parent's."""
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ConfigError(f"{group}: unknown key(s) {unknown}; {cls.__name__} accepts "
                          f"{sorted(f.name for f in dataclasses.fields(cls))}")
    try:
        return cls(**check_values(cls, group, values))
    except (TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"{group}: {err}") from None
