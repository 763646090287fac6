"""Stable hashes of JSON-serialisable payloads: a stage's fingerprint, and the short ids built from config."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np


def json_default(obj: Any) -> Any:
    """How a dataclass, a numpy scalar or a path is written in a fingerprint or a catalog row."""
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON-serialisable in a fingerprint: {type(obj).__name__}")


def short_hash(payload: Any, n: int = 16) -> str:
    """Stable hex digest of any JSON-serialisable payload."""
    blob = json.dumps(payload, sort_keys=True, default=json_default).encode()
    return hashlib.sha256(blob).hexdigest()[:n]


def fingerprint(stage: str, code: str, params: Any, inputs: Mapping[str, str]) -> str:
    """A stage's identity: hash(stage, code version, params as plain data, input fingerprints)."""
    return short_hash({"stage": stage, "code": code, "params": params, "inputs": dict(sorted(inputs.items()))})
