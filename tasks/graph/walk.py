"""Restarted random walks / personalized PageRank: one batched kernel and its transition builders.

The kernel iterates x <- (1 - c) P x + c x0 (ZoomRAG eqs. 3, 5; LinearRAG eq. 6 with damping
d = 1 - c) for a block of restart vectors at once, a column per query. The methods differ only in
named parameters:

* the transition P: :func:`column_normalise` of an adjacency (ZoomRAG: mass moves from node j
  along column j) or :func:`random_walk` (LinearRAG: the row-normalised walk, transposed), sparse,
  dense, a batch of dense matrices (one local graph per query) or any callable operator;
* ``steps`` alone (ZoomRAG's T) or ``tol`` checked every ``check_every`` steps (LinearRAG);
* ``dangling``: nodes without out-edges whose mass jumps back by the restart vector (networkx's
  PageRank) instead of leaking (ZoomRAG, whose zero columns simply lose it);
* ``closed_form``: the fixed point c (I - (1 - c) P)^-1 x0 (ZoomRAG eq. 10) instead of iterating.

ZoomRAG's decoupled DocZoom walk keeps its own loop (tasks.methods.zoomrag.algorithm.decoupled_walk):
see there why; it shares :func:`inverse_column_sums` with :func:`column_normalise`.
Pure numpy / scipy.sparse: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence, Union

import numpy as np
import scipy.sparse as sp

from tasks.graph.spmm import csr_times_dense

Transition = Union[sp.sparray, np.ndarray, Callable[[np.ndarray], np.ndarray]]
Reset = Union[np.ndarray, sp.sparray, Sequence[Union[np.ndarray, sp.sparray]]]  # (Q, n), or its column blocks


def inverse_column_sums(adj: sp.sparray) -> tuple[np.ndarray, np.ndarray]:
    """Column sums of ``adj`` (float64) and their reciprocals, 0 for an empty column (ZoomRAG eq. 3's A~)."""
    col_sum = np.asarray(adj.sum(axis=0), dtype=np.float64).ravel()
    return col_sum, np.divide(1.0, col_sum, out=np.zeros(col_sum.shape[0]), where=col_sum > 0)


def column_normalise(adj: sp.sparray | np.ndarray) -> sp.csr_array | np.ndarray:
    """Column-stochastic A~ (ZoomRAG eq. 3) and nm(.) / B~ (eqs. 4, 5); zero columns stay zero.

    Dense input may be a batch (..., n, n) and is divided by its column sums (float64); sparse
    input is scaled by the reciprocal column sums, in its own dtype.
    """
    if sp.issparse(adj):
        out = sp.csr_array(adj, copy=True)
        out.data *= inverse_column_sums(out)[1][out.indices]
        return out
    sums = adj.sum(axis=-2, keepdims=True)
    return np.divide(adj, sums, out=np.zeros_like(adj, dtype=np.float64), where=sums > 0)


@dataclass(frozen=True)
class RandomWalk:
    """The walk over a graph: ``matrix`` (n, n) column-stochastic transitions
    (``matrix[j, i]`` = P(i -> j); the columns of ``dangling`` nodes, which have no edge, are 0).
    On a bipartite graph whose first ``split`` nodes form one side, ``to_second`` (rows: second side, columns:
    first) and ``to_first`` (the reverse) are the two non-zero blocks of ``matrix``; otherwise ``split`` is 0."""

    matrix: sp.csr_array
    dangling: np.ndarray
    split: int = 0
    to_second: sp.csr_array | None = None
    to_first: sp.csr_array | None = None


def random_walk(adj: sp.sparray, dtype: str | type = np.float64, split: int = 0) -> RandomWalk:
    """Row-normalised random walk on ``adj`` (``adj[i, j]`` = weight of i -> j), transposed: LinearRAG eq. (6)'s P.

    ``split`` > 0 declares the graph bipartite between nodes ``[0, split)`` and ``[split, n)`` (checked: an edge
    inside a side is an error) and keeps its two blocks for :func:`alternating_walk`.
    """
    adj = sp.csr_array(adj, dtype=np.float64)
    out_weight = np.asarray(adj.sum(axis=1)).ravel()
    inv_out = np.divide(1.0, out_weight, out=np.zeros_like(out_weight), where=out_weight != 0)
    matrix = (sp.diags_array(inv_out) @ adj).T.tocsr().astype(dtype)
    dangling = np.flatnonzero(out_weight == 0)
    if split <= 0:
        return RandomWalk(matrix, dangling)
    if matrix[:split, :split].count_nonzero() or matrix[split:, split:].count_nonzero():
        raise ValueError(f"the graph is not bipartite between nodes [0, {split}) and [{split}, {matrix.shape[0]})")
    return RandomWalk(matrix, dangling, split, matrix[split:, :split].tocsr(), matrix[:split, split:].tocsr())


def restarted_walk(transition: Transition, x0: np.ndarray, restart: float, steps: int, *,
                   tol: float | None = None, check_every: int = 4, dangling: np.ndarray | None = None,
                   closed_form: bool = False) -> np.ndarray:
    """Restarted walk x <- (1 - c) P x + c x0 from x = x0, ZoomRAG eqs. (3), (5); LinearRAG eq. (6).

    ``x0`` (..., n, q): a restart vector per column; ``transition`` P is applied as ``P @ x``
    (sparse or dense (n, n), or a batch (..., n, n) of dense graphs) or ``P(x)`` (a callable).
    Runs ``steps`` steps, or stops early once every column's L1 change in one step is < ``tol``
    (checked every ``check_every`` steps and at the last). ``dangling``: node indices whose mass
    (1 - c) * x[dangling] jumps back by x0 instead of leaking. ``closed_form``: the fixed point
    (:func:`stationary_walk`) instead. The state keeps x0's dtype when P has it.
    """
    if closed_form:
        if dangling is not None:
            raise ValueError("the closed form has no dangling redistribution")
        return stationary_walk(transition, x0, restart)
    follow = 1.0 - restart
    x, jump = x0.copy(), np.empty_like(x0)
    for it in range(steps):
        previous = x
        x = transition(previous) if callable(transition) else csr_times_dense(transition, previous)
        x *= x.dtype.type(follow)
        coef = np.float64(restart)
        if dangling is not None:  # teleport c plus the dangling mass (1 - c) * sum(x[dangling]) jump by x0
            coef = restart + follow * np.take(previous, dangling, axis=-2).sum(axis=-2, keepdims=True,
                                                                                  dtype=np.float64)
        np.multiply(x0, coef.astype(x0.dtype), out=jump)
        x += jump
        if tol is not None and (it % check_every == check_every - 1 or it == steps - 1) \
                and np.abs(x - previous).sum(axis=-2).max(initial=0.0) < tol:
            break
    return x


@dataclass(frozen=True)
class SidePatch:
    """Per-column changes to a bipartite walk's first -> second transitions: column i walks with
    ``to_second[dst[j], src[j]] + delta[j, i]`` (``src`` first-side nodes, ``dst`` second-side nodes counted
    from the split). ``scatter`` (second side x pairs) sums each pair into its ``dst``."""

    src: np.ndarray  # (P,)
    scatter: sp.csr_array  # (n - split, P), 1 at (dst[j], j)
    delta: np.ndarray  # (P, q)

    @classmethod
    def of(cls, src: np.ndarray, dst: np.ndarray, delta: np.ndarray, n_second: int) -> "SidePatch":
        """The patch of pairs (``src`` -> ``dst``) with per-column changes ``delta`` (P, q)."""
        pairs = len(src)
        scatter = sp.csr_array((np.ones(pairs), (np.asarray(dst, np.int64), np.arange(pairs))), shape=(n_second, pairs))
        return cls(np.asarray(src, np.int64), scatter, np.asarray(delta))

    def columns(self, cols: np.ndarray) -> "SidePatch":
        """The patch of columns ``cols`` only."""
        return SidePatch(self.src, self.scatter, np.ascontiguousarray(self.delta[:, cols]))


def alternating_walk(walk: RandomWalk, x0: np.ndarray, restart: float, steps: int, tol: float,
                     check_every: int = 4, nodes: int | None = None, patch: SidePatch | None = None) -> np.ndarray:
    """The restarted walk of :func:`restarted_walk` (with ``dangling``) on a bipartite ``walk``, by block
    Gauss-Seidel: each sweep updates the second side from the first, then the first from the second side's new
    values. It has the same fixed point, and each sweep shrinks the error by about (1 - c)^2 instead of 1 - c,
    for the cost of one power step (the two blocks hold the matrix's entries once). Stops like
    :func:`restarted_walk`: every column's L1 change over one sweep < ``tol``, checked every ``check_every``.
    Returns the state of every node, or of the first ``nodes`` only. ``patch``: column i walks on its own
    first -> second transitions (:class:`SidePatch`; their column sums must stay those of ``to_second``).
    """
    if walk.split <= 0 or walk.to_second is None or walk.to_first is None:
        raise ValueError("alternating_walk needs a bipartite RandomWalk (random_walk(..., split=n))")
    k, follow = walk.split, 1.0 - restart
    dtype = x0.dtype.type
    first_dangling, second_dangling = walk.dangling[walk.dangling < k], walk.dangling[walk.dangling >= k] - k
    to_second, to_first = walk.to_second.astype(x0.dtype, copy=False), walk.to_first.astype(x0.dtype, copy=False)
    r1, r2 = x0[:k], x0[k:]
    x1, x2 = r1.copy(), r2.copy()
    if patch is not None:
        patch_delta = patch.delta.astype(x0.dtype, copy=False)
        patch = replace(patch, scatter=patch.scatter.astype(x0.dtype, copy=False))

    def coef(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # teleport c + (1 - c) * dangling mass, per column
        mass = np.take(a, first_dangling, axis=0).sum(axis=0, keepdims=True, dtype=np.float64) \
            + np.take(b, second_dangling, axis=0).sum(axis=0, keepdims=True, dtype=np.float64)
        return (restart + follow * mass).astype(x0.dtype)

    y1, y2 = np.empty_like(x1), np.empty_like(x2)  # each sweep writes the spare states, then they swap
    buf1, buf2 = np.empty_like(x1), np.empty_like(x2)  # r * jump and the stopping test, without new arrays

    def moved(x: np.ndarray, old: np.ndarray, buf: np.ndarray) -> np.ndarray:  # per-column L1 change of a side
        np.subtract(x, old, out=buf)
        return np.abs(buf, out=buf).sum(axis=0)

    for it in range(steps):
        jump = coef(x1, x2)
        csr_times_dense(to_second, x1, out=y2)
        if patch is not None:  # each column's own changes on its pairs: y2[dst] += delta * x1[src]
            y2 += (patch.scatter @ (patch_delta * x1[patch.src])).astype(x0.dtype, copy=False)
        y2 *= dtype(follow)
        y2 += np.multiply(r2, jump, out=buf2)
        jump = coef(x1, y2)  # the second side's new values
        csr_times_dense(to_first, y2, out=y1)
        y1 *= dtype(follow)
        y1 += np.multiply(r1, jump, out=buf1)
        x1, y1, x2, y2 = y1, x1, y2, x2  # x: this sweep's states, y: the previous sweep's
        if (it % check_every == check_every - 1 or it == steps - 1) and \
                (moved(x1, y1, buf1) + moved(x2, y2, buf2)).max(initial=0.0) < tol:
            break
    return x1 if nodes is not None and nodes <= k else np.concatenate([x1, x2], axis=0)[:nodes]


def stationary_walk(transition: np.ndarray, x0: np.ndarray, restart: float) -> np.ndarray:
    """Fixed point of the restarted walk, x = c (I - (1 - c) P)^-1 x0, ZoomRAG eq. (10).

    Dense P (n, n) or a batch (..., n, n), one ``np.linalg.solve`` for all; x0 (..., n, q).
    """
    if not isinstance(transition, np.ndarray):
        raise TypeError("the closed form needs a dense transition matrix")
    system = np.eye(transition.shape[-1]) - (1.0 - restart) * transition
    return restart * np.linalg.solve(system, x0)


SWEEPS = ("power", "alternating")


def personalized_pagerank(adj: sp.sparray | RandomWalk, personalization: Reset,
                          damping: float = 0.5, tol: float = 1e-8, max_iter: int = 100,
                          dtype: str | type = np.float64, *, nodes: int | None = None, threads: int = 1,
                          sweeps: str = "power", patch: SidePatch | None = None) -> np.ndarray:
    """Personalized PageRank for a batch of reset vectors (Q x n), LinearRAG eq. (6).

    ``adj``: (n, n) weighted adjacency, ``adj[i, j]`` = weight of edge i -> j, or its prebuilt
    :func:`random_walk`. ``personalization``: (Q, n) non-negative reset mass, dense or sparse or a sequence of
    column blocks (:func:`restart_columns`), normalised per row here (an all-zero row gives an all-zero result). ``damping`` d is the probability of following
    an edge (networkx's ``alpha``; restart c = 1 - d); dangling nodes jump by the personalization
    (networkx's default). Stops when every query's L1 change in one step is < tol, checked every
    fourth step. ``dtype`` is the iteration's float type (the reset is normalised in float64
    first); float32 cannot reach tol below ~1e-7. Returns float64 (Q, n), or (Q, ``nodes``): the first
    ``nodes`` nodes only. ``threads`` > 1 walks that many blocks of queries at once (numpy and scipy's
    sparse product release the GIL); each block stops by the same rule on its own queries. ``sweeps``:
    ``power`` (x <- d P x + ..., :func:`restarted_walk`) or ``alternating`` (:func:`alternating_walk`: the same
    fixed point in about half the sweeps, for a bipartite walk built with ``random_walk(..., split=...)``).
    ``patch`` (alternating sweeps only): query i walks with its own first -> second transitions
    (:class:`SidePatch`, ``delta`` (P, Q)).
    """
    if sweeps not in SWEEPS:
        raise ValueError(f"sweeps must be one of {SWEEPS}, got {sweeps!r}")
    if patch is not None and sweeps != "alternating":
        raise ValueError("a per-query patch of the walk needs sweeps='alternating'")
    walk = adj if isinstance(adj, RandomWalk) else random_walk(adj, dtype)
    n_q, n = reset_shape(personalization)
    keep = n if nodes is None else nodes
    x0, total = restart_columns(personalization, dtype)
    live = np.flatnonzero(total > 0)
    result = np.zeros((n_q, keep))
    if live.size == 0:
        return result
    if live.size < n_q:
        x0 = np.ascontiguousarray(x0[:, live])
    matrix = walk.matrix.astype(dtype, copy=False)

    def run(cols: np.ndarray) -> np.ndarray:  # the live queries in cols (a range), as one block
        block = np.ascontiguousarray(x0[:, cols[0]:cols[-1] + 1])
        # 1 - (1 - d) == d exactly for d >= 0.5 (Sterbenz), so the kernel's follow probability is d itself there
        if sweeps == "alternating":
            own = None if patch is None else patch.columns(live[cols])
            return alternating_walk(walk, block, 1.0 - damping, max_iter, tol, nodes=keep, patch=own)
        return restarted_walk(matrix, block, 1.0 - damping, max_iter, tol=tol, check_every=4,
                              dangling=walk.dangling)[:keep]

    blocks = np.array_split(np.arange(live.size), min(max(threads, 1), live.size))
    if len(blocks) == 1:
        scores = [run(blocks[0])]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(blocks)) as pool:
            scores = list(pool.map(run, blocks))
    result[live] = np.hstack(scores).T
    return result


def restart_columns(personalization: Reset, dtype: str | type) -> tuple[np.ndarray, np.ndarray]:
    """(Q, n) reset mass → ((n, Q) columns in ``dtype``, each normalised to sum 1 in float64, and the (Q,) row
    totals): negatives clipped to 0, an all-zero row stays zero, no dense float64 (Q, n) copy made.
    ``personalization`` is one matrix, dense or sparse, or a sequence of them side by side (their columns
    concatenated: e.g. a dense passage block and a sparse entity block, never joined into one matrix)."""
    blocks = list(personalization) if isinstance(personalization, (list, tuple)) else [personalization]
    n_q, n = reset_shape(personalization)
    total = np.zeros(n_q)
    prepared = []
    for block in blocks:  # totals first: every block is divided by its rows' totals over all blocks
        if sp.issparse(block):
            coo = sp.coo_array(block)
            coo.sum_duplicates()
            data = np.clip(coo.data.astype(np.float64), 0.0, None)
            total += np.bincount(coo.row, weights=data, minlength=n_q)
            prepared.append((coo, data))
        else:
            block = np.asarray(block)
            if (block < 0).any():
                block = np.clip(block, 0.0, None)
            total += block.sum(axis=1, dtype=np.float64)
            prepared.append((block, None))
    out = np.zeros((n, n_q), dtype=dtype)
    divisor = np.where(total > 0, total, 1.0)
    offset = 0
    for block, data in prepared:
        width = block.shape[1]
        if data is not None:
            ok = total[block.row] > 0
            out[offset + block.col[ok], block.row[ok]] = data[ok] / total[block.row[ok]]
        else:
            np.divide(block.T, divisor[None, :], out=out[offset:offset + width], casting="unsafe")
        offset += width
    return out, total


def reset_shape(personalization: Reset) -> tuple[int, int]:
    """(Q, n) of a reset given as one matrix or as a sequence of column blocks (see :func:`restart_columns`)."""
    if isinstance(personalization, (list, tuple)):
        rows = {block.shape[0] for block in personalization}
        if len(rows) != 1:
            raise ValueError(f"the reset's column blocks have different numbers of rows: {sorted(rows)}")
        return rows.pop(), sum(block.shape[1] for block in personalization)
    return personalization.shape
