"""The greedy merge of :mod:`tasks.graph.encoding_tree`, compiled with numba (100,000 passages in seconds).

The same algorithm as ``encoding_tree._greedy_merge``: a lazy-deletion max-heap of (-R, a, b, version_a,
version_b) tuples, the same tie-break and stopping rule, and the same gain (:func:`tasks.graph.merge_gain.grown_gain`,
compiled). The bookkeeping differs: a community's neighbours are a list that may hold stale ids, resolved
by union-find when the community next merges, where the interpreted merge updates one dict per neighbour at
every merge (that was its cost: 1,835 s at 100,000 passages). Cut sums are added in list order, so on real
weights the two can differ in the last bits; on integer weights, where every sum is exact, they return the
same tree (tests check this), and on the 100k sample they returned the same partition.

numba compiles the kernel on first use and caches the machine code next to this file (``cache=True``), so
only the first process on a machine pays the compilation (a few seconds).
"""
from __future__ import annotations

import heapq
import math

import numpy as np
from numba import njit
from numba.typed import List

from tasks.graph.merge_gain import grown_gain

_grown_gain = njit(cache=True)(grown_gain)  # the interpreted merge's own gain, compiled


@njit(cache=True)
def _find(parent: np.ndarray, x: int) -> int:
    """Root of ``x``'s parent chain, compressing the path on the way (roots do not change)."""
    root = x
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:
        up = parent[x]
        parent[x] = root
        x = up
    return root


@njit(cache=True)
def _gather(near_ids: np.ndarray, near_cuts: np.ndarray, parent: np.ndarray, a: int, b: int, acc: np.ndarray,
            stamp: np.ndarray, mark: int, touched: np.ndarray, count: int, between: float) -> tuple[int, float]:
    """Resolve one (possibly stale) neighbour list of A or B to roots and sum it into ``acc``: a root seen for
    the first time at this merge (``stamp != mark``) is appended to ``touched``. A's entries towards B are
    dropped and B's entries towards A sum to c_AB (a list never points at its own root). Returns (count,
    c_AB so far)."""
    for i in range(near_ids.shape[0]):
        k = _find(parent, near_ids[i])
        if k == a or k == b:
            if k == a:
                between += near_cuts[i]
            continue
        if stamp[k] != mark:
            stamp[k] = mark
            acc[k] = near_cuts[i]
            touched[count] = k
            count += 1
        else:
            acc[k] += near_cuts[i]
    return count, between


@njit(cache=True)
def _merge_kernel(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, d: np.ndarray, vol: float,
                  threshold: float, neg_gain: np.ndarray, pair_a: np.ndarray, pair_b: np.ndarray) -> np.ndarray:
    """Parent pointers of the greedy merge; the initial heap holds the singleton pairs (neg_gain, a, b).

    A community's neighbours are a list of (node or community id, cut) entries that may be stale: an id
    merged away since stands for its root (union-find), and several entries may share one root. Merging A
    and B resolves and sums both lists into one fresh list (a scatter over ``acc``) and scores the new
    community against each neighbour; the neighbours' own lists are left stale, so a merge costs
    O(|list A| + |list B|) contiguous work instead of one dict update per neighbour.
    """
    n = indptr.shape[0] - 1
    parent = np.arange(n)
    log_vol = math.log2(vol)
    ids = List()
    cuts = List()
    for i in range(n):
        ids.append(indices[indptr[i]:indptr[i + 1]].copy())
        cuts.append(data[indptr[i]:indptr[i + 1]].copy())
    volume = d.copy()
    log_volume = np.zeros(n)
    for i in range(n):
        if volume[i] > 0:
            log_volume[i] = math.log2(volume[i])
    internal = np.zeros(n)
    version = np.zeros(n, dtype=np.int64)
    acc = np.zeros(n)
    stamp = np.full(n, -1, dtype=np.int64)
    touched = np.empty(n, dtype=np.int64)
    no_ids, no_cuts = np.empty(0, dtype=np.int64), np.empty(0)
    heap = List()
    for i in range(neg_gain.shape[0]):
        heap.append((neg_gain[i], pair_a[i], pair_b[i], np.int64(0), np.int64(0)))
    heapq.heapify(heap)
    listed = indices.shape[0]  # entries over all lists: >= the number of adjacent pairs, times 2
    n_merges = 0
    while len(heap) > 0:
        neg_r, a, b, version_a, version_b = heapq.heappop(heap)
        if version[a] != version_a or version[b] != version_b:
            continue  # stale: a or b merged since this entry was pushed
        if -neg_r <= threshold:
            break
        count, between = _gather(ids[a], cuts[a], parent, a, b, acc, stamp, n_merges, touched, 0, 0.0)
        count, between = _gather(ids[b], cuts[b], parent, a, b, acc, stamp, n_merges, touched, count, between)
        n_merges += 1
        listed += count - ids[a].shape[0] - ids[b].shape[0]
        new_ids = touched[:count].copy()
        new_cuts = np.empty(count)
        for j in range(count):
            new_cuts[j] = acc[new_ids[j]]
        ids[a] = new_ids
        cuts[a] = new_cuts
        ids[b] = no_ids  # not new_ids[:0]: a view would keep the whole buffer alive
        cuts[b] = no_cuts
        parent[b] = a
        v_ab = volume[a] + volume[b]
        in_ab = internal[a] + internal[b] + 2.0 * between
        l_ab = math.log2(v_ab)
        volume[a] = v_ab
        internal[a] = in_ab
        log_volume[a] = l_ab
        version[a] += 1
        version[b] = -1
        ver_a = version[a]
        for j in range(count):
            k = new_ids[j]
            r = _grown_gain(new_cuts[j], v_ab, in_ab, l_ab, volume[k], internal[k], log_volume[k], log_vol, vol)
            if r > threshold:
                if a < k:
                    heapq.heappush(heap, (-r, a, k, ver_a, version[k]))
                else:
                    heapq.heappush(heap, (-r, k, a, version[k], ver_a))
        if len(heap) > 2 * listed + 65536:  # drop stale entries once they dominate
            kept = List()
            for e in heap:
                if version[e[1]] == e[3] and version[e[2]] == e[4]:
                    kept.append(e)
            heapq.heapify(kept)
            heap = kept
    return parent


def greedy_merge_compiled(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, d: np.ndarray, vol: float,
                          threshold: float, neg_gain: np.ndarray, pair_a: np.ndarray,
                          pair_b: np.ndarray) -> np.ndarray:
    """:func:`_merge_kernel` on int64 / float64 copies of its inputs (numba compiles one signature)."""
    return _merge_kernel(np.ascontiguousarray(indptr, dtype=np.int64), np.ascontiguousarray(indices, dtype=np.int64),
                         np.ascontiguousarray(data, dtype=np.float64), np.ascontiguousarray(d, dtype=np.float64),
                         float(vol), float(threshold), np.ascontiguousarray(neg_gain, dtype=np.float64),
                         np.ascontiguousarray(pair_a, dtype=np.int64), np.ascontiguousarray(pair_b, dtype=np.int64))
