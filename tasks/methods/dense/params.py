"""Dense baseline's params (``method=dense``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from tasks.core.limits import COUNT


@dataclass(frozen=True)
class DenseParams:
    """``method=dense``."""

    name: str = "dense"
    top_k: int = field(default=10, metadata=COUNT)
    batch_size: int = field(default=256, metadata=COUNT)
