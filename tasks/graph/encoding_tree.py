"""Two-level structural-entropy encoding trees: eq. (1) at height K=2, its evaluators and an exact greedy merge.

A height-2 encoding tree is a root, one level of communities, then the nodes as leaves; it is the
same thing as a partition of the nodes. For a weighted graph W (zero diagonal, no negative entry),
degrees d_v = sum_u W_vu, vol = sum_v d_v, and for a community X: volume V_X = sum_{v in X} d_v,
cut g_X (weight leaving X) and internal weight in_X = V_X - g_X (over ordered pairs),

* H¹ = -sum_v (d_v/vol) log2(d_v/vol);
* H² = -sum_X (g_X/vol) log2(V_X/vol) - sum_X sum_{v in X} (d_v/vol) log2(d_v/V_X)     # eq. (1), K=2
     =  H¹ - (1/vol) sum_X in_X log2(vol/V_X)                                            (compact form).

Conventions, the same in every function here:

* 0 log 0 := 0: a node of degree 0 contributes nothing and is a community of its own;
* self-loops are dropped (the diagonal is zeroed) before anything is computed: eq. (7) takes a
  leaf's cut to be its degree, which only holds without them;
* negative, NaN or infinite weights and asymmetric matrices raise ValueError; an asymmetry within
  ``SYMMETRY_RTOL`` of the largest weight (rounding) is averaged away.

:func:`encoding_tree` is the flat greedy merge (Li–Pan): from singletons, repeatedly merge the
*adjacent* pair of communities whose merge lowers H² the most (:func:`merge_gain`), until no merge
lowers it by more than a tolerance. Pure numpy / scipy.sparse / heapq: no I/O.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from tasks.graph.merge_gain import grown_gain

SYMMETRY_RTOL = 1e-12


@dataclass(frozen=True)
class EncodingTree:
    """A height-2 encoding tree (eq. (1), K=2): one community per node, and its entropies."""

    community: np.ndarray  # (n,) int64, ids 0..c-1 numbered by each community's smallest node
    volume: np.ndarray  # (c,) float64, V_X = sum of the members' degrees
    entropy_1d: float  # H¹ of the graph
    entropy_2d: float  # H² of this partition, eq. (1) with K=2
    n_merges: int  # merges done, n - c

    @property
    def n_communities(self) -> int:
        """Number of communities c (singletons included)."""
        return int(self.volume.shape[0])


def symmetric_weights(adj: sp.sparray | np.ndarray) -> sp.csr_array:
    """A validated copy of ``adj``: float64 csr, diagonal dropped, explicit zeros removed (module doc).

    Raises ValueError for a non-square matrix, a negative / NaN / infinite weight, or an asymmetry
    larger than ``SYMMETRY_RTOL`` times the largest weight.
    """
    raw = sp.coo_array(adj)
    if raw.ndim != 2 or raw.shape[0] != raw.shape[1]:
        raise ValueError(f"the weight matrix must be square, got shape {raw.shape}")
    data = raw.data.astype(np.float64)
    if not np.isfinite(data).all():
        raise ValueError("the weight matrix has NaN or infinite weights")
    if (data < 0).any():
        raise ValueError(f"the weight matrix has negative weights (min {data.min():.6g}): clip or shift them first")
    off = raw.row != raw.col  # self-loops dropped
    w = sp.csr_array((data[off], (raw.row[off], raw.col[off])), shape=raw.shape)  # duplicates summed
    w.eliminate_zeros()
    w.sort_indices()
    if w.nnz:
        gap = float(abs(w - w.T).max())
        if gap > SYMMETRY_RTOL * w.data.max():
            raise ValueError(f"the weight matrix is not symmetric (max |W - W^T| = {gap:.6g})")
        if gap > 0:
            w = sp.csr_array((w + w.T) * 0.5)
            w.eliminate_zeros()
            w.sort_indices()
    return w


def degrees(w: sp.csr_array) -> np.ndarray:
    """Weighted degrees d_v = sum_u W_vu of a validated matrix (:func:`symmetric_weights`)."""
    return np.asarray(w.sum(axis=1), dtype=np.float64).ravel()


def _xlog2_ratio(x: np.ndarray, num: np.ndarray, den: np.ndarray | float) -> float:
    """sum x * log2(num / den) over the entries with x > 0 (0 log 0 := 0)."""
    keep = x > 0
    den = den[keep] if isinstance(den, np.ndarray) else den
    return float(np.sum(x[keep] * np.log2(num[keep] / den)))


def structural_entropy_1d(adj: sp.sparray) -> float:
    """One-dimensional structural entropy H¹ = -sum_v (d_v/vol) log2(d_v/vol) (eq. (1) with K=1); 0 if vol = 0."""
    d = degrees(symmetric_weights(adj))
    vol = float(d.sum())
    return -_xlog2_ratio(d, d, vol) / vol if vol > 0 else 0.0


def structural_entropy_2d(adj: sp.sparray, community: np.ndarray) -> float:
    """H² of the partition ``community`` (any integer labels, one per node), straight from eq. (1), K=2. O(m).

    Sums the community terms -(g_X/vol) log2(V_X/vol) and the leaf terms -(d_v/vol) log2(d_v/V_X);
    0 for an edgeless graph.
    """
    w = symmetric_weights(adj)
    labels = _labels(community, w.shape[0])
    return _entropy_2d(w, degrees(w), labels)


def _labels(community: np.ndarray, n: int) -> np.ndarray:
    """Arbitrary integer labels → dense ids 0..c-1 (in label order); checks one label per node."""
    community = np.asarray(community)
    if community.shape != (n,) or not np.issubdtype(community.dtype, np.integer):
        raise ValueError(f"community must be {n} integer labels, got {community.dtype} {community.shape}")
    return np.unique(community, return_inverse=True)[1].astype(np.int64).ravel()


def _entropy_2d(w: sp.csr_array, d: np.ndarray, labels: np.ndarray) -> float:
    """Eq. (1) with K=2 on a validated matrix, its degrees and dense labels."""
    vol = float(d.sum())
    if vol <= 0:
        return 0.0
    c = int(labels.max()) + 1 if labels.size else 0
    coo = w.tocoo()
    src, dst = labels[coo.row], labels[coo.col]
    leaving = src != dst
    cut = np.bincount(src[leaving], weights=coo.data[leaving], minlength=c)
    volume = np.bincount(labels, weights=d, minlength=c)
    community_terms = _xlog2_ratio(cut, volume, vol)
    leaf_terms = _xlog2_ratio(d, d, volume[labels])
    return -(community_terms + leaf_terms) / vol


def merge_gain(vol_a: float, cut_a: float, vol_b: float, cut_b: float, between: float, vol: float) -> float:
    """Entropy reduction R = H²(before) - H²(after) of merging communities A and B (eq. (1), K=2; notes §1).

    ``vol_a``, ``cut_a``: V_A and g_A; likewise B; ``between``: c_AB, the weight between A and B; ``vol``:
    the graph's volume. R = (1/vol)[in_A log2(V_A/V_AB) + in_B log2(V_B/V_AB) + 2 c_AB log2(vol/V_AB)],
    with in_X = V_X - g_X and V_AB = V_A + V_B: the Li–Pan merge delta rearranged so that no two large
    terms cancel. R <= 0 when c_AB = 0, so only adjacent pairs are worth merging.
    """
    if vol <= 0:
        return 0.0
    return _gain(vol_a - cut_a, vol_a, vol_b - cut_b, vol_b, between, math.log2(vol), vol)


def _gain(in_a: float, v_a: float, in_b: float, v_b: float, between: float, log_vol: float, vol: float) -> float:
    """merge_gain from internal weights and volumes (0 log 0 := 0)."""
    v_ab = v_a + v_b
    if v_ab <= 0:
        return 0.0
    l_ab = math.log2(v_ab)
    r = 2.0 * between * (log_vol - l_ab)
    if in_a > 0:
        r += in_a * (math.log2(v_a) - l_ab)
    if in_b > 0:
        r += in_b * (math.log2(v_b) - l_ab)
    return r / vol


MERGE_ENGINES = ("compiled", "python")


def encoding_tree(adj: sp.sparray, tol: float = 1e-12, engine: str = "compiled") -> EncodingTree:
    """Height-2 encoding tree of ``adj`` by exact flat greedy merging (eq. (1), K=2; notes §2 family A).

    ``adj``: a symmetric non-negative weight matrix (see :func:`symmetric_weights` for the checks and
    the self-loop rule). Starting from singletons, the adjacent pair with the largest reduction R
    (:func:`merge_gain`) is merged, ties broken by the smaller then the larger community id (a
    community's id is its smallest node), until the best R <= tol * max(1, log2 vol): a tolerance
    *relative* to log2 vol, the scale of R's rounding error, floored at 1 so it stays positive. Each
    merge only changes the pairs touching the new community, so a lazy-deletion max-heap is exact.
    Every community is connected; zero-degree nodes stay singletons.

    ``engine``: ``compiled`` runs the merge as numba machine code (:mod:`tasks.graph.encoding_tree_compiled`),
    ``python`` in the interpreter; both do the same steps and return the same tree (tests check this).
    """
    if engine not in MERGE_ENGINES:
        raise ValueError(f"engine must be one of {MERGE_ENGINES}, got {engine!r}")
    w = symmetric_weights(adj)
    d = degrees(w)
    vol = float(d.sum())
    threshold = tol * max(1.0, math.log2(vol)) if vol > 0 else math.inf
    if engine == "compiled" and vol > 0 and w.shape[0] >= 2:
        from tasks.graph.encoding_tree_compiled import greedy_merge_compiled

        parent = greedy_merge_compiled(w.indptr, w.indices, w.data, d, vol, threshold,
                                       *_initial_pairs(w, d, vol, threshold))
    else:
        parent = _greedy_merge(w, d, vol, threshold)
    roots = _find_roots(parent)
    labels = np.unique(roots, return_inverse=True)[1].astype(np.int64).ravel()  # root = smallest member
    c = int(labels.max()) + 1 if labels.size else 0
    return EncodingTree(
        community=labels,
        volume=np.bincount(labels, weights=d, minlength=c).astype(np.float64),
        entropy_1d=-_xlog2_ratio(d, d, vol) / vol if vol > 0 else 0.0,
        entropy_2d=_entropy_2d(w, d, labels),
        n_merges=int(w.shape[0] - c),
    )


def _initial_pairs(w: sp.csr_array, d: np.ndarray, vol: float,
                   threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(-R, a, b) of every edge a < b whose singleton merge gains R > threshold (the heap's first entries)."""
    upper = sp.triu(w, k=1, format="coo")
    a, b, c = upper.row.astype(np.int64), upper.col.astype(np.int64), upper.data
    gain = 2.0 * c * (math.log2(vol) - np.log2(d[a] + d[b])) / vol if vol > 0 else np.zeros(0)
    keep = gain > threshold
    return -gain[keep], a[keep], b[keep]


def _initial_heap(w: sp.csr_array, d: np.ndarray, vol: float, threshold: float) -> list[tuple]:
    """Heap entries (-R, a, b, 0, 0) of :func:`_initial_pairs`."""
    neg_gain, a, b = _initial_pairs(w, d, vol, threshold)
    heap = list(zip(neg_gain.tolist(), a.tolist(), b.tolist(), [0] * a.size, [0] * a.size))
    heapq.heapify(heap)
    return heap


def _neighbour_dicts(w: sp.csr_array) -> list[dict[int, float]]:
    """Per node, {neighbour: weight} from a csr matrix with sorted indices (a stable order)."""
    ptr = w.indptr.tolist()
    cols, vals = w.indices.tolist(), w.data.tolist()
    return [dict(zip(cols[ptr[i]:ptr[i + 1]], vals[ptr[i]:ptr[i + 1]])) for i in range(w.shape[0])]


def _greedy_merge(w: sp.csr_array, d: np.ndarray, vol: float, threshold: float) -> np.ndarray:
    """Parent pointers (n,) of the greedy merge: each merged community points at its new community.

    State per community id (its smallest node): volume, internal weight, log2 volume, a version
    (bumped at each merge; -1 once merged away) and its neighbours' cut sums {k: c_Xk}. Heap entries
    (-R, a, b, version_a, version_b) with a < b are stale when either version moved on.
    """
    n = w.shape[0]
    parent = np.arange(n, dtype=np.int64)
    if vol <= 0 or n < 2:
        return parent
    log_vol = math.log2(vol)
    nbrs: list[dict[int, float] | None] = _neighbour_dicts(w)
    volume = d.tolist()
    log_volume = [math.log2(x) if x > 0 else 0.0 for x in volume]
    internal = [0.0] * n
    version = [0] * n
    heap = _initial_heap(w, d, vol, threshold)
    n_pairs = w.nnz // 2
    heappush, heappop, log2 = heapq.heappush, heapq.heappop, math.log2
    while heap:
        neg_r, a, b, version_a, version_b = heappop(heap)
        if version[a] != version_a or version[b] != version_b:
            continue  # stale: a or b merged since this entry was pushed
        if -neg_r <= threshold:
            break
        near_a, near_b = nbrs[a], nbrs[b]
        between = near_b.pop(a)
        del near_a[b]
        for k in near_b:
            del nbrs[k][b]
        n_pairs -= 1 + len(near_a) + len(near_b)
        if len(near_a) < len(near_b):  # fold the smaller dict into the larger (x + y == y + x)
            near_a, near_b = near_b, near_a
        for k, c in near_b.items():
            near_a[k] = near_a.get(k, 0.0) + c
        n_pairs += len(near_a)
        nbrs[a], nbrs[b] = near_a, None
        parent[b] = a
        v_ab = volume[a] + volume[b]
        in_ab = internal[a] + internal[b] + 2.0 * between
        l_ab = log2(v_ab)
        volume[a], internal[a], log_volume[a] = v_ab, in_ab, l_ab
        version[a] += 1
        version[b] = -1
        ver_a = version[a]
        for k, c in near_a.items():
            nbrs[k][a] = c
            r = grown_gain(c, v_ab, in_ab, l_ab, volume[k], internal[k], log_volume[k], log_vol, vol)
            if r > threshold:
                heappush(heap, (-r, a, k, ver_a, version[k]) if a < k else (-r, k, a, version[k], ver_a))
        if len(heap) > 4 * n_pairs + 65536:  # drop stale entries once they dominate
            heap = [e for e in heap if version[e[1]] == e[3] and version[e[2]] == e[4]]
            heapq.heapify(heap)
    return parent


def _find_roots(parent: np.ndarray) -> np.ndarray:
    """Root of every node's parent chain (pointer jumping until nothing moves)."""
    roots = parent.copy()
    while True:
        up = roots[roots]
        if np.array_equal(up, roots):
            return roots
        roots = up
