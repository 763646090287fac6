"""What a params field allows beyond its annotated type, declared on the field itself.

A limit is dataclass field metadata, so it sits beside the default it constrains::

    alpha: float = field(default=0.15, metadata=PROB)
    walk_dtype: str = field(default="float32", metadata=one_of(("float32", "float64")))

The config check (``flows.runtime.config.check_values``) reads it; a stage's code identity leaves metadata out
(``tasks.core.code_identity``), so adding or tightening a limit rebuilds nothing. Checks that tie fields together
(``segment_min <= segment_avg``) stay in the classes' ``__post_init__``.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

LIMIT = "limit"  # the metadata key

_INTERVAL = re.compile(r"^([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])$")


def within(interval: str) -> Mapping[str, str]:
    """Field metadata: the value (each element of a tuple field) lies in ``interval``, e.g. ``"[0, 1]"`` or
    ``"(0, inf)"``; a round bracket excludes its end."""
    if _INTERVAL.match(interval) is None:
        raise ValueError(f"not an interval: {interval!r}")
    return {LIMIT: interval}


def one_of(choices: Iterable[Any]) -> Mapping[str, tuple]:
    """Field metadata: the value (each element of a tuple field) is one of ``choices``."""
    return {LIMIT: tuple(choices)}


COUNT = within("[1, inf)")
COUNT0 = within("[0, inf)")
PROB = within("[0, 1]")
POSITIVE = within("(0, inf)")


def in_interval(value: float, interval: str) -> bool:
    """``value`` lies in ``interval`` (``"[0, 1]"``, ``"(0, inf)"``, ...); NaN lies in none."""
    m = _INTERVAL.match(interval)
    if m is None:
        raise ValueError(f"not an interval: {interval!r}")
    lo, hi = float(m.group(2)), float(m.group(3))
    if math.isnan(value):
        return False
    above = value > lo if m.group(1) == "(" else value >= lo
    below = value < hi if m.group(4) == ")" else value <= hi
    return above and below


def limits_of(cls: type) -> dict[str, str | tuple]:
    """``{field: limit}`` of a params dataclass, its bases' fields included (a field redeclared without a limit
    has none)."""
    return {f.name: f.metadata[LIMIT] for f in dataclasses.fields(cls) if LIMIT in f.metadata}
