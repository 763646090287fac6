"""Hybrid online side: the dense and BM25 retrievers over their own cached indexes, fused by RRF."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from tasks.core.store import ArtifactRef
from tasks.eval.retrieve import Hits
from tasks.methods.bm25.retriever import BM25Retriever
from tasks.methods.dense.retriever import DenseRetriever
from tasks.methods.hybrid.algorithm import reciprocal_rank_fusion
from tasks.text.embed import EmbedderParams
from tasks.methods.hybrid.params import HybridParams


class HybridRetriever:
    """Online side of ``method=hybrid``: both rankings of the batch, then one vectorised fusion."""

    def __init__(self, documents: ArtifactRef, doc_embeddings: ArtifactRef, bm25_index: ArtifactRef,
                 params: HybridParams, embedder: EmbedderParams) -> None:
        self.params = params
        self.dense = DenseRetriever(doc_embeddings, embedder)
        self.bm25 = BM25Retriever(documents, bm25_index, params.bm25())
        self.doc_ids = self.dense.doc_ids  # fused indices are dense's
        to_dense = pd.Index(self.doc_ids).get_indexer(self.bm25.doc_ids)
        if (to_dense < 0).any() or len(to_dense) != len(self.doc_ids):
            raise RuntimeError("the BM25 index and the passage embeddings hold different documents; "
                               "delete the artifacts")
        self.bm25_to_dense = np.append(to_dense, -1)  # index -1 (no hit) stays -1

    def search(self, questions: list[str], k: int) -> Hits:
        """Top-k passages by weighted RRF of the dense and BM25 top lists (ties: dense rank, then index)."""
        p = self.params
        dense = self.dense.search(questions, p.dense_depth)
        lexical = self.bm25.search(questions, p.bm25_depth)
        t0 = time.perf_counter()
        ids, scores = reciprocal_rank_fusion([dense.doc_idx, self.bm25_to_dense[lexical.doc_idx]], p.k,
                                             (p.dense_weight, p.bm25_weight), top_k=k)
        parts = {"query_encoding": dense.parts["query_encoding"], "dense_search": dense.parts["search"],
                 "query_tokenize": lexical.parts["query_tokenize"], "bm25_search": lexical.parts["search"],
                 "fusion": time.perf_counter() - t0}
        return Hits(ids, scores, parts)
