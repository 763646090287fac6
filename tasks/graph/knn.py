"""Similarity graphs over L2-normalised embeddings: exact kNN and row-wise sparsification.

Rows are unit vectors, so an inner product is a cosine. One builder, :func:`knn_graph`, serves
every method; its options combine, an entry is kept when it passes *every* test given:

* ``k``: the row's k largest weights (a kNN list; ties at the k-th value: any of them);
* ``min_similarity``: an absolute floor on the cosine, ``cos >= min_similarity``;
* ``k_std``: ZoomRAG's per-row statistical threshold (§3.1, after eq. 2): weights strictly above
  the row's mean + k_std * std (population std), self-pairs left out of the statistics;
* ``transform``: the edge weight as a function of the cosine (ZoomRAG: ``np.exp``), applied before
  the statistics and the top-k; it must be increasing, so the top-k by weight is the top-k by cosine;
* ``symmetrise``: "none" (the row-wise graph), "union" (i ~ j if either row kept the pair) or
  "mutual" (both rows kept it); a pair kept both ways gets the larger of its two weights;
* ``zero_diagonal``: self-pairs are neither neighbours nor part of the statistics;
* ``stats_sample``: with ``k`` and ``k_std`` together, each row's k best by faiss and the mean + k_std * std
  statistics from a seeded sample of that many columns (exact when the rows are no more): memory and
  output grow with n·k, not n² (ZoomRAG at 100,000 passages);
* ``search``: "exact" (faiss.knn, time n²·d), "ivf" (an inverted-file index of ``ivf_nlist`` k-means
  cells, ``ivf_nprobe`` searched per row: approximate, time ~ n²·d·nprobe/nlist) or "auto" (exact up to
  ``exact_max`` rows, ivf above; :func:`search_for`).

Weights are float64 in a ``sp.csr_array``. Pure numpy / scipy.sparse / faiss: no I/O.
"""
from __future__ import annotations

import warnings
from typing import Callable, Literal

import faiss
import numpy as np
import scipy.sparse as sp

Transform = Callable[[np.ndarray], np.ndarray]
Symmetrise = Literal["none", "union", "mutual"]


def mean_std_mask(weights: np.ndarray, k_std: float = 3.0) -> np.ndarray:
    """Row-wise keep-mask, entries strictly above row mean + k*std (ZoomRAG §3.1, after eq. 2).

    NaN cells (a masked diagonal) are left out of the statistics and never kept.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row keeps nothing
        mean = np.nanmean(weights, axis=1, keepdims=True)
        std = np.nanstd(weights, axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        return weights > mean + k_std * std


def top_k_mask(weights: np.ndarray, k: int) -> np.ndarray:
    """Row-wise keep-mask of the k largest entries (a kNN list); NaN cells are never kept."""
    missing = np.isnan(weights)
    k = min(k, weights.shape[1])
    mask = np.zeros(weights.shape, dtype=bool)
    if k > 0:
        best = np.argpartition(np.where(missing, np.inf, -weights), k - 1, axis=1)[:, :k]
        np.put_along_axis(mask, best, True, axis=1)
    return mask & ~missing


def keep_mask(weights: np.ndarray, floor: np.ndarray | None, k: int | None, k_std: float | None) -> np.ndarray:
    """Cells passing every test given: the cosine ``floor`` mask, the top-k and the mean + k*std rule."""
    keep = ~np.isnan(weights) if floor is None else floor & ~np.isnan(weights)
    if k_std is not None:
        keep &= mean_std_mask(weights, k_std)
    if k is not None:
        keep &= top_k_mask(weights, k)
    return keep


def sparsify(similarity: np.ndarray, *, k: int | None = None, min_similarity: float | None = None,
             k_std: float | None = None, transform: Transform | None = None) -> sp.csr_array:
    """A dense block of cosines (e.g. queries x documents) → the weights each row keeps (options as knn_graph).

    ZoomRAG's A_doc->qry is ``sparsify(cos, k_std=3.0, transform=np.exp)``, eq. (2) and §3.1.
    ``similarity`` is left untouched (a caller may still need the cosines).
    """
    _require_a_test(k, min_similarity, k_std)
    floor = None if min_similarity is None else similarity >= min_similarity
    weights = similarity if transform is None else transform(similarity)
    rows, cols = np.nonzero(keep_mask(weights, floor, k, k_std))
    return sp.csr_array((weights[rows, cols].astype(np.float64), (rows, cols)), shape=similarity.shape)


SEARCHES = ("exact", "ivf", "auto")


def check_search(search: str) -> None:
    """Refuse a neighbour search that is not one of :data:`SEARCHES`."""
    if search not in SEARCHES:
        raise ValueError(f"the kNN search must be one of {SEARCHES}, got {search!r}")


def search_for(n_rows: int, search: str = "auto", exact_max: int = 50_000) -> str:
    """The neighbour search a graph over ``n_rows`` rows uses: ``search`` itself, or for ``auto`` exact search up
    to ``exact_max`` rows and the inverted file above (beyond the papers: exact search costs n²·d time, at 100k
    rows 134 s against 19 s for a k = 20 graph here; README Scale)."""
    check_search(search)
    if search != "auto":
        return search
    return "exact" if n_rows <= exact_max else "ivf"


def knn_graph(emb: np.ndarray, *, k: int | None = None, min_similarity: float | None = None,
              k_std: float | None = None, transform: Transform | None = None, symmetrise: Symmetrise = "none",
              zero_diagonal: bool = True, block_rows: int = 1024, stats_sample: int | None = None,
              search: str = "exact", exact_max: int = 50_000, ivf_nlist: int = 0, ivf_nprobe: int = 8,
              seed: int = 0) -> sp.csr_array:
    """Sparse similarity graph over unit rows ``emb`` (n x d), built block_rows rows at a time (module doc).

    ZoomRAG's A_doc->doc is ``knn_graph(doc_emb, k_std=3.0, transform=np.exp)`` (eq. 2, §3.1);
    a kNN-k graph is ``knn_graph(emb, k=k, symmetrise="union")``. Peak memory: one block_rows x n block.
    """
    _require_a_test(k, min_similarity, k_std)
    search = search_for(emb.shape[0], search, exact_max)
    if search == "ivf" and k is None:
        raise ValueError("search='ivf' needs k: an inverted file answers nearest-neighbour lists only")
    if k is not None and (k_std is None or stats_sample is not None):  # each row's best k only: faiss
        index = ivf_index(emb, ivf_nlist, ivf_nprobe, seed) if search == "ivf" else None
        rows, cols, vals = _faiss_top_k(emb, k, min_similarity, transform, zero_diagonal, block_rows, index)
        if k_std is not None:  # the statistical rule on top of the k best, from (sampled) row statistics
            mean, std = sampled_row_stats(emb, stats_sample or emb.shape[0], transform, zero_diagonal,
                                          block_rows, seed)
            keep = vals > (mean + k_std * std)[rows]
            rows, cols, vals = rows[keep], cols[keep], vals[keep]
    else:
        rows, cols, vals = _dense_rows(emb, k, min_similarity, k_std, transform, zero_diagonal, block_rows)
    graph = sp.csr_array((vals, (rows, cols)), shape=(emb.shape[0], emb.shape[0]))
    return graph if symmetrise == "none" else symmetrised(graph, symmetrise)


def _require_a_test(k: int | None, min_similarity: float | None, k_std: float | None) -> None:
    if k is None and min_similarity is None and k_std is None:
        raise ValueError("give k, min_similarity or k_std: keeping every pair is a dense graph")


def _dense_rows(emb: np.ndarray, k: int | None, min_similarity: float | None, k_std: float | None,
                transform: Transform | None, zero_diagonal: bool,
                block_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, weights) kept by :func:`knn_graph` from exact blocks of emb @ emb.T.

    The statistical threshold needs every cell of a row (its mean and std), so each block of
    rows is the full blocked matrix product, not a nearest-neighbour search.
    """
    rows, cols, vals = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for start in range(0, emb.shape[0], block_rows):
        block = emb[start : start + block_rows] @ emb.T  # rows are unit vectors: dot = cos
        floor = None if min_similarity is None else block >= min_similarity
        if transform is not None:  # in place where it can: the block is ours
            block = transform(block, out=block) if isinstance(transform, np.ufunc) else transform(block)
        if zero_diagonal:
            local = np.arange(block.shape[0])
            block[local, start + local] = np.nan  # out of the statistics, never kept
        r, c = np.nonzero(keep_mask(block, floor, k, k_std))
        rows.append(r + start)
        cols.append(c)
        vals.append(block[r, c].astype(np.float64))
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)


def sampled_row_stats(emb: np.ndarray, sample: int, transform: Transform | None = None,
                      zero_diagonal: bool = True, block_rows: int = 1024,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each row's mean and population std of ``transform(cos)`` over a seeded sample of ``sample`` columns.

    With ``sample >= n`` every column is used, and the figures are the exact row statistics of
    :func:`mean_std_mask` (the diagonal left out when ``zero_diagonal``). Time n·sample·d, memory block_rows·sample.
    The sums of x and x² are kept in float64 and a row's own column is subtracted from them, so no block is
    copied or masked (NaN-aware reductions took 7 of this function's 12 s at 100k passages).
    """
    n = emb.shape[0]
    cols = np.arange(n) if sample >= n else np.sort(np.random.default_rng(seed).choice(n, sample, replace=False))
    base = np.ascontiguousarray(emb[cols])
    own_at = np.minimum(np.searchsorted(cols, np.arange(n)), cols.size - 1)  # where row i's own column would be
    own = zero_diagonal & (cols[own_at] == np.arange(n)) if cols.size else np.zeros(n, dtype=bool)
    s1, s2 = np.zeros(n), np.zeros(n)
    for start in range(0, n, block_rows):
        block = emb[start : start + block_rows] @ base.T
        if transform is not None:
            block = transform(block, out=block) if isinstance(transform, np.ufunc) else transform(block)
        stop = start + block.shape[0]
        s1[start:stop] = block.sum(axis=1, dtype=np.float64)
        s2[start:stop] = np.einsum("ij,ij->i", block, block, dtype=np.float64)
        r = np.flatnonzero(own[start:stop])  # a row's own column, where the sample holds it: out of the sums
        diag = block[r, own_at[start + r]].astype(np.float64)
        s1[start + r] -= diag
        s2[start + r] -= diag * diag
    count = cols.size - own.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # a one-column sample of itself: no statistics (NaN)
        mean = s1 / count
        var = np.maximum(s2 / count - mean * mean, 0.0)
    return mean.astype(emb.dtype), np.sqrt(var).astype(emb.dtype)


def ivf_index(base: np.ndarray, nlist: int = 0, nprobe: int = 8, seed: int = 0) -> faiss.Index:
    """An inner-product IVF-Flat index over ``base`` rows: ``nlist`` k-means cells (0: sqrt(n)), ``nprobe`` searched.

    Approximate: a row's true neighbour in an unsearched cell is missed. k-means is seeded, so the index,
    and every list searched in it, is the same from run to run.
    """
    x = np.ascontiguousarray(base, dtype=np.float32)
    n, d = x.shape
    # sqrt(n) cells, not faiss's usual 4-16·sqrt(n): every row is a query here, so k-means (~ n·nlist) weighs as
    # much as the search (~ n²·nprobe/nlist); at 100k, sqrt(n)/8 beat 4·sqrt(n)/16 in time and neighbour overlap
    # (README Scale)
    nlist = max(1, min(nlist or int(np.sqrt(n)), n // 39 or 1))  # faiss wants >= 39 training points per cell
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    index.train(x)
    index.add(x)
    index.nprobe = min(nprobe, nlist)
    return index


def knn_rows(query: np.ndarray, base: np.ndarray, k: int, *, self_offset: int | None = None,
             min_similarity: float | None = None, block_rows: int = 1024, index: faiss.Index | None = None,
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query row, base row, inner product) of each query row's k nearest base rows (faiss.knn, exact).

    ``self_offset``: query row i is base row ``self_offset + i`` and is not its own neighbour (one extra
    hit is asked for and the row itself dropped). Similarities are faiss's float32. ``index``: search this
    index of ``base`` (e.g. :func:`ivf_index`, approximate) instead of the exact product.
    """
    q = np.ascontiguousarray(query, dtype=np.float32)
    x = np.ascontiguousarray(base, dtype=np.float32)
    wanted = min(k + int(self_offset is not None), x.shape[0])
    if k <= 0 or wanted == 0 or q.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    rows, cols, sims = [], [], []
    for start in range(0, q.shape[0], block_rows):
        if index is None:
            sim, idx = faiss.knn(q[start : start + block_rows], x, wanted, metric=faiss.METRIC_INNER_PRODUCT)
        else:
            sim, idx = index.search(q[start : start + block_rows], wanted)
        row = np.broadcast_to(np.arange(start, start + idx.shape[0])[:, None], idx.shape)
        keep = idx >= 0
        if self_offset is not None:
            own = idx == row + self_offset
            keep &= ~own
            keep[~own.any(axis=1), -1] = False  # self tied outside the list: drop the extra hit instead
        if min_similarity is not None:
            keep &= sim >= min_similarity
        rows.append(row[keep])
        cols.append(idx[keep].astype(np.int64))
        sims.append(sim[keep])
    return np.concatenate(rows).astype(np.int64), np.concatenate(cols), np.concatenate(sims)


def _faiss_top_k(emb: np.ndarray, k: int, min_similarity: float | None, transform: Transform | None,
                 zero_diagonal: bool, block_rows: int,
                 index: faiss.Index | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, weights) of each row's k nearest rows by inner product (faiss.knn, or ``index``)."""
    rows, cols, sim = knn_rows(emb, emb, k, self_offset=0 if zero_diagonal else None,
                               min_similarity=min_similarity, block_rows=block_rows, index=index)
    weights = sim if transform is None else transform(sim)
    return rows, cols, weights.astype(np.float64)


def symmetrised(graph: sp.sparray, mode: Symmetrise) -> sp.csr_array:
    """Union or mutual graph of a row-wise (directed) one; a pair kept both ways gets its larger weight."""
    if mode not in ("union", "mutual"):
        raise ValueError(f"unknown symmetrise mode {mode!r}")
    g = sp.coo_array(graph)
    g.sum_duplicates()
    n = g.shape[0]
    key = np.concatenate([g.row.astype(np.int64) * n + g.col, g.col.astype(np.int64) * n + g.row])
    vals = np.concatenate([g.data, g.data])
    order = np.argsort(key, kind="stable")
    key, vals = key[order], vals[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else np.zeros(0, np.int64)
    best = np.maximum.reduceat(vals, starts) if starts.size else vals
    both = np.diff(np.r_[starts, key.size]) == 2  # (i, j) and (j, i) both kept (or a self-loop)
    keep = both if mode == "mutual" else np.ones(starts.size, dtype=bool)
    cells = key[starts][keep]
    return sp.csr_array((best[keep], (cells // n, cells % n)), shape=g.shape)
