"""Exact row-wise top-k of a dense score block (queries x items), in time linear in the row.

Pure numpy: no I/O.
"""
from __future__ import annotations

import math

import numpy as np


def top_k_rows(scores: np.ndarray, k: int, tie_break: np.ndarray | None = None) -> np.ndarray:
    """The k best columns of each row, best first: by score, then by ``tie_break`` (same shape, larger first),
    then by lower index. Exact, ties included.

    The row is cut into about sqrt(n) blocks; the k-th largest block maximum is at most the row's k-th largest
    score, since k distinct items reach it. The items scoring at least that bound therefore hold the top k with
    every tie, and only they are sorted: one pass over the block instead of a selection per row.
    """
    q, n = scores.shape
    k = min(k, n)
    if k <= 0 or q == 0:
        return np.zeros((q, max(k, 0)), dtype=np.int64)
    n_blocks = min(n, max(k, math.isqrt(n)))
    block_max = np.maximum.reduceat(scores, (np.arange(n_blocks) * n) // n_blocks, axis=1)
    bound = np.partition(block_max, n_blocks - k, axis=1)[:, n_blocks - k]
    rows, cols = np.nonzero(scores >= bound[:, None])
    second = tie_break[rows, cols] if tie_break is not None else np.zeros(len(rows))
    order = np.lexsort((cols, -second, -scores[rows, cols], rows))  # the last key is the primary one
    rows, cols = rows[order], cols[order]
    rank = np.arange(len(rows)) - np.searchsorted(rows, np.arange(q))[rows]  # position within its row
    return cols[rank < k].reshape(q, k).astype(np.int64)
