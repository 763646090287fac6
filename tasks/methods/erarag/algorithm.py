"""EraRAG, pure layer: hyperplane-LSH hierarchy, selective updates, collapsed search.

Paper: EraRAG (Zhang et al., 2025; the docs' bibliography), section III, Algorithms 1-3.
numpy / faiss / pandas only: no I/O, no Prefect, no models, no LLM calls. The summariser
is a callback (``Summarise`` of :mod:`tasks.llm.summarize`, where the model-free extractive one
and the LLM one live).

Shapes: N nodes, d embedding dim, q queries; embeddings are float32 ``(n, d)`` and are
expected L2-normalised (the paper's v_i), so faiss inner product is a cosine.

Readings of spots the paper leaves open (a PDF conversion; formulas reconstructed from
the prose around them, not copied):

* hash(v) (section III-B) = [sign(v.h_1), ..., sign(v.h_k)]; bit j is 1 iff v.h_j > 0
  (a zero dot product counts as the negative side). Bit j is packed at position k-1-j of
  a uint64, so hyperplane 0 is the most significant bit; k <= 64. Projections run in
  float64 so a node hashes the same whether it is hashed alone or in a batch.
* Bucket adjustment (Alg. 1 lines 7-11, section III-C): "merged with adjacent ones
  B_{i-1} or B_{i+1} based on proximity in Hamming space". Read as: buckets sorted by
  code form a binary trie over the code bits; sibling subtrees differ in one bit, so
  merging bottom-up in the trie merges a bucket with its Hamming-closest neighbours in
  code order. Each trie node pools the leftovers (< S_min items) of its two children;
  a pool (or a bucket) of size >= S_min is cut into segments, a pool too small is passed
  up. A bucket larger than S_max is split into consecutive runs of its items in id order
  ("sub-buckets B_i^(1), B_i^(2)"). A leftover that reaches the root is absorbed into
  the last segment(s) emitted. The segmentation is therefore a function of the *set* of
  (code, id) pairs and of each subtree's contents only: a new item disturbs only segments
  on its bucket's root path, and a ``rebuild`` update equals a full build of the same set.
* Sizes: every segment lies in [S_min, S_max] whenever the layer size N is feasible,
  i.e. some k has k*S_min <= N <= k*S_max. Otherwise (N < S_min, or e.g. N in 13..15
  for 8/12) the layer is cut into the k = max(1, round(N / S_avg)) balanced parts.
* ``segment_avg`` S_avg: Exp-4 describes bounds as c_hat +- delta around a fixed average
  c_hat. When a pool can be cut into several valid segment counts, the count whose
  mean size is closest to S_avg is used (k = round(N / S_avg) clipped to the feasible
  range).
* Stopping rule (Alg. 1 line 16, printed "|G_{l-1}| < d + 1", a garbled carry-over of
  RAPTOR's rule): read with Alg. 3 line 14 ("create a new layer if N_current > S_max"),
  i.e. a layer is summarised only while it has more than ``stop_nodes`` nodes
  (default S_max) and fewer than ``max_layers`` summary layers exist.
* Alg. 3 / section III-E: a segment whose member set changed is re-summarised into a
  new node; the old node is deleted and its children re-attached to the new one; the
  new node is hashed with the stored hyperplanes at the next layer and the procedure
  repeats upwards. Here node ids are content hashes of the child id set (a Merkle id),
  so "segment unchanged" == "parent id already exists", and unchanged nodes keep their
  id, text, embedding and code. ``update_segmenting`` picks how a layer is cut again:
  ``local`` (the paper's Alg. 3, default) keeps the stored segments; a new node joins the
  segment of the stored node sharing its longest code prefix (its own bucket, or the
  Hamming-adjacent one when its bucket is new, lines 2 and 6-7), and only a segment pushed
  past S_max or under S_min is merged with its code-order neighbour and cut again (lines
  4-7). The result depends on the graph it grew from. ``rebuild`` (beyond the paper)
  recomputes each layer's partition as a build does (pure, O(N log N), no LLM), so an
  update equals a full build of the same leaves, at the price of re-cutting every pool a
  new item falls in (on 2Wiki at 5% growth 302 first-layer segments against 263, see the README).
* Deletion (``delete``) is our extension: leaves are removed and the same selective
  pass re-summarises only the segments whose membership changed, and their ancestors.
  ``replace_leaves`` does a deletion and an insertion in one such pass (a corpus edit).
* Alg. 2 "top-k under token budget T": the k best nodes by inner product, truncated to
  the longest prefix whose whitespace-token total fits T (RAPTOR's collapsed-tree rule,
  on which EraRAG builds). T defaults to 2000, RAPTOR's collapsed-tree setting; EraRAG
  gives no number.
* Biased search (section III-D): p = ``detail_proportion`` is the share of the k
  results taken from the leaf layer (detailed search with p, or summarised search with
  1 - p); round(p*k) from the leaves, the rest from summary layers, a shortfall in one
  group is filled from the other; the union is ranked by score, then the budget prefix
  applies. The paper gives no default p; 0.5 is used.
"""
from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Optional, Sequence

import faiss
import numpy as np
import pandas as pd

from tasks.llm.summarize import Summarise, SummaryRequest
from tasks.core.limits import COUNT, COUNT0, PROB, one_of, within


UPDATE_SEGMENTING = ("local", "rebuild")


@dataclass(frozen=True)
class EraRAGParams:
    """EraRAG settings (Alg. 1-3); size bounds are Exp-4's c_hat +- delta = 10 +- 2."""

    n_hyperplanes: int = field(default=20, metadata=within("[1, 64]"))
    seed: int = 0
    segment_min: int = field(default=8, metadata=within("[2, inf)"))
    segment_avg: int = field(default=10, metadata=within("[2, inf)"))
    segment_max: int = field(default=12, metadata=within("[2, inf)"))
    max_layers: int = field(default=5, metadata=COUNT0)
    # summarise a layer only if it has more nodes; None = segment_max
    stop_nodes: Optional[int] = field(default=None, metadata=COUNT)
    summary_tokens: int = field(default=100, metadata=COUNT)
    top_k: int = field(default=10, metadata=COUNT)
    token_budget: int = field(default=2000, metadata=COUNT)
    biased: bool = False
    detail_proportion: float = field(default=0.5, metadata=PROB)
    # local: Alg. 3 (stored segments kept) | rebuild: re-cut as a build would
    update_segmenting: str = field(default="local", metadata=one_of(UPDATE_SEGMENTING))

    def __post_init__(self) -> None:
        if not 1 <= self.n_hyperplanes <= 64:
            raise ValueError("n_hyperplanes must be in 1..64 (codes are packed into uint64)")
        if not 2 <= self.segment_min <= self.segment_avg <= self.segment_max:
            raise ValueError("need 2 <= segment_min <= segment_avg <= segment_max (S_min > 1, Thm. 2)")
        if self.stop_nodes is not None and self.stop_nodes < 1:
            raise ValueError("stop_nodes must be >= 1")
        if not 0.0 <= self.detail_proportion <= 1.0:
            raise ValueError("detail_proportion must be in [0, 1]")
        if self.update_segmenting not in UPDATE_SEGMENTING:
            raise ValueError(f"update_segmenting must be one of {UPDATE_SEGMENTING}, got {self.update_segmenting!r}")

    @property
    def stop_size(self) -> int:
        """Largest layer that is not summarised further (Alg. 1 line 16, Alg. 3 line 14)."""
        return self.segment_max if self.stop_nodes is None else self.stop_nodes


# ---------------------------------------------------------------- LSH (section III-B)


def hyperplanes(dim: int, n: int, seed: int) -> np.ndarray:
    """Random hyperplane normals h_1..h_n ~ N(0, I_d), EraRAG Alg. 1 line 3; (n, dim) float32."""
    if not 1 <= n <= 64:
        raise ValueError("n must be in 1..64")
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def lsh_codes(emb: np.ndarray, planes: np.ndarray) -> np.ndarray:
    """Hyperplane LSH codes hash(v) = [sign(v.h_j)]_j packed into uint64, EraRAG section III-B."""
    planes = np.asarray(planes, dtype=np.float64)
    emb = np.asarray(emb, dtype=np.float64).reshape(-1, planes.shape[1])
    bits = (emb @ planes.T > 0).astype(np.uint64)
    shifts = np.arange(planes.shape[0] - 1, -1, -1, dtype=np.uint64)
    return np.bitwise_or.reduce(bits << shifts, axis=1).astype(np.uint64)


# ---------------------------------------------------------------- segmentation (Alg. 1 lines 6-11)


def feasible_size(m: int, params: EraRAGParams) -> bool:
    """Whether m items can be cut into segments all within [S_min, S_max] (section III-C)."""
    return m >= params.segment_min and -(-m // params.segment_max) <= m // params.segment_min


def cut_pool(items: np.ndarray, params: EraRAGParams) -> tuple[list[np.ndarray], np.ndarray]:
    """Split a bucket or pool into segments in [S_min, S_max], rest (< S_min) left over, Alg. 1 lines 8-11."""
    m = len(items)
    if m < params.segment_min:
        return [], items
    k_lo, k_hi = -(-m // params.segment_max), m // params.segment_min
    if k_lo <= k_hi:
        k = min(max(int(m / params.segment_avg + 0.5), k_lo), k_hi)
        return np.array_split(items, k), items[:0]
    take = k_hi * params.segment_max  # infeasible size: k_hi full segments, rest < S_min goes up
    return np.array_split(items[:take], k_hi), items[take:]


def _trie_merge(lo: int, hi: int, codes: list[int], items: np.ndarray, bounds: np.ndarray,
                params: EraRAGParams, out: list[np.ndarray]) -> np.ndarray:
    """Merge buckets codes[lo:hi] bottom-up over their code trie; returns the leftover, Alg. 1 lines 7-11."""
    if hi - lo == 1:
        segs, rest = cut_pool(items[bounds[lo]:bounds[lo + 1]], params)
        out.extend(segs)
        return rest
    shift = (codes[lo] ^ codes[hi - 1]).bit_length() - 1  # first bit (from the top) where they differ
    mid = bisect.bisect_left(codes, (codes[hi - 1] >> shift) << shift, lo, hi)
    left = _trie_merge(lo, mid, codes, items, bounds, params, out)
    right = _trie_merge(mid, hi, codes, items, bounds, params, out)
    segs, rest = cut_pool(np.concatenate([left, right]), params)
    out.extend(segs)
    return rest


def _cut_or_split(pool: np.ndarray, params: EraRAGParams) -> list[np.ndarray]:
    """Cut a pool into segments within bounds; where that is impossible (the whole layer is infeasible,
    the documented exception) into k = max(1, round(N / S_avg)) balanced parts."""
    if feasible_size(len(pool), params):
        return cut_pool(pool, params)[0]
    return np.array_split(pool, max(1, int(len(pool) / params.segment_avg + 0.5)))


def _absorb_leftover(segments: list[np.ndarray], rest: np.ndarray,
                     params: EraRAGParams) -> list[np.ndarray]:
    """Merge the root's leftover into the last segment(s) until the union is feasible (Alg. 1 line 11)."""
    if len(rest) == 0:
        return segments
    pool = rest  # < S_min, so never feasible alone
    while segments and not feasible_size(len(pool), params):
        pool = np.concatenate([segments.pop(), pool])
    return segments + _cut_or_split(pool, params)


def lsh_segments(codes: np.ndarray, ids: Sequence, params: EraRAGParams) -> list[np.ndarray]:
    """Bucket by LSH code, merge small / split large buckets into segments, EraRAG Alg. 1 lines 6-11.

    Returns position arrays into ``codes`` (each item exactly once), in trie order.
    """
    codes = np.asarray(codes, dtype=np.uint64)
    if len(codes) == 0:
        return []
    order = np.lexsort((np.asarray(ids), codes))  # by code, then id inside a bucket
    uniq, starts = np.unique(codes[order], return_index=True)
    bounds = np.append(starts, len(order))
    out: list[np.ndarray] = []
    rest = _trie_merge(0, len(uniq), [int(c) for c in uniq], order.astype(np.int64), bounds, params, out)
    return _absorb_leftover(out, rest, params)


def _nearest_kept(codes: np.ndarray, kept: np.ndarray, new: np.ndarray) -> np.ndarray:
    """For each ``new`` position, the ``kept`` position (kept is in code order) sharing the longest code
    prefix: its own bucket if it has one, else the trie-adjacent (Hamming-closest) bucket; ties to the lower."""
    p = np.searchsorted(codes[kept], codes[new])
    lo = kept[np.maximum(p - 1, 0)]
    hi = kept[np.minimum(p, len(kept) - 1)]
    return np.where((codes[new] ^ codes[hi]) < (codes[new] ^ codes[lo]), hi, lo)


def _repair_sizes(groups: list[np.ndarray], changed: list[bool], codes: np.ndarray, ids: np.ndarray,
                  params: EraRAGParams) -> list[np.ndarray]:
    """Alg. 3 lines 4-7: a segment outside [S_min, S_max] is merged with an adjacent segment in code order,
    the previous one if only it changes anyway (``changed``), else the next ones (the previous ones at the
    end), until the pool can be cut within bounds, then cut; every other segment stays as it is. Which
    neighbour is our choice (section III-E says only "adjacent"): one that changes anyway costs no summary."""
    out: list[np.ndarray] = []
    out_changed: list[bool] = []
    i = 0
    while i < len(groups):
        pool = groups[i]
        i += 1
        if params.segment_min <= len(pool) <= params.segment_max:
            out.append(pool), out_changed.append(changed[i - 1])
            continue
        if out and out_changed[-1] and not (i < len(groups) and changed[i]):
            pool = np.concatenate([out.pop(), pool])
            out_changed.pop()
        while not feasible_size(len(pool), params) and i < len(groups):
            pool, i = np.concatenate([pool, groups[i]]), i + 1
        while not feasible_size(len(pool), params) and out:
            pool = np.concatenate([out.pop(), pool])
            out_changed.pop()
        cut = _cut_or_split(pool[np.lexsort((ids[pool], codes[pool]))], params)
        out.extend(cut), out_changed.extend([True] * len(cut))
    return out


def local_segments(codes: np.ndarray, ids: Sequence, segment: np.ndarray, params: EraRAGParams,
                   stored_size: Optional[Sequence[int]] = None) -> list[np.ndarray]:
    """Selective re-segmenting of one layer, EraRAG Alg. 3 lines 2-8: the stored segments are kept.

    ``segment[i]`` is item i's stored segment (any int label), or -1 for an item new to this layer. A new
    item joins the segment of its nearest kept item by code prefix (its bucket, or the Hamming-adjacent
    one for a new bucket, lines 2 and 6-7); a segment left over S_max or under S_min is merged with a
    neighbour in code order and cut again (lines 4-7), preferring a neighbour that changes anyway: one
    that gained an item, or lost one (``stored_size[label]``, the stored segment's size, when given).
    Every other segment keeps exactly its members, so only segments that gained, lost or were re-cut
    change. Returns position arrays, each item once, in code order; with no kept item it is
    :func:`lsh_segments`.
    """
    codes = np.asarray(codes, dtype=np.uint64)
    ids = np.asarray(ids)
    segment = np.asarray(segment, dtype=np.int64).copy()
    if len(codes) == 0:
        return []
    order = np.lexsort((ids, codes))
    kept = order[segment[order] >= 0]
    if len(kept) == 0:
        return lsh_segments(codes, ids, params)
    new = np.flatnonzero(segment < 0)
    labels_kept, n_kept = np.unique(segment[kept], return_counts=True)
    if len(new):
        segment[new] = segment[_nearest_kept(codes, kept, new)]
    labels, inv = np.unique(segment[order], return_inverse=True)  # the same labels as labels_kept
    grouped = np.argsort(inv, kind="stable")  # by segment, code order inside
    sizes = np.bincount(inv, minlength=len(labels))
    members = np.split(order[grouped], np.cumsum(sizes)[:-1])
    changed = sizes != n_kept
    if stored_size is not None:
        changed |= n_kept != np.asarray(stored_size, dtype=np.int64)[labels_kept]
    first = np.full(len(labels), len(order))
    np.minimum.at(first, inv, np.arange(len(order)))
    seq = np.argsort(first, kind="stable")
    return _repair_sizes([members[g] for g in seq], changed[seq].tolist(), codes, ids, params)


# ---------------------------------------------------------------- hierarchy (Alg. 1, Alg. 3)


NODE_COLUMNS = ["node_id", "layer", "text", "parent_id", "code", "n_children"]


@dataclass(frozen=True)
class Hierarchy:
    """EraRAG graph G = {G_0..G_L}: one row per node, rows sorted by (layer, node_id).

    nodes: node_id (str; leaves keep the caller's id, summaries "L{layer}-<hash of child ids>"),
    layer (0 = leaves), text, parent_id (missing, pd.isna, on the top layer), code (uint64 LSH code),
    n_children (0 for leaves). embeddings: (len(nodes), d) float32, row-aligned with nodes.
    """

    nodes: pd.DataFrame
    embeddings: np.ndarray

    @property
    def n_layers(self) -> int:
        """Number of layers including the leaves (0 for an empty graph)."""
        return int(self.nodes["layer"].max()) + 1 if len(self.nodes) else 0


@dataclass(frozen=True)
class UpdateReport:
    """Per-layer effect of a build / update; row l >= 1 describes the segments of layer l-1.

    layers: layer, n_nodes (after), segments_total (= summary nodes at layer l),
    segments_resummarised (summarise calls), nodes_added, nodes_removed.
    """

    layers: pd.DataFrame

    @property
    def resummarised(self) -> int:
        """Total segments summarised (LLM calls) over all layers."""
        return int(self.layers["segments_resummarised"].sum())

    @property
    def segments_total(self) -> int:
        """Total segments (summary nodes) in the resulting graph."""
        return int(self.layers["segments_total"].sum())


@dataclass(frozen=True)
class _Layer:
    """Nodes of one layer during construction: ids, texts, embeddings, LSH codes."""

    ids: np.ndarray  # object array of str
    texts: list[str]
    emb: np.ndarray  # (n, d) float32
    codes: np.ndarray  # (n,) uint64


def node_id(layer: int, child_ids: Sequence[str]) -> str:
    """Deterministic summary-node id: layer + hash of the sorted child ids (segment identity, Alg. 3)."""
    digest = hashlib.sha1("\x1f".join(sorted(child_ids)).encode()).hexdigest()[:16]
    return f"L{layer}-{digest}"


@dataclass(frozen=True)
class _Known:
    """Summary nodes of the previous graph, by id: row, text, embedding, code (reused when unchanged)."""

    rows: dict[str, int]
    texts: np.ndarray
    emb: np.ndarray
    codes: np.ndarray

    @staticmethod
    def of(h: Optional[Hierarchy]) -> "_Known":
        """Index the summary nodes (layer >= 1) of ``h``; empty when there is no graph yet."""
        if h is None:
            return _Known({}, np.empty(0, dtype=object), np.empty((0, 0), np.float32), np.empty(0, np.uint64))
        rows = np.flatnonzero(h.nodes["layer"].to_numpy() > 0)
        ids = h.nodes["node_id"].to_numpy()[rows]
        return _Known(dict(zip(ids, rows)), h.nodes["text"].to_numpy(dtype=object), h.embeddings,
                      h.nodes["code"].to_numpy(dtype=np.uint64))


def _segment_layer(cur: _Layer, layer: int, known: _Known, summarise: Summarise, planes: np.ndarray,
                   params: EraRAGParams, stored: Optional[dict[str, str]] = None) -> tuple[np.ndarray, _Layer, int]:
    """Segment a layer; summarise only segments with no existing node, Alg. 1 l. 4-13 / Alg. 3 l. 3-13.

    ``stored`` (child id -> parent id of the previous graph's layer): keep those segments (Alg. 3,
    :func:`local_segments`); None: cut the layer as a build does (:func:`lsh_segments`)."""
    if stored is None:
        cut = lsh_segments(cur.codes, cur.ids, params)
    else:
        labels, parents = pd.factorize(pd.Series(cur.ids, dtype=object).map(stored))  # -1: new to this layer
        size = pd.Series(list(stored.values()), dtype=object).value_counts()
        cut = local_segments(cur.codes, cur.ids, labels, params, size.reindex(parents).to_numpy(np.int64))
    segs = [s[np.argsort(cur.ids[s], kind="stable")] for s in cut]
    pids = [node_id(layer, cur.ids[s]) for s in segs]
    parent_of = np.empty(len(cur.ids), dtype=object)
    for s, pid in zip(segs, pids):
        parent_of[s] = pid
    fresh = [i for i, pid in enumerate(pids) if pid not in known.rows]
    requests = [SummaryRequest(pids[i], layer, tuple(cur.ids[segs[i]]),
                               tuple(cur.texts[j] for j in segs[i]), cur.emb[segs[i]]) for i in fresh]
    texts: list[str] = [""] * len(segs)
    emb = np.zeros((len(segs), cur.emb.shape[1]), dtype=np.float32)
    codes = np.zeros(len(segs), dtype=np.uint64)
    if requests:
        new_texts, new_emb = summarise(requests)
        new_emb = np.asarray(new_emb, dtype=np.float32).reshape(len(requests), -1)
        for i, t in zip(fresh, new_texts):
            texts[i] = t
        emb[fresh], codes[fresh] = new_emb, lsh_codes(new_emb, planes)
    for i, pid in enumerate(pids):
        row = known.rows.get(pid)
        if row is not None:
            texts[i], emb[i], codes[i] = known.texts[row], known.emb[row], known.codes[row]
    return parent_of, _Layer(np.array(pids, dtype=object), texts, emb, codes), len(requests)


def _assemble(layers: list[_Layer], parents: list[np.ndarray]) -> Hierarchy:
    """Stack layers into a Hierarchy table sorted by (layer, node_id)."""
    n_children = [np.zeros(len(layers[0].ids), dtype=np.int64)]
    for p, nxt in zip(parents, layers[1:]):
        counts = pd.Series(p, dtype=object).value_counts()
        n_children.append(counts.reindex(nxt.ids).to_numpy(dtype=np.int64))
    parent_cols = parents + [np.full(len(layers[-1].ids), None, dtype=object)]
    nodes = pd.DataFrame({
        "node_id": np.concatenate([l.ids for l in layers]).astype(object),
        "layer": np.concatenate([np.full(len(l.ids), i, dtype=np.int64) for i, l in enumerate(layers)]),
        "text": [t for l in layers for t in l.texts],
        "parent_id": np.concatenate(parent_cols).astype(object),
        "code": np.concatenate([l.codes for l in layers]).astype(np.uint64),
        "n_children": np.concatenate(n_children),
    })
    emb = np.concatenate([l.emb for l in layers]).astype(np.float32)
    order = np.lexsort((nodes["node_id"].to_numpy().astype(str), nodes["layer"].to_numpy()))
    return Hierarchy(nodes.iloc[order].reset_index(drop=True), np.ascontiguousarray(emb[order]))


def _report(old: Optional[Hierarchy], new: Hierarchy, calls: list[int]) -> UpdateReport:
    """Per-layer node counts, summarise calls and added / removed node ids (UpdateReport)."""
    n_layers = max(new.n_layers, old.n_layers if old is not None else 0, 1)
    rows = []
    for l in range(n_layers):
        now = set(new.nodes.loc[new.nodes["layer"] == l, "node_id"])
        before = set() if old is None else set(old.nodes.loc[old.nodes["layer"] == l, "node_id"])
        rows.append({"layer": l, "n_nodes": len(now), "segments_total": len(now) if l else 0,
                     "segments_resummarised": calls[l - 1] if 0 < l <= len(calls) else 0,
                     "nodes_added": len(now - before), "nodes_removed": len(before - now)})
    return UpdateReport(pd.DataFrame(rows))


def _grow(leaves: _Layer, old: Optional[Hierarchy], summarise: Summarise, planes: np.ndarray,
          params: EraRAGParams) -> tuple[Hierarchy, UpdateReport]:
    """Build layers upward from the leaves, reusing each node of ``old`` whose segment is unchanged.

    With ``update_segmenting="local"`` each layer that ``old`` had keeps its stored segments (Alg. 3); a
    layer above them is cut afresh (Alg. 3 line 14). With "rebuild" every layer is cut as a build cuts it,
    so the result equals a build of the same leaves."""
    known = _Known.of(old)
    stored = _stored_parents(old) if old is not None and params.update_segmenting == "local" else []
    layers, parents, calls = [leaves], [], []
    while len(layers) - 1 < params.max_layers and len(layers[-1].ids) > params.stop_size:
        below = len(layers) - 1
        parent_of, nxt, n_calls = _segment_layer(layers[-1], len(layers), known, summarise, planes, params,
                                                 stored[below] if below < len(stored) else None)
        parents.append(parent_of), layers.append(nxt), calls.append(n_calls)
    h = _assemble(layers, parents)
    return h, _report(old, h, calls)


def _stored_parents(h: Hierarchy) -> list[dict[str, str]]:
    """Per layer below the top of ``h``: child id -> parent id (its stored segments)."""
    n = h.nodes
    linked = n[n["parent_id"].notna()]
    return [dict(zip(g["node_id"], g["parent_id"])) for _, g in linked.groupby("layer", sort=True)]


def _leaf_layer(ids: Sequence, emb: np.ndarray, planes: np.ndarray,
                texts: Optional[Sequence[str]]) -> _Layer:
    """Leaves as a layer: string ids, texts ("" when not given), float32 embeddings, LSH codes."""
    ids_arr = np.array([str(i) for i in ids], dtype=object)
    if len(set(ids_arr)) != len(ids_arr):
        raise ValueError("leaf ids must be unique")
    emb = np.asarray(emb, dtype=np.float32)
    if emb.ndim != 2 or len(emb) != len(ids_arr):
        raise ValueError("embeddings must be (n_ids, d)")
    texts = [""] * len(ids_arr) if texts is None else [str(t) for t in texts]
    return _Layer(ids_arr, texts, emb, lsh_codes(emb, planes))


def _stored_leaves(h: Hierarchy) -> _Layer:
    """The leaf layer of a hierarchy, with its stored codes."""
    rows = np.flatnonzero(h.nodes["layer"].to_numpy() == 0)
    leaves = h.nodes.iloc[rows]
    return _Layer(leaves["node_id"].to_numpy().astype(object), list(leaves["text"]),
                  h.embeddings[rows], leaves["code"].to_numpy().astype(np.uint64))


def build_hierarchy(leaf_ids: Sequence, leaf_emb: np.ndarray, summarise: Summarise,
                    planes: np.ndarray, params: EraRAGParams,
                    leaf_texts: Optional[Sequence[str]] = None) -> Hierarchy:
    """Hash, segment and summarise layer by layer with the same hyperplanes, EraRAG Alg. 1."""
    return build(leaf_ids, leaf_emb, summarise, planes, params, leaf_texts)[0]


def build(leaf_ids: Sequence, leaf_emb: np.ndarray, summarise: Summarise, planes: np.ndarray,
          params: EraRAGParams, leaf_texts: Optional[Sequence[str]] = None) -> tuple[Hierarchy, UpdateReport]:
    """``build_hierarchy`` plus its per-layer report (every segment summarised once), EraRAG Alg. 1."""
    return _grow(_leaf_layer(leaf_ids, leaf_emb, planes, leaf_texts), None, summarise, planes, params)


def insert(h: Hierarchy, new_ids: Sequence, new_emb: np.ndarray, summarise: Summarise,
           planes: np.ndarray, params: EraRAGParams,
           new_texts: Optional[Sequence[str]] = None) -> tuple[Hierarchy, UpdateReport]:
    """Add leaves hashed with the stored hyperplanes; re-summarise affected segments only, EraRAG Alg. 3."""
    new = _leaf_layer(new_ids, new_emb, planes, new_texts)
    old = _stored_leaves(h)
    clash = set(old.ids) & set(new.ids)
    if clash:
        raise ValueError(f"leaf ids already present: {sorted(clash)[:5]}")
    leaves = _Layer(np.concatenate([old.ids, new.ids]), old.texts + new.texts,
                    np.concatenate([old.emb, new.emb]), np.concatenate([old.codes, new.codes]))
    return _grow(leaves, h, summarise, planes, params)


def _kept(ids: np.ndarray, removed_ids: Sequence) -> np.ndarray:
    """Mask of the stored leaves that stay; unknown ids to remove are an error."""
    removed = {str(i) for i in removed_ids}
    unknown = removed - set(ids)
    if unknown:
        raise KeyError(f"unknown leaf ids: {sorted(unknown)[:5]}")
    return np.array([i not in removed for i in ids], dtype=bool)


def delete(h: Hierarchy, removed_ids: Sequence, summarise: Summarise, planes: np.ndarray,
           params: EraRAGParams) -> tuple[Hierarchy, UpdateReport]:
    """Remove leaves and re-summarise only the affected segments and ancestors (extension of Alg. 3)."""
    old = _stored_leaves(h)
    keep = _kept(old.ids, removed_ids)
    leaves = _Layer(old.ids[keep], [t for t, k in zip(old.texts, keep) if k], old.emb[keep], old.codes[keep])
    return _grow(leaves, h, summarise, planes, params)


def replace_leaves(h: Hierarchy, removed_ids: Sequence, new_ids: Sequence, new_emb: np.ndarray,
                   summarise: Summarise, planes: np.ndarray, params: EraRAGParams,
                   new_texts: Optional[Sequence[str]] = None) -> tuple[Hierarchy, UpdateReport]:
    """``delete`` then ``insert`` in one selective pass: a segment touched by both is summarised once.

    With ``update_segmenting="rebuild"`` equal to ``insert(delete(h, removed), new)`` in structure (both
    equal a rebuild of the final leaf set); each affected segment of the final graph costs one summarise
    call. With ``local`` the stored segments lose the removed leaves and gain the new ones in one pass.
    """
    old = _stored_leaves(h)
    keep = _kept(old.ids, removed_ids)
    d = h.embeddings.shape[1]
    new = _leaf_layer(new_ids, np.asarray(new_emb, dtype=np.float32).reshape(len(new_ids), d), planes, new_texts)
    clash = set(old.ids[keep]) & set(new.ids)
    if clash:
        raise ValueError(f"leaf ids already present: {sorted(clash)[:5]}")
    leaves = _Layer(np.concatenate([old.ids[keep], new.ids]),
                    [t for t, k in zip(old.texts, keep) if k] + new.texts,
                    np.concatenate([old.emb[keep], new.emb]), np.concatenate([old.codes[keep], new.codes]))
    return _grow(leaves, h, summarise, planes, params)


# ---------------------------------------------------------------- retrieval (Alg. 2, section III-D)


@dataclass(frozen=True)
class SearchResult:
    """Ranked node rows per query: indices (q, k) int64 with -1 padding, scores (q, k) with -inf."""

    indices: np.ndarray
    scores: np.ndarray


def whitespace_tokens(texts: Sequence[str]) -> np.ndarray:
    """Whitespace token count per node text, the unit of the token budget T (Alg. 2)."""
    return np.array([len(t.split()) for t in texts], dtype=np.int64)


def flat_topk(query_emb: np.ndarray, emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k (faiss.knn: IndexFlatIP's search, without copying ``emb`` into an index),
    padded to k with (-inf, -1)."""
    q = np.ascontiguousarray(query_emb, dtype=np.float32).reshape(len(query_emb), -1)
    scores = np.full((len(q), k), -np.inf, dtype=np.float32)
    idx = np.full((len(q), k), -1, dtype=np.int64)
    kk = min(k, len(emb))
    if kk > 0 and len(q):
        x = np.ascontiguousarray(emb, dtype=np.float32)  # a view when it is already float32 and contiguous
        scores[:, :kk], idx[:, :kk] = faiss.knn(q, x, kk, metric=faiss.METRIC_INNER_PRODUCT)
    return scores, idx


def _rows(emb: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``emb[rows]``, as a view when the rows are one increasing run (leaves are stored before summaries)."""
    if rows.size and rows[-1] - rows[0] == rows.size - 1:  # sorted and unique (np.flatnonzero): a run
        return emb[rows[0]:rows[-1] + 1]
    return emb[rows]


def _budget_prefix(scores: np.ndarray, idx: np.ndarray, node_tokens: np.ndarray,
                   budget: int) -> SearchResult:
    """Keep each ranking's longest prefix whose token total fits T, Alg. 2 line 2."""
    tokens = np.where(idx >= 0, np.asarray(node_tokens)[np.maximum(idx, 0)], 0)
    keep = (idx >= 0) & (np.cumsum(tokens, axis=1) <= budget)
    return SearchResult(np.where(keep, idx, -1), np.where(keep, scores, -np.inf).astype(np.float32))


def collapsed_search(query_emb: np.ndarray, node_emb: np.ndarray, node_tokens: np.ndarray,
                     node_layer: np.ndarray, params: EraRAGParams) -> SearchResult:
    """Collapsed-graph search: one flat IP index over all layers, top-k under budget T, EraRAG Alg. 2."""
    scores, idx = flat_topk(query_emb, node_emb, params.top_k)
    return _budget_prefix(scores, idx, node_tokens, params.token_budget)


def biased_search(query_emb: np.ndarray, node_emb: np.ndarray, node_tokens: np.ndarray,
                  node_layer: np.ndarray, params: EraRAGParams) -> SearchResult:
    """Biased search: round(p*k) leaf nodes + the rest from summary layers, EraRAG section III-D."""
    layer = np.asarray(node_layer)
    leaf, summ = np.flatnonzero(layer == 0), np.flatnonzero(layer > 0)
    k = params.top_k
    take_d = min(int(params.detail_proportion * k + 0.5), len(leaf))
    take_s = min(k - take_d, len(summ))
    take_d = min(k - take_s, len(leaf))  # fill a summary shortfall with leaves
    sd, idd = flat_topk(query_emb, _rows(node_emb, leaf), take_d)
    ss, ids = flat_topk(query_emb, _rows(node_emb, summ), take_s)
    scores = np.concatenate([sd, ss], axis=1)
    idx = np.concatenate([leaf[idd] if take_d else idd, summ[ids] if take_s else ids], axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")
    scores, idx = np.take_along_axis(scores, order, 1), np.take_along_axis(idx, order, 1)
    pad = k - scores.shape[1]
    scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
    idx = np.pad(idx, ((0, 0), (0, pad)), constant_values=-1)
    return _budget_prefix(scores, idx, node_tokens, params.token_budget)


def search(query_emb: np.ndarray, node_emb: np.ndarray, node_tokens: np.ndarray,
           node_layer: np.ndarray, params: EraRAGParams) -> SearchResult:
    """Dispatch on ``params.biased``: biased search (section III-D) or collapsed search (Alg. 2)."""
    fn = biased_search if params.biased else collapsed_search
    return fn(query_emb, node_emb, node_tokens, node_layer, params)
