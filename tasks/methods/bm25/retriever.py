"""BM25 baseline's online side: top-k passages by BM25 score over the stored index."""
from __future__ import annotations

import time

import bm25s
import numpy as np

from tasks.core.store import ArtifactRef
from tasks.eval.retrieve import Hits
from tasks.methods.bm25.params import BM25Params
from tasks.methods.bm25.stages import unpack


class BM25Retriever:
    """Online side of ``method=bm25``."""

    def __init__(self, documents: ArtifactRef, index: ArtifactRef, params: BM25Params) -> None:
        from tasks.core.store import Store

        self.doc_ids = np.asarray(Store.read(documents, ["doc_id"])["doc_id"].tolist(), dtype=object)
        self.model = unpack(Store.read_bytes(index))  # checked against its recorded hash
        self.params = params

    def search(self, questions: list[str], k: int) -> Hits:
        """Top-k passages by BM25 score."""
        t0 = time.perf_counter()
        tokens = bm25s.tokenize(questions, stopwords=self.params.stopwords, show_progress=False)
        t1 = time.perf_counter()
        idx, scores = self.model.retrieve(tokens, k=min(k, len(self.doc_ids)), show_progress=False, n_threads=1)
        t2 = time.perf_counter()
        idx = np.where(scores > 0, idx, -1)  # a passage sharing no query term is not retrieved
        return Hits(idx.astype(np.int64), scores, {"query_tokenize": t1 - t0, "search": t2 - t1})
