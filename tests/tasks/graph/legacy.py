"""Frozen copies of the pre-refactor implementations (commit cba35d8), kept as oracles.

tasks/graph replaced these ZoomRAG and LinearRAG functions; the tests check that the shared code and
the methods now built on it give bit-identical outputs. Copied verbatim; do not edit.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

# ---------------------------------------------------------------- tasks/methods/zoomrag/algorithm.py @ cba35d8


def mean_std_mask(scores: np.ndarray, k_std: float = 3.0) -> np.ndarray:
    """Row-wise keep-mask, entries strictly above row mean + k*std (ZoomRAG §3.1, after eq. 2).

    NaN cells (a masked diagonal) are left out of the statistics and never kept.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row keeps nothing
        mean = np.nanmean(scores, axis=1, keepdims=True)
        std = np.nanstd(scores, axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        return scores > mean + k_std * std


def sparsify_mean_std(scores: np.ndarray, k_std: float = 3.0) -> sp.csr_array:
    """Dense block -> sparse block of the entries kept by row mean + k*std (ZoomRAG §3.1)."""
    rows, cols = np.nonzero(mean_std_mask(scores, k_std))
    return sp.csr_array((scores[rows, cols].astype(np.float64), (rows, cols)), shape=scores.shape)


def exp_cos_sparsified(
    left: np.ndarray, right: np.ndarray, k_std: float, block_rows: int, skip_diagonal: bool
) -> sp.csr_array:
    """exp(cos) kept above row mean + k*std, built block_rows rows at a time (ZoomRAG eq. 2, §3.1).

    Peak memory is one block_rows x len(right) dense block, never the full matrix.
    """
    rows, cols, vals = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for start in range(0, left.shape[0], block_rows):
        block = left[start : start + block_rows] @ right.T  # rows are unit vectors: dot = cos
        np.exp(block, out=block)
        if skip_diagonal:
            local = np.arange(block.shape[0])
            block[local, start + local] = np.nan
        r, c = np.nonzero(mean_std_mask(block, k_std))
        rows.append(r + start)
        cols.append(c)
        vals.append(block[r, c].astype(np.float64))
    shape = (left.shape[0], right.shape[0])
    return sp.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=shape)


def doc_doc_block(doc_emb: np.ndarray, k_std: float = 3.0, block_rows: int = 1024) -> sp.csr_array:
    """A_doc->doc(i1, i2) = exp(cos(p_i1, p_i2)), no diagonal, row-sparsified (ZoomRAG eq. 2)."""
    return exp_cos_sparsified(doc_emb, doc_emb, k_std, block_rows, skip_diagonal=True)


def decoupled_walk(M: sp.sparray, H: sp.sparray, alpha: float = 0.8, steps: int = 5,
                   dtype: str | type = np.float64, out: np.ndarray | None = None) -> np.ndarray:
    """Algorithm-parallel restarted walk, ZoomRAG eqs. (3), (7)-(9): exact per-query walks on A_i.

    M is shared; each query keeps only its (N+1) state.  The column sum of node j in
    query i's graph is c_j + H_ij (eq. 7 denominator): c_j is shared, the H_ij term is a
    sparse patch at H's non-zeros.  Returns (q, 1+N): [query node, docs, entities], written
    into ``out`` when given. ``dtype`` is the state's float type (M is used as is when it
    already has it); at most two (N x q) state buffers are alive at once.
    """
    dtype = np.dtype(dtype)
    M = M if isinstance(M, sp.csr_array) and M.dtype == dtype else sp.csr_array(M, dtype=dtype)
    H = sp.csr_array(H, dtype=np.float64)
    H.sum_duplicates()
    H.eliminate_zeros()
    q, N = H.shape
    col_sum = np.asarray(M.sum(axis=0), dtype=np.float64).ravel()
    inv_col = np.divide(1.0, col_sum, out=np.zeros(N), where=col_sum > 0).astype(dtype)
    hc = H.tocoo()
    qi, jj, hv = hc.row, hc.col, hc.data
    inv_patch = (1.0 / (col_sum[jj] + hv)).astype(dtype)
    h_tilde = (hv / np.asarray(H.sum(axis=1)).ravel()[qi]).astype(dtype)  # query column of A_i (eq. 9 H~)
    hv = hv.astype(dtype)
    r_q, X = np.ones(q, dtype), np.zeros((N, q), dtype)  # r(0) = one-hot on the query node; X columns = queries
    Z = np.empty_like(X)  # reused each step: the per-query state is X and Z only
    for _ in range(steps):
        np.multiply(X, inv_col[:, None], out=Z)  # z_ij of eq. (7), laid out (N x q)
        Z[jj, qi] = X[jj, qi] * inv_patch
        to_query = np.bincount(qi, weights=hv * Z[jj, qi], minlength=q)
        del X  # M @ Z allocates the next state: free this one first
        X = M @ Z
        X[jj, qi] += h_tilde * r_q[qi]
        r_q = ((1.0 - alpha) * to_query + alpha).astype(dtype)
        X *= dtype.type(1.0 - alpha)
    del Z
    out = np.empty((q, 1 + N), dtype) if out is None else out
    out[:, 0] = r_q
    out[:, 1:] = X.T
    return out


def coupled_walk(M: sp.sparray, H: sp.sparray, alpha: float = 0.8, steps: int = 5) -> np.ndarray:
    """Naive coupled parallel walk: all queries in one joint graph (ZoomRAG App. H), eq. (3).

    Queries share doc/entity columns, so each query's walk leaks into the others'.
    Returns (q, 1+N): [own query node, docs, entities].
    """
    M, H = sp.csr_array(M, dtype=np.float64), sp.csr_array(H, dtype=np.float64)
    q, N = H.shape
    J = sp.block_array([[sp.csr_array((q, q)), H], [H.T, M]], format="csr")
    col_sum = np.asarray(J.sum(axis=0)).ravel()
    J.data *= np.divide(1.0, col_sum, out=np.zeros(q + N), where=col_sum > 0)[J.indices]
    R0 = np.zeros((q + N, q))
    R0[np.arange(q), np.arange(q)] = 1.0
    R = R0.copy()
    for _ in range(steps):
        R = (1.0 - alpha) * (J @ R) + alpha * R0
    return np.hstack([R[np.arange(q), np.arange(q)][:, None], R[q:].T])


def column_normalise(a: np.ndarray) -> np.ndarray:
    """Column-wise normalisation nm(.) and B~ of ZoomRAG eqs. (4), (5); zero columns stay zero."""
    sums = a.sum(axis=-2, keepdims=True)
    return np.divide(a, sums, out=np.zeros_like(a, dtype=np.float64), where=sums > 0)


def chunk_walk(
    B_tilde: np.ndarray, y0: np.ndarray, beta: float = 0.9, closed_form: bool = True, iterations: int = 50
) -> np.ndarray:
    """Restarted local walk: y = beta (I - (1-beta) B~)^-1 y0 (eq. 10) or iterations of eq. (5).

    Batched over leading axes: one np.linalg.solve for all padded local graphs.
    """
    if closed_form:
        system = np.eye(B_tilde.shape[-1]) - (1.0 - beta) * B_tilde
        return beta * np.linalg.solve(system, y0[..., None])[..., 0]
    y = y0.copy()
    for _ in range(iterations):
        y = (1.0 - beta) * (B_tilde @ y[..., None])[..., 0] + beta * y0
    return y


# ---------------------------------------------------------------- tasks/methods/linearrag/algorithm.py @ cba35d8


@dataclass(frozen=True)
class RandomWalk:
    """The walk of eq. (6) over a graph: ``matrix`` (n, n) column-stochastic transitions
    (``matrix[j, i]`` = P(i -> j); the columns of ``dangling`` nodes, which have no edge, are 0)."""

    matrix: sp.csr_array
    dangling: np.ndarray


def random_walk(adj: sp.sparray, dtype: str | type = np.float64) -> RandomWalk:
    """Transition matrix of the weighted adjacency ``adj`` (``adj[i, j]`` = weight of i -> j), built once per graph."""
    adj = sp.csr_array(adj, dtype=np.float64)
    out_weight = np.asarray(adj.sum(axis=1)).ravel()
    inv_out = np.divide(1.0, out_weight, out=np.zeros_like(out_weight), where=out_weight != 0)
    matrix = (sp.diags_array(inv_out) @ adj).T.tocsr().astype(dtype)
    return RandomWalk(matrix, np.flatnonzero(out_weight == 0))


def personalized_pagerank(
    adj: sp.sparray | RandomWalk,
    personalization: np.ndarray,
    damping: float = 0.5,
    tol: float = 1e-8,
    max_iter: int = 100,
    dtype: str | type = np.float64,
) -> np.ndarray:
    """Personalized PageRank for a batch of reset vectors (Q x n), LinearRAG eq. (6).

    ``adj``: (n, n) weighted adjacency, ``adj[i, j]`` = weight of edge i -> j (symmetric for
    the undirected passage-entity graph), or its prebuilt :func:`random_walk`.
    ``personalization``: (Q, n) non-negative reset mass, normalised per row here (an
    all-zero row gives an all-zero result). ``damping`` is the probability of following an
    edge (networkx's ``alpha``); dangling nodes jump by the personalization (networkx's
    default). Stops when every query's L1 change in one iteration is < tol (checked every
    fourth iteration). ``dtype`` is the iteration's float type (the reset is normalised in
    float64 first); float32 cannot reach tol below ~1e-7.
    """
    walk = adj if isinstance(adj, RandomWalk) else random_walk(adj, dtype)
    dangling, walk = walk.dangling, walk.matrix.astype(dtype, copy=False)
    reset = np.clip(np.asarray(personalization, dtype=np.float64), 0.0, None)
    total = reset.sum(axis=1)
    result = np.zeros_like(reset)
    live = np.flatnonzero(total > 0)  # an all-zero reset row stays all zero, no iteration needed
    if live.size == 0:
        return result
    reset = np.ascontiguousarray((reset[live] / total[live, None]).T, dtype=dtype)  # (n, Q'): a column per query
    scores, jump = reset.copy(), np.empty_like(reset)
    for it in range(max_iter):
        previous = scores
        scores = walk @ previous
        scores *= reset.dtype.type(damping)
        # teleport (1 - d) plus the dangling mass d * sum(previous[dangling]) jump by the personalization
        coef = (1.0 - damping) + damping * previous[dangling].sum(axis=0, dtype=np.float64)
        np.multiply(reset, coef.astype(reset.dtype), out=jump)
        scores += jump
        if (it % 4 == 3 or it == max_iter - 1) and np.abs(scores - previous).sum(axis=0).max() < tol:
            break
    result[live] = scores.T
    return result
