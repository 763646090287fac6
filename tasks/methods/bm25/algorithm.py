"""BM25 baseline's algorithm: tokenise and index a corpus with bm25s (Lucene-variant BM25, English stopwords)."""
from __future__ import annotations

import bm25s

from tasks.methods.bm25.params import BM25IndexParams


def build_bm25(texts: list[str], params: BM25IndexParams) -> bm25s.BM25:
    """Tokenise and index a corpus."""
    tokens = bm25s.tokenize(texts, stopwords=params.stopwords, show_progress=False)
    model = bm25s.BM25(k1=params.k1, b=params.b)
    model.index(tokens, show_progress=False)
    return model
