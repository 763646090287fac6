"""Hybrid baseline's params (``method=hybrid``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from tasks.methods.bm25.params import BM25Params
from tasks.core.limits import COUNT, COUNT0, POSITIVE, PROB


@dataclass(frozen=True)
class HybridParams:
    """``method=hybrid``: RRF of dense (first list) and BM25, each contributing its top ``*_depth``.

    ``k1``, ``b``, ``stopwords`` and ``doc_template`` are the BM25 index's keys, as in ``method=bm25``:
    equal values share its cached index, as the dense side shares ``method=dense``'s passage embeddings.
    """

    name: str = "hybrid"
    k: float = field(default=60.0, metadata=POSITIVE)
    dense_depth: int = field(default=100, metadata=COUNT)
    bm25_depth: int = field(default=100, metadata=COUNT)
    dense_weight: float = field(default=1.0, metadata=COUNT0)
    bm25_weight: float = field(default=1.0, metadata=COUNT0)
    # the BM25 index keys default to method=bm25's, so the two share one index
    k1: float = field(default=BM25Params.k1, metadata=COUNT0)
    b: float = field(default=BM25Params.b, metadata=PROB)
    stopwords: str = BM25Params.stopwords
    doc_template: str = BM25Params.doc_template
    top_k: int = field(default=10, metadata=COUNT)
    batch_size: int = field(default=256, metadata=COUNT)

    def __post_init__(self) -> None:
        if self.dense_weight + self.bm25_weight <= 0:
            raise ValueError("dense_weight + bm25_weight must be > 0 (with both 0 nothing is retrieved)")

    def bm25(self) -> BM25Params:
        """The BM25 side's params (index keys and depth)."""
        return BM25Params(k1=self.k1, b=self.b, stopwords=self.stopwords, doc_template=self.doc_template,
                          top_k=self.bm25_depth, batch_size=self.batch_size)
