"""Dense baseline's online side: faiss inner-product search over L2-normalised passage embeddings (= cosine)."""
from __future__ import annotations

import time

import numpy as np

from tasks.core.store import ArtifactRef
from tasks.eval.retrieve import Hits
from tasks.text.embed import EmbedderParams, encode_queries, load_embeddings
from tasks.methods.dense.algorithm import inner_product_index


class DenseRetriever:
    """Online side of ``method=dense``: encode the questions, search the index."""

    def __init__(self, doc_embeddings: ArtifactRef, embedder: EmbedderParams) -> None:
        self.doc_ids, emb = load_embeddings(doc_embeddings, "doc_id")
        self.index = inner_product_index(emb)
        self.embedder = embedder
        encode_queries(["warm-up"], embedder)  # load the model outside the timed path

    def search(self, questions: list[str], k: int) -> Hits:
        """Top-k passages by cosine similarity."""
        t0 = time.perf_counter()
        q = encode_queries(questions, self.embedder)
        t1 = time.perf_counter()
        scores, idx = self.index.search(q, min(k, self.index.ntotal))
        t2 = time.perf_counter()
        return Hits(idx.astype(np.int64), scores, {"query_encoding": t1 - t0, "search": t2 - t1})
