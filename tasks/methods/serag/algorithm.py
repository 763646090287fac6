"""SeRAG (the anonymous ICML submission, undated) equations: the multi-perspective graph (§3.1, eqs. 3–7), the localized
structural weight and token-free consolidation (§3.2, eqs. 8–9), and hybrid coarse-to-fine
scoring (§3.3, eqs. 10–13), batched over queries.

Pure numpy / scipy.sparse / faiss (pandas only to index chunk ids): no I/O. The encoding tree
(eq. 1, K = 2) comes from :mod:`tasks.graph.encoding_tree`; this module only needs its community id
per chunk. Under ``flows.commands.update`` the graph grows by the rows of new chunks (:func:`grow_layers`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

from tasks.graph.knn import check_search, knn_graph, knn_rows, symmetrised
from tasks.graph.sparse import log1p_transposed
from tasks.graph.topk import top_k_rows


@dataclass(frozen=True)
class GraphParams:
    """§3.1 / App. A.3 (Table 5) graph constants and the choices the paper leaves open."""

    lambda_sem: float = 0.45  # λ1 (Table 5)
    lambda_log: float = 0.45  # λ2 (Table 5); distance weight is 1 − λ1 − λ2 = 0.10
    k_sem: int = 20  # kNN semantic neighbours (Table 5)
    sigma_dist: float = 5.0  # σ_dist (Table 5)
    dist_window: int = 10  # App. A.3 "within a window of 10": read as |i − j| <= 10 inside one document
    max_entity_chunks: int = 50  # logical-layer cap: an entity in more chunks than this links none (no clique)
    semantic_only: bool = False  # Table 2 ablation: W = W_sem only (no logical / distance layer)
    # beyond the paper, for 100,000 passages: the kNN search of the semantic layer, exact (time ~ n²) or an inverted file
    knn_search: str = "auto"  # exact | ivf | auto: exact up to knn_exact_max chunks, ivf above
    knn_exact_max: int = 50_000
    ivf_nlist: int = 0  # k-means cells (0: sqrt(n))
    ivf_nprobe: int = 8  # cells searched per chunk

    def __post_init__(self) -> None:
        check_search(self.knn_search)


# ---------------------------------------------------------------- §3.1: the three layers


def semantic_layer(emb: np.ndarray, k: int, search: str = "exact", exact_max: int = 50_000, ivf_nlist: int = 0,
                   ivf_nprobe: int = 8) -> sp.csr_array:
    """Eq. 3 on the kNN-k graph (App. A.3): cosine of unit rows, union-symmetrised (a pair kept by
    either row, larger weight), self excluded; cosines clipped at 0 so W has no negative entries
    (the SE logs need vol, g > 0; notes §7). ``search`` (beyond the paper): exact, ivf (approximate lists) or
    auto (exact up to ``exact_max`` rows)."""
    g = knn_graph(emb, k=min(k, max(emb.shape[0] - 1, 1)), symmetrise="union", zero_diagonal=True,
                  search=search, exact_max=exact_max, ivf_nlist=ivf_nlist, ivf_nprobe=ivf_nprobe)
    g.data = np.maximum(g.data, 0.0)
    g.eliminate_zeros()
    return g


def logical_layer(chunk_entity: sp.sparray, max_entity_chunks: int | None) -> sp.csr_array:
    """Eq. 4: |E_i ∩ E_j| / max(|E_i|, |E_j|) from the (n × m) chunk–entity incidence, by one sparse product.

    Cap (our choice; the paper is silent, notes §7 "dense layers"): entities found in more than
    ``max_entity_chunks`` chunks are left out of the intersection (they would make an O(n²) clique),
    but still count in |E_i| (the denominator is the chunk's full entity set). Chunks without
    entities get no logical edge. Diagonal zeroed.
    """
    b = sp.csr_array(chunk_entity, dtype=np.float64, copy=True)
    b.data = (b.data > 0).astype(np.float64)
    b.eliminate_zeros()
    size = np.asarray(b.sum(axis=1)).ravel()
    if max_entity_chunks is not None:
        df = np.asarray(b.sum(axis=0)).ravel()
        b = b @ sp.diags_array((df <= max_entity_chunks).astype(np.float64))
    overlap = sp.coo_array(b @ b.T)
    keep = overlap.row != overlap.col
    r, c, v = overlap.row[keep], overlap.col[keep], overlap.data[keep]
    w = v / np.maximum(size[r], size[c])
    n = b.shape[0]
    out = sp.csr_array((w, (r, c)), shape=(n, n))
    out.eliminate_zeros()
    return out


def distance_layer(doc: np.ndarray, position: np.ndarray, sigma: float, window: int) -> sp.csr_array:
    """Eq. 5: exp(−(i − j)² / 2σ²) for chunks of the SAME document with |i − j| <= window, where i, j
    are positions inside the document (benchmark passages are independent documents: corpus order
    is never used). Symmetric, zero diagonal. A corpus of whole-passage chunks gets no edge."""
    doc, position = np.asarray(doc, np.int64), np.asarray(position, np.int64)
    n = doc.shape[0]
    order = np.lexsort((position, doc))
    rows, cols, vals = [], [], []
    for d in range(1, window + 1):  # `window` shifts of the sorted order, not a per-chunk loop
        a, b = order[:-d], order[d:]
        gap = position[b] - position[a]
        ok = (doc[a] == doc[b]) & (gap <= window) & (gap > 0)
        w = np.exp(-(gap[ok].astype(np.float64) ** 2) / (2.0 * sigma ** 2))
        rows += [a[ok], b[ok]]
        cols += [b[ok], a[ok]]
        vals += [w, w]
    if not rows:
        return sp.csr_array((n, n), dtype=np.float64)
    out = sp.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    return out


def source_positions(passage_source: np.ndarray, passage_start: np.ndarray, chunk_passage: np.ndarray,
                     chunk_position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(document, position) of every chunk for eq. 5 when passages were cut from source documents.

    ``passage_source`` (P,) the source document of each passage (any hashable; a passage that is its own
    document gives its own id), ``passage_start`` (P,) its character offset there; ``chunk_passage`` /
    ``chunk_position`` (n,) each chunk's passage row and position in it. A chunk's document is its passage's
    source; positions number a source document's chunks 0, 1, ... in reading order (passage start, then the
    position in the passage). A passage alone in its document keeps its chunks' positions."""
    chunk_passage, chunk_position = np.asarray(chunk_passage, np.int64), np.asarray(chunk_position, np.int64)
    source_code = pd.factorize(np.asarray(passage_source, dtype=object))[0][chunk_passage].astype(np.int64)
    n = chunk_passage.size
    order = np.lexsort((chunk_position, np.asarray(passage_start, np.int64)[chunk_passage], source_code))
    first = np.r_[True, source_code[order][1:] != source_code[order][:-1]] if n else np.zeros(0, bool)
    group_start = np.maximum.accumulate(np.where(first, np.arange(n), 0)) if n else np.zeros(0, np.int64)
    position = np.empty(n, np.int64)
    position[order] = np.arange(n) - group_start
    return source_code, position


def combine(sem: sp.sparray, log: sp.sparray | None, dist: sp.sparray | None, p: GraphParams) -> sp.csr_array:
    """Eq. 6: W = λ1 W_sem + λ2 W_log + (1 − λ1 − λ2) W_dist, symmetric, zero diagonal, no negatives.

    ``semantic_only`` (Table 2): W = W_sem alone (weight 1; a common scale does not change eq. 1's optimum).
    """
    if p.semantic_only or log is None or dist is None:
        w = sp.csr_array(sem, dtype=np.float64, copy=True)
    else:
        w = sp.csr_array(p.lambda_sem * sem + p.lambda_log * log + (1.0 - p.lambda_sem - p.lambda_log) * dist)
    w = sp.csr_array(w.maximum(w.T))  # layers are symmetric already; guards against rounding
    w.setdiag(0.0)
    w.data = np.maximum(w.data, 0.0)
    w.eliminate_zeros()
    w.sort_indices()
    return w


def multi_perspective_graph(emb: np.ndarray, chunk_entity: sp.sparray, doc: np.ndarray, position: np.ndarray,
                            p: GraphParams) -> tuple[sp.csr_array, dict[str, int]]:
    """§3.1: the unified adjacency W over chunks and the edge count of each layer."""
    sem = semantic_layer(emb, p.k_sem, p.knn_search, p.knn_exact_max, p.ivf_nlist, p.ivf_nprobe)
    if p.semantic_only:
        return combine(sem, None, None, p), {"sem_nnz": int(sem.nnz), "log_nnz": 0, "dist_nnz": 0}
    log = logical_layer(chunk_entity, p.max_entity_chunks)
    dist = distance_layer(doc, position, p.sigma_dist, p.dist_window)
    w = combine(sem, log, dist, p)
    return w, {"sem_nnz": int(sem.nnz), "log_nnz": int(log.nnz), "dist_nnz": int(dist.nnz)}


# ---------------------------------------------------------------- §3.2: eqs. 8–9


def structural_weight(adj: sp.sparray, community: np.ndarray) -> np.ndarray:
    """Eq. 8 for a K = 2 tree (notes §5): the path below β holds only the leaf v, g(v) = vol(v) = d_v,
    so W(v|β) = −p·log2 p with p = d_v / vol(β). 0·log 0 := 0; a singleton (p = 1) gets 0."""
    d = np.asarray(adj.sum(axis=1), dtype=np.float64).ravel()
    community = np.asarray(community, np.int64)
    vol = np.bincount(community, weights=d)
    denom = vol[community]
    p = np.divide(d, denom, out=np.zeros_like(d), where=denom > 0)
    out = np.zeros_like(p)
    pos = p > 0
    out[pos] = -p[pos] * np.log2(p[pos])
    return out


def _normalise(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


def consolidate(emb: np.ndarray, community: np.ndarray, weight: np.ndarray, n_communities: int) -> np.ndarray:
    """Eq. 9: h_β = Normalize(Σ W(v|β) h_v / Σ W(v|β)), one segment sum.

    Where Σ W(v|β) = 0 (a singleton community, or all members' p in {0, 1}) eq. 9 is 0/0: the
    unweighted mean of the members is used, so a singleton's vector is its chunk's vector (notes §8.7).
    """
    community = np.asarray(community, np.int64)
    n = emb.shape[0]
    member = sp.csr_array((np.ones(n), (community, np.arange(n))), shape=(n_communities, n))
    wsum = np.bincount(community, weights=weight, minlength=n_communities)
    weighted = member @ (emb.astype(np.float64) * weight[:, None])
    plain = member @ emb.astype(np.float64)
    h = np.where(wsum[:, None] > 0, weighted / np.where(wsum > 0, wsum, 1.0)[:, None], plain)
    return _normalise(h).astype(np.float32)


# ---------------------------------------------------------------- §3.3: eqs. 10–13


COMMUNITY_FILTERS = ("hard", "soft")
BONUS_NORMS = ("none", "query_entities")
BONUS_SCOPES = ("document", "passage")  # SeRAGParams.bonus_scope


@dataclass(frozen=True)
class ScoreParams:
    """App. A.3 (Table 5) retrieval constants and the Table 2 ``single_layer`` ablation."""

    gamma_c: float = 0.4  # γ_c
    gamma_f: float = 0.6  # γ_f
    k_coarse: int = 10  # candidate communities (one level at K = 2; notes §4)
    tau: float = 0.85  # entity denoising threshold (eq. 12)
    single_layer: bool = False  # Table 2: no community term and no community filter
    community_filter: str = "hard"  # hard (App. A.3) | soft (beyond the paper: γ_c term kept, every chunk ranked)
    bonus_norm: str = "none"  # none (eq. 13) | query_entities (beyond the paper: B over the query's gated entities)


def gated_similarity(name_emb: np.ndarray, vocab_emb: np.ndarray, tau: float, block_rows: int = 256
                     ) -> sp.csr_array:
    """(names × m) cosine between each name embedding and each vocabulary entity, kept only above τ
    (eq. 12's gate), computed in blocks of ``block_rows`` names (memory bound block_rows × m)."""
    m = vocab_emb.shape[0]
    rows, cols, vals = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for a in range(0, name_emb.shape[0], block_rows):
        # the vocabulary on the left: OpenBLAS ran (few names x d) @ (d x m) far below (m x d) @ (d x few names),
        # 11.1 against 6.9 ms for 3 names and 2Wiki's 30,011 entities, with equal results
        cos = (vocab_emb @ name_emb[a:a + block_rows].T).T
        r, c = np.nonzero(cos > tau)
        rows.append(a + r)
        cols.append(c)
        vals.append(cos[r, c].astype(np.float64))
    return sp.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                        shape=(name_emb.shape[0], m))


def query_entity_similarity(name_emb: np.ndarray, owner: np.ndarray, vocab_emb: np.ndarray, n_queries: int,
                            tau: float, block_rows: int = 256, name_row: np.ndarray | None = None
                            ) -> sp.csr_array:
    """sim(e, e_q) of eq. 12 as a sparse (q × m) matrix: cosine between the embedding of each query
    entity and each vocabulary entity, kept only above τ, max over the query's entities (our reading
    of sim(e, e_q) for several e_q).

    Pair ``i`` says query ``owner[i]`` holds the entity whose embedding is row ``name_row[i]`` of
    ``name_emb`` (default: row ``i``), so an entity several queries share is compared with the
    vocabulary once."""
    owner = np.asarray(owner, np.int64)
    name_row = np.arange(len(owner)) if name_row is None else np.asarray(name_row, np.int64)
    m = vocab_emb.shape[0]
    gated = gated_similarity(name_emb, vocab_emb, tau, block_rows)
    # each pair (q, u) → every gated (u, e, cos) entry of its name u: one repeat, no loop over pairs
    start, count = gated.indptr[name_row], np.diff(gated.indptr)[name_row]
    pair = np.repeat(np.arange(len(owner)), count)
    at = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count) + np.repeat(start, count)
    if not at.size:
        return sp.csr_array((n_queries, m), dtype=np.float64)
    key, v = owner[pair] * m + gated.indices[at], gated.data[at]
    order = np.lexsort((v, key))
    key, v = key[order], v[order]
    last = np.r_[key[1:] != key[:-1], True]  # the largest value of each (query, entity) pair
    return sp.csr_array((v[last], (key[last] // m, key[last] % m)), shape=(n_queries, m))


def entity_bonus(query_entity_sim: sp.sparray, chunk_entity: sp.sparray, tau: float,
                 log_counts: sp.csr_array | None = None, norm: str = "none") -> np.ndarray:
    """Eqs. 12–13, batched: B(q, v) = Σ_{e ∈ E_v, sim(e, e_q) > τ} sim(e, e_q) · log(1 + count(e, v)).

    ``query_entity_sim`` (q × m) holds sim(e, e_q) for each vocabulary entity e (max over the
    query's entities); ``chunk_entity`` (n × m) holds count(e, v). Natural log (eq. 13 gives no base).
    ``log_counts``: (m × n) :func:`tasks.graph.sparse.log1p_transposed` of ``chunk_entity``, for a caller that
    scores many batches. ``norm="query_entities"`` (beyond the paper): each query's B divided by the number of
    vocabulary entities it gates in (at least 1).
    """
    s = sp.csr_array(query_entity_sim, dtype=np.float64, copy=True)
    s.data = np.where(s.data > tau, s.data, 0.0)
    s.eliminate_zeros()
    if norm == "query_entities":
        s = sp.csr_array(sp.diags_array(1.0 / np.maximum(np.diff(s.indptr), 1)) @ s)
    log_counts = log1p_transposed(chunk_entity) if log_counts is None else log_counts
    return np.asarray((s @ log_counts).toarray(), dtype=np.float64)


def bonus_groups(chunk_passage: np.ndarray, passage_source: np.ndarray) -> tuple[np.ndarray, int] | None:
    """Each chunk's group for a document-scoped entity bonus (beyond the paper): the source document of its passage
    when that document was cut into several passages, else the chunk alone; ``(group, n_groups)``, or None when no
    document holds two passages (every group one chunk: the bonus is eq. 13's own, nothing to share).

    ``chunk_passage`` (n,) each chunk's passage row; ``passage_source`` (P,) each passage's source document (a
    passage that is its own document gives its own id)."""
    chunk_passage = np.asarray(chunk_passage, np.int64)
    source = pd.factorize(np.asarray(passage_source, dtype=object))[0].astype(np.int64)
    shared = (np.bincount(source) > 1)[source]  # the passage's document holds other passages too
    if not shared[chunk_passage].any():
        return None
    n = chunk_passage.size
    group = np.where(shared[chunk_passage], source[chunk_passage], source.max(initial=-1) + 1 + np.arange(n))
    codes, uniques = pd.factorize(group)
    return codes.astype(np.int64), len(uniques)


def document_bonus(bonus: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """(q × n) eq. 13's bonus of every chunk replaced by the largest of its group (:func:`bonus_groups`): a passage
    cut from a long document earns its document's bonus, so the entity match ranks documents and the passage's own
    cosine and community term rank the passages inside one (beyond the paper). B >= 0, so a group's max is >= 0."""
    return segment_reduce(bonus, group, n_groups, np.maximum, 0.0)[:, np.asarray(group, np.int64)]


def hybrid_scores(q_emb: np.ndarray, chunk_emb: np.ndarray, comm_emb: np.ndarray, community: np.ndarray,
                  bonus: np.ndarray, p: ScoreParams) -> tuple[np.ndarray, np.ndarray]:
    """Eqs. 10–11 for every (query, chunk) pair, and the candidate mask of the coarse step.

    S(q, v) = γ_c cos(h_q, h_β(v)) + γ_f [cos(h_q, h_v) + log(1 + B(q, v))]. Candidates: members
    of the k_coarse communities with the highest cos(h_q, h_β) (a hard filter; our reading of App.
    A.3). ``single_layer``: S = γ_f s_fine and every chunk a candidate. ``community_filter="soft"`` (beyond the
    paper): S as above, every chunk a candidate.
    """
    community = np.asarray(community, np.int64)
    s_fine = q_emb @ chunk_emb.T + np.log1p(bonus)
    if p.single_layer:
        return p.gamma_f * s_fine, np.ones(s_fine.shape, dtype=bool)
    cos_c = q_emb @ comm_emb.T  # (q × c)
    if p.community_filter == "soft":
        return p.gamma_c * cos_c[:, community] + p.gamma_f * s_fine, np.ones(s_fine.shape, dtype=bool)
    kc = min(p.k_coarse, cos_c.shape[1])
    top = np.argpartition(-cos_c, kc - 1, axis=1)[:, :kc]
    chosen = np.zeros(cos_c.shape, dtype=bool)
    np.put_along_axis(chosen, top, True, axis=1)
    return p.gamma_c * cos_c[:, community] + p.gamma_f * s_fine, chosen[:, community]


def rank_chunks(scores: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """(q × n) chunk order: candidates by score, then (fallback when fewer than k) the rest by score;
    ties by chunk index. One stable lexsort per row (key: outside the candidates, then −score)."""
    return np.lexsort((-scores, ~np.asarray(candidates, dtype=bool)), axis=1)


def segment_reduce(values: np.ndarray, group: np.ndarray, n_groups: int, ufunc: np.ufunc, fill) -> np.ndarray:
    """(q × n) → (q × n_groups): ``ufunc`` reduced over the columns of each group (``group[j]`` is
    column j's group), ``fill`` where a group has no column. One sort of the columns and one
    ``reduceat`` (not ``ufunc.at``, which is slow on q × n elements)."""
    group = np.asarray(group, np.int64)
    perm = np.argsort(group, kind="stable")
    g = group[perm]
    out = np.full((values.shape[0], n_groups), fill, dtype=np.result_type(values.dtype, np.asarray(fill).dtype))
    if g.size:
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        grouped = values if np.array_equal(perm, np.arange(perm.size)) else values[:, perm]
        if starts.size == g.size:  # one column per group (e.g. one chunk per passage): nothing to reduce
            out[:, g] = grouped
        else:
            out[:, g[starts]] = ufunc.reduceat(grouped, starts, axis=1)
    return out


def smallest_k(values: np.ndarray, k: int, distinct_below: int) -> np.ndarray:
    """``argsort(values, stable)[:, :k]`` per row, by argpartition when every row has at least k values
    below ``distinct_below`` and those are distinct (then no tie can reach the first k)."""
    if k < values.shape[1] and int((values < distinct_below).sum(axis=1).min(initial=values.shape[1])) >= k:
        part = np.argpartition(values, k - 1, axis=1)[:, :k]
        inner = np.argsort(np.take_along_axis(values, part, axis=1), axis=1, kind="stable")
        return np.take_along_axis(part, inner, axis=1)
    return np.argsort(values, axis=1, kind="stable")[:, :k]


def best_chunk_rank(chunk_order: np.ndarray, chunk_doc: np.ndarray, n_docs: int) -> np.ndarray:
    """(q × n_docs) each passage's best chunk's position in the ranked chunks; n (= no chunk) for none."""
    q, n = chunk_order.shape
    rank = np.empty_like(chunk_order)  # rank[i, chunk] = its position in row i's order
    np.put_along_axis(rank, chunk_order, np.broadcast_to(np.arange(n, dtype=chunk_order.dtype), (q, n)), axis=1)
    return segment_reduce(rank, chunk_doc, n_docs, np.minimum, n)


def rank_documents(chunk_order: np.ndarray, chunk_doc: np.ndarray, n_docs: int, k: int) -> np.ndarray:
    """Ranked chunks → ranked passages: a passage ranks at its best chunk's rank (q × min(k, n_docs));
    passages without a chunk come last, by index."""
    return smallest_k(best_chunk_rank(chunk_order, chunk_doc, n_docs), min(k, n_docs), chunk_order.shape[1])


def top_documents(scores: np.ndarray, candidates: np.ndarray, chunk_doc: np.ndarray, n_docs: int,
                  k: int) -> np.ndarray:
    """``rank_documents(rank_chunks(scores, candidates), chunk_doc, n_docs, k)`` without ordering every chunk.

    The chunk order ranks a chunk by (outside the candidates, −score, index), and a passage ranks at its best
    chunk. So a passage with a candidate chunk ranks by its best candidate score, ties by that chunk's index,
    ahead of every passage without one. When each query has at least k such passages, the top k come from
    :func:`tasks.graph.topk.top_k_rows` over the passages (time linear in the corpus); a query with fewer is
    ranked by the full chunk order.
    """
    q, n = scores.shape
    k = min(k, n_docs)
    chunk_doc = np.asarray(chunk_doc, np.int64)
    candidates = np.asarray(candidates, dtype=bool)
    inside = np.where(candidates, scores, -np.inf)
    best = segment_reduce(inside, chunk_doc, n_docs, np.maximum, -np.inf)  # best candidate score per passage
    has = segment_reduce(candidates, chunk_doc, n_docs, np.logical_or, False)
    at_best = candidates & (scores == np.take(best, chunk_doc, axis=1))
    first = segment_reduce(np.where(at_best, np.arange(n), n), chunk_doc, n_docs, np.minimum, n)
    docs = top_k_rows(np.where(has, best, -np.inf), k, tie_break=-first)
    short = np.flatnonzero(has.sum(axis=1) < k)  # fewer than k passages with a candidate chunk
    if short.size:
        docs[short] = rank_documents(rank_chunks(scores[short], candidates[short]), chunk_doc, n_docs, k)
    return docs


# ---------------------------------------------------------------- §3.1 under a growing corpus (flows.commands.update)


@dataclass(frozen=True)
class Layers:
    """The three §3.1 layers over ``ids`` (chunk ids, row order) and each entity's document frequency
    (chunks containing it, uncapped) at the time they were built: what an incremental update starts from."""

    ids: np.ndarray
    sem: sp.csr_array
    log: sp.csr_array
    dist: sp.csr_array
    entity_df: dict[str, int]


@dataclass(frozen=True)
class GrowthReport:
    """What :func:`grow_layers` computed: rows of new chunks (kNN against all, entity overlap against all,
    distance within their documents), old rows searched against the new chunks only, and old logical
    rows refreshed because an entity crossed the ``max_entity_chunks`` cap."""

    added: int
    removed: int
    kept: int
    rows_computed: int  # new chunks' rows
    rows_total: int
    log_rows_refreshed: int


def build_layers(ids: np.ndarray, emb: np.ndarray, chunk_entity: sp.sparray, entity_names: np.ndarray,
                 doc: np.ndarray, position: np.ndarray, p: GraphParams) -> Layers:
    """The three layers of a full build (eqs. 3–5), as :func:`multi_perspective_graph` computes them."""
    n = emb.shape[0]
    sem = semantic_layer(emb, p.k_sem, p.knn_search, p.knn_exact_max, p.ivf_nlist, p.ivf_nprobe)
    empty = sp.csr_array((n, n), dtype=np.float64)
    log = empty if p.semantic_only else logical_layer(chunk_entity, p.max_entity_chunks)
    dist = empty if p.semantic_only else distance_layer(doc, position, p.sigma_dist, p.dist_window)
    return Layers(np.asarray(ids, dtype=object), sem, log, dist, entity_frequency(chunk_entity, entity_names))


def layers_graph(layers: Layers, p: GraphParams) -> tuple[sp.csr_array, dict[str, int]]:
    """Eq. 6 over stored layers, and the edge count of each layer."""
    sizes = {"sem_nnz": int(layers.sem.nnz), "log_nnz": int(layers.log.nnz), "dist_nnz": int(layers.dist.nnz)}
    if p.semantic_only:
        return combine(layers.sem, None, None, p), sizes
    return combine(layers.sem, layers.log, layers.dist, p), sizes


def entity_frequency(chunk_entity: sp.sparray, entity_names: np.ndarray) -> dict[str, int]:
    """Chunks containing each entity, by entity string (stable across corpus versions); zeros left out."""
    b = sp.csr_array(chunk_entity)
    df = np.bincount(b.indices[b.data > 0], minlength=b.shape[1]) if b.nnz else np.zeros(b.shape[1], np.int64)
    return {str(entity_names[j]): int(df[j]) for j in np.flatnonzero(df)}


def _binary(chunk_entity: sp.sparray) -> sp.csr_array:
    b = sp.csr_array(chunk_entity, dtype=np.float64, copy=True)
    b.data = (b.data > 0).astype(np.float64)
    b.eliminate_zeros()
    return b


def logical_rows(chunk_entity: sp.sparray, rows: np.ndarray, max_entity_chunks: int | None) -> sp.csr_array:
    """Eq. 4 for the given rows only, against every chunk, symmetric (the rows' entries mirrored):
    one sparse product of the selected rows against all, so a full build's entries exactly."""
    b = _binary(chunk_entity)
    n = b.shape[0]
    size = np.asarray(b.sum(axis=1)).ravel()
    if max_entity_chunks is not None:
        df = np.asarray(b.sum(axis=0)).ravel()
        b = b @ sp.diags_array((df <= max_entity_chunks).astype(np.float64))
    rows = np.asarray(rows, np.int64)
    overlap = sp.coo_array(b[rows] @ b.T)
    r, c, v = rows[overlap.row], overlap.col.astype(np.int64), overlap.data
    keep = (r != c) & (v > 0)
    r, c, v = r[keep], c[keep], v[keep]
    w = v / np.maximum(size[r], size[c])
    half = sp.csr_array((w, (r, c)), shape=(n, n))
    return sp.csr_array(half.maximum(half.T))


def grow_layers(old: Layers, ids: np.ndarray, emb: np.ndarray, chunk_entity: sp.sparray, entity_names: np.ndarray,
                doc: np.ndarray, position: np.ndarray, p: GraphParams) -> tuple[Layers, GrowthReport]:
    """The layers of the current chunks (``ids`` with their embeddings, incidence, document and position,
    in the current row order) from the stored layers of an earlier corpus, computing only the rows
    involving new chunks; removed chunks' rows and columns are dropped.

    * distance (eq. 5): recomputed whole (it is linear in the chunks), so a source document that was edited, whose
      kept passages moved and whose new passages sit beside old ones, gets a full build's entries exactly.
    * logical (eq. 4): the new chunks' rows against all chunks, one sparse product; an old row is
      recomputed only when one of its entities crossed the ``max_entity_chunks`` cap (the stored
      document frequencies say which): a full build's entries exactly.
    * semantic (eq. 3, kNN-k, union): each new chunk's k nearest among all chunks, and each old chunk's
      k nearest among the new ones merged with its stored list (the k-th largest entry of a stored union
      row is that chunk's own k-th neighbour), so an old chunk gains an edge to a new one exactly when a
      full build would give it. APPROXIMATION (issue "flows.commands.update adds new chunks' graph rows without
      recomputing old ones"): old-old edges are not recomputed. A full build would drop an old pair
      whose only reason was a neighbour list that a new chunk has now entered, and, after removals,
      would add old pairs to refill the lists that lost a removed chunk; here old-old entries keep their
      stored values, and an old row that lost neighbours lets only new chunks compete for the free slots.
      With growth only, every edge involving a new chunk is a full build's edge.
    """
    ids = np.asarray(ids, dtype=object)
    n = ids.shape[0]
    old_pos = pd.Index(np.asarray(old.ids, dtype=object))
    where = old_pos.get_indexer(ids)  # old row of each current chunk, -1 for a new one
    is_old = where >= 0
    new_rows, kept_rows = np.flatnonzero(~is_old), np.flatnonzero(is_old)
    removed = int(old.ids.shape[0] - kept_rows.size)

    def carried(layer: sp.csr_array) -> sp.csr_array:
        """The stored layer's old-old block, in the current row order."""
        sub = sp.coo_array(layer[where[kept_rows]][:, where[kept_rows]])
        return sp.csr_array((sub.data, (kept_rows[sub.row], kept_rows[sub.col])), shape=(n, n))

    sem = _grow_semantic(carried(old.sem), old.sem[where[kept_rows]], emb, new_rows, kept_rows, p.k_sem)
    refreshed = 0
    if p.semantic_only:
        log = dist = sp.csr_array((n, n), dtype=np.float64)
    else:
        b = _binary(chunk_entity)
        df_now = np.asarray(b.sum(axis=0)).ravel()
        df_then = np.array([old.entity_df.get(str(e), 0) for e in entity_names], dtype=np.int64)
        cap = p.max_entity_chunks
        crossed = (df_now <= cap) != (df_then <= cap) if cap is not None else np.zeros(b.shape[1], bool)
        touched = kept_rows[np.asarray(b[kept_rows] @ crossed.astype(np.float64)).ravel() > 0]
        refreshed = int(touched.size)
        log = carried(old.log)
        if touched.size:  # drop the touched rows' stored entries (and their mirror), recompute below
            mask = np.zeros(n, bool)
            mask[touched] = True
            lc = sp.coo_array(log)
            keep = ~(mask[lc.row] | mask[lc.col])
            log = sp.csr_array((lc.data[keep], (lc.row[keep], lc.col[keep])), shape=(n, n))
        fresh = np.concatenate([new_rows, touched])
        if fresh.size:
            log = sp.csr_array(log.maximum(logical_rows(chunk_entity, fresh, cap)))
        # eq. 5 whole: linear in the chunks, and exact when an edited source document keeps some passages (their
        # positions move) or when its new passages sit beside old ones
        dist = distance_layer(doc, position, p.sigma_dist, p.dist_window)
    for m in (sem, log, dist):
        m.eliminate_zeros()
        m.sort_indices()
    layers = Layers(ids, sem, log, dist, entity_frequency(chunk_entity, entity_names))
    return layers, GrowthReport(added=int(new_rows.size), removed=removed, kept=int(kept_rows.size),
                                rows_computed=int(new_rows.size), rows_total=n, log_rows_refreshed=refreshed)


def _grow_semantic(carried: sp.csr_array, stored_rows: sp.csr_array, emb: np.ndarray, new_rows: np.ndarray,
                   kept_rows: np.ndarray, k_sem: int) -> sp.csr_array:
    """Semantic layer of :func:`grow_layers`: the carried old-old block plus every edge involving a new chunk."""
    n = emb.shape[0]
    k = min(k_sem, max(n - 1, 1))
    if new_rows.size == 0:
        return carried
    x = np.asarray(emb, dtype=np.float32)
    # new chunks' own lists: k nearest among all chunks, self excluded (all rows are searched; only
    # the new ones are queries)
    order = np.r_[new_rows, np.setdiff1d(np.arange(n), new_rows)]  # new rows first: query i is base row i
    r, c, v = knn_rows(x[new_rows], x[order], k, self_offset=0)
    v = v.astype(np.float64)
    rows, cols, vals = [new_rows[r]], [order[c]], [v]
    # old chunks' lists: their k nearest new chunks, merged with the stored row; a new chunk stays when it
    # ranks within the merged top k (the stored row holds the chunk's own top k, a union row's largest)
    if kept_rows.size:
        r, c, v = knn_rows(x[kept_rows], x[new_rows], k)
        v = v.astype(np.float64)
        merged = np.hstack([_row_top(sp.coo_array(stored_rows), k), _row_top(sp.coo_array(
            sp.csr_array((v, (r, c)), shape=(kept_rows.size, new_rows.size))), k)])
        kth = -np.partition(-merged, k - 1, axis=1)[:, k - 1]  # each old chunk's k-th best over all chunks
        ok = v >= kth[r]
        rows.append(kept_rows[r[ok]])
        cols.append(new_rows[c[ok]])
        vals.append(v[ok])
    directed = sp.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    new_edges = symmetrised(directed, "union")
    new_edges.data = np.maximum(new_edges.data, 0.0)
    out = sp.csr_array(carried.maximum(new_edges))  # disjoint: carried has no new row or column
    out.eliminate_zeros()
    return out


def _row_top(m: sp.coo_array, k: int) -> np.ndarray:
    """(rows × k) each row's k largest stored values, descending, padded with −inf."""
    out = np.full((m.shape[0], k), -np.inf)
    order = np.lexsort((-m.data, m.row))
    row, val = m.row[order], m.data[order]
    first = np.searchsorted(row, np.arange(m.shape[0]))
    rank = np.arange(row.size) - first[row]
    keep = rank < k
    out[row[keep], rank[keep]] = val[keep]
    return out
