"""Reciprocal-rank fusion, pure layer: ranked lists of a query batch in, one fused ranking out.

Cormack, Clarke & Büttcher (SIGIR 2009), "Reciprocal rank fusion outperforms Condorcet and
individual rank learning methods", with a weight per list:

    score(q, d) = Σ_l  w_l / (k + rank_l(q, d)),    rank_l from 1; a list without d adds nothing.

A list is a ``(n_q, depth_l)`` int array of document indices, best first, ``-1`` where it has no
hit (a padded slot keeps its rank position: ``rank = column + 1``). No I/O, no models.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def reciprocal_rank_fusion(rank_lists: Sequence[np.ndarray], k: float = 60.0,
                           weights: Sequence[float] | None = None, top_k: int | None = None,
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Weighted RRF of a batch, Cormack et al. 2009: ``score = Σ_l w_l / (k + rank_l)``.

    Ties break by the rank in the first list (absent: after every present one), then by the smaller
    document index. A document whose fused score is 0 (found only by lists of weight 0) is dropped.
    Returns ``(ids, scores)``, both ``(n_q, top_k)`` (``top_k=None``: ``Σ depth_l`` columns), best
    first, padded with ``-1`` / ``0.0``.
    """
    lists = [np.asarray(r, dtype=np.int64) for r in rank_lists]
    w = np.ones(len(lists)) if weights is None else np.asarray(weights, dtype=np.float64)
    if not lists or len(w) != len(lists) or not k > 0 or (w < 0).any():
        raise ValueError(f"need one weight >= 0 per list and k > 0, got {len(lists)} lists, weights {w}, k {k}")
    n_q = lists[0].shape[0]
    docs = np.concatenate([r.reshape(n_q, -1) for r in lists], axis=1)
    contrib = np.concatenate([np.broadcast_to(wl / (k + np.arange(1.0, r.shape[1] + 1)), r.shape)
                              for wl, r in zip(w, lists)], axis=1)
    first = np.full(docs.shape, np.inf)
    first[:, :lists[0].shape[1]] = np.arange(1.0, lists[0].shape[1] + 1)
    rows = np.broadcast_to(np.arange(n_q)[:, None], docs.shape)
    keep = docs >= 0  # row-major: within a query, list 0's entries before list 1's
    width = docs.shape[1] if top_k is None else top_k
    ids, scores = np.full((n_q, width), -1, dtype=np.int64), np.zeros((n_q, width))
    if not keep.any():
        return ids, scores
    q, d, c, f = rows[keep], docs[keep], contrib[keep], first[keep]
    order = np.lexsort((d, q))  # stable, so each (q, d) run is summed in list order
    q, d, c, f = q[order], d[order], c[order], f[order]
    start = np.flatnonzero(np.r_[True, (q[1:] != q[:-1]) | (d[1:] != d[:-1])])
    q, d, score, rank0 = q[start], d[start], np.add.reduceat(c, start), np.minimum.reduceat(f, start)
    live = score > 0
    q, d, score, rank0 = q[live], d[live], score[live], rank0[live]
    order = np.lexsort((d, rank0, -score, q))
    q, d, score = q[order], d[order], score[order]
    pos = np.arange(len(q)) - np.searchsorted(q, q)  # position within the query's fused ranking
    sel = pos < width
    ids[q[sel], pos[sel]], scores[q[sel], pos[sel]] = d[sel], score[sel]
    return ids, scores
