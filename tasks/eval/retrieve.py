"""Batched retrieval over any method, with per-query latency, and the retriever protocol.

A method's retriever answers a *batch* of questions at once; latency per query is the batch's
wall time divided by its size (that is what a batched server would see), split into the parts
the retriever reports (e.g. query encoding, search).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pandas as pd

from tasks.core.progress import progress_bar


@dataclass
class Hits:
    """Ranked results of a batch: ``doc_idx`` (q, k) int64 into the retriever's ``doc_ids`` (-1 = none)."""

    doc_idx: np.ndarray
    scores: np.ndarray
    parts: dict[str, float] = field(default_factory=dict)
    trace: list[dict] | None = None


class Retriever(Protocol):
    """What every method's online side provides."""

    doc_ids: np.ndarray

    def search(self, questions: list[str], k: int) -> Hits:
        """Rank documents for a batch of questions."""
        ...


def retrieve_all(retriever: Retriever, questions: pd.DataFrame, k: int, batch_size: int,
                 ) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """Run all questions in batches → (hits(qid, rank, doc_id, score), latency per query, traces). A query's
    latency is its batch's ms per query (``batch``: the batch's number)."""
    hit_rows, lat_rows, traces = [], [], []
    qids, texts = questions["qid"].tolist(), questions["question"].tolist()
    with progress_bar(len(texts), "retrieve", unit="question") as bar:
        for start in range(0, len(texts), batch_size):
            batch = texts[start:start + batch_size]
            t0 = time.perf_counter()
            hits = retriever.search(batch, k)
            ms = (time.perf_counter() - t0) * 1000 / len(batch)
            parts = {f"{p}_ms": s * 1000 / len(batch) for p, s in hits.parts.items()}
            for i, qid in enumerate(qids[start:start + batch_size]):
                lat_rows.append({"qid": qid, "batch": start // batch_size, "batch_size": len(batch), "ms": ms, **parts})
                keep = hits.doc_idx[i] >= 0
                ids = retriever.doc_ids[hits.doc_idx[i][keep]]
                hit_rows.extend(zip([qid] * len(ids), range(1, len(ids) + 1), ids, hits.scores[i][keep]))
            if hits.trace:
                traces.extend({"qid": q, **t} for q, t in zip(qids[start:start + batch_size], hits.trace))
            bar.update(len(batch))
    hits_df = pd.DataFrame(hit_rows, columns=["qid", "rank", "doc_id", "score"])
    return hits_df, pd.DataFrame(lat_rows), traces

