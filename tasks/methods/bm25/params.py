"""BM25 baseline's params: the method's (``method=bm25``) and its index stage's (:mod:`tasks.methods.bm25.stages`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from tasks.core.stage import StageParams
from tasks.core.limits import COUNT, COUNT0, PROB


@dataclass(frozen=True)
class BM25Params:
    """``method=bm25``: Lucene-variant BM25; passages indexed as ``doc_template`` renders them."""

    name: str = "bm25"
    k1: float = field(default=1.5, metadata=COUNT0)
    b: float = field(default=0.75, metadata=PROB)
    stopwords: str = "en"
    doc_template: str = "{title}\n{text}"
    top_k: int = field(default=10, metadata=COUNT)
    batch_size: int = field(default=256, metadata=COUNT)


@dataclass(frozen=True)
class BM25IndexParams(StageParams):
    """The BM25 index's keys (``method=bm25`` and ``method=hybrid`` share an index when they are equal)."""

    SOURCES = ("method",)
    k1: float
    b: float
    stopwords: str
    doc_template: str
