"""ZoomRAG (Hu et al.): DocZoom and ChunkZoom, the pure algorithm layer.

numpy / scipy.sparse only: no I/O, no Prefect, no models.

Reading of the paper (a PDF conversion; several equations came out garbled and
are reconstructed here from the prose around them):

* Eq. (1)/(6): the query links are symmetric, A_i = [[0, H_i], [H_i^T, M]] with
  M = [[A_doc->doc, D], [D^T, 0]] and D[i, j] = 1[e_j in p_i] (doc x entity).
  The transposes in the printed eq. (1) do not type-check; eq. (6) fixes them.
* Eq. (3): r(t) = (1 - alpha) * A~ r(t-1) + alpha * r(0); alpha is the
  *restart* (jump-back) probability (§3.1 "with probability alpha to jump
  back"; App. C "restart probability alpha", best at 0.8).  A~ is column
  normalised, so mass moves from node j along column j.
* Eq. (7) is the exact column-normalised walk on A_i: the column sum of node j
  in query i's graph is H_ij + sum_k M_kj.  Eq. (9) prints (Z M)^T, which equals
  the M z of eq. (7) only for symmetric M; the doc-doc block is sparsified
  row-wise and is not symmetric, so eq. (7) (= eq. 3 on A_i) is followed.
* Eqs. (5)/(10): y(t) = (1 - beta) B~ y(t-1) + beta y(0); beta is again the
  restart probability, and the fixed point is beta (I - (1 - beta) B~)^-1 y(0).
* §3.2 (last paragraph): "sub-blocks ... rescaled to have the same average
  weight".  A~ is column normalised, so only the ratio between blocks matters and
  a common target of 1 loses nothing.  Two readings: `nonzero_mean` (a block's
  non-zero entries average 1; default, the reading that matched the paper's
  numbers in the project's calibration notes) and `all_mean` (a block's mean
  over all its cells is 1).  Each query's own links are blocks of its own A_i
  (eq. 6), so they are rescaled per query.
* Readings not fixed by the paper: the diagonal (self-similarity) is left out
  of doc-doc and chunk-chunk edges and out of the mean + k*std statistics;
  "beyond the threshold" is strict (>), std is the population std; nodes with no
  edges keep a zero column, so mass that reaches them leaks (sums then stay
  <= 1 rather than = 1); "top 70 %" keeps ceil(0.7 * l) chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import scipy.sparse as sp

from tasks.graph.knn import knn_graph, sparsify
from tasks.graph.relation_gate import EdgePatch, RelationGate, gate_patch, relation_gate  # noqa: F401 (re-exported)
from tasks.graph.sparse import locality_order
from tasks.graph.spmm import csr_times_dense
from tasks.graph.title_walk import title_walk_edges, title_walk_on
from tasks.graph.topk import top_k_rows
from tasks.graph.walk import column_normalise, inverse_column_sums, restarted_walk
from tasks.core.limits import COUNT, COUNT0, POSITIVE, PROB, one_of, within
from tasks.graph.knn import SEARCHES

Rescale = Literal["nonzero_mean", "all_mean"]


@dataclass(frozen=True)
class ZoomParams:
    """DocZoom / ChunkZoom settings (ZoomRAG §5.2 and App. C: T=5, alpha=0.8, beta=0.9, K=10)."""

    alpha: float = field(default=0.8, metadata=PROB)
    steps: int = field(default=5, metadata=COUNT)
    beta: float = field(default=0.9, metadata=PROB)
    top_k_docs: int = field(default=10, metadata=COUNT)
    # App. C / Fig. 5: F1 is flat over a wide range of sigma and omega; a one-chunk bandwidth and an even mix.
    sigma: float = field(default=1.0, metadata=POSITIVE)
    omega: float = field(default=0.5, metadata=PROB)
    keep_ratio: float = field(default=0.7, metadata=within("(0, 1]"))
    k_std: float = 3.0
    # beyond the paper: a query eq. 2 links to no document (always so on 10 documents or fewer) links to its best one
    query_doc_best: bool = True
    # beyond the paper, for 100,000 passages: a per-row cap on the doc-doc rule, so the block grows with n, not n²
    # 0: the paper's rule alone (about 1% of every row is kept: n² cells)
    doc_doc_max_neighbors: int = field(default=64, metadata=COUNT0)
    # with a cap: the row mean/std from this many sampled columns (exact below)
    doc_doc_stats_sample: int = field(default=8192, metadata=COUNT)
    # with a cap: exact (faiss.knn, time ~ n²) | ivf (approximate) | auto (see below)
    doc_doc_search: str = field(default="auto", metadata=one_of(SEARCHES))
    # doc_doc_search=auto: exact search up to this many documents, ivf above
    doc_doc_exact_max: int = field(default=50_000, metadata=COUNT)
    ivf_nlist: int = field(default=0, metadata=COUNT0)  # doc_doc_search=ivf: k-means cells (0: sqrt(n))
    ivf_nprobe: int = field(default=8, metadata=COUNT)  # doc_doc_search=ivf: cells searched per document
    rescale: Rescale = "nonzero_mean"
    use_entities: bool = True
    use_query_entity: bool = True
    use_doc_doc: bool = True
    use_semantic: bool = True
    use_temporal: bool = True
    fine_stage: bool = True
    closed_form: bool = True
    coupled: bool = False
    # queries advanced together per walk: the state memory bound (q x (N+1) floats)
    batch_size: int = field(default=64, metadata=COUNT)
    walk_threads: int = 1  # batches of queries walked at once on threads (scipy's sparse product drops the GIL)
    walk_dtype: str = field(default="float32", metadata=one_of(('float32', 'float64')))
    # locality: M's nodes renumbered once so the walks read memory in order
    walk_node_order: str = field(default="locality", metadata=one_of(('locality', 'stored')))
    # DocZoom steps are sparse products while the state fills at most this share
    walk_sparse_max: float = field(default=0.02, metadata=PROB)
    chunk_iterations: int = field(default=50, metadata=COUNT)
    # beyond the paper, each at its paper value: the title walk over M (see title_walk_block)
    # extra weight of the edge from a title's entity to the document it titles
    title_edge_weight: float = field(default=0.0, metadata=COUNT0)
    # factor on document -> entity edges whose entity titles some document
    title_name_weight: float = field(default=1.0, metadata=COUNT0)
    idf_edges: bool = False  # document -> entity edges also weighted by the entity's IDF
    # factor on document -> entity edges the document writes only in lower case
    lowercase_name_weight: float = field(default=1.0, metadata=COUNT0)
    # query -> entity links times this after the per-block rescaling (1 = §3.2)
    query_entity_weight: float = field(default=1.0, metadata=COUNT0)
    # > 0: document -> title-entity edges gated per question (RelationGate)
    relation_gate_temperature: float = field(default=0.0, metadata=COUNT0)

    @property
    def title_walk(self) -> bool:
        """Whether DocZoom walks on :func:`title_walk_block` rather than the paper's M."""
        return title_walk_on(self.title_edge_weight, self.title_name_weight, self.idf_edges,
                             self.lowercase_name_weight)


@dataclass(frozen=True)
class ChunkZoomResult:
    """Padded per-query ChunkZoom output; chunk/entity ids are global, -1 marks padding."""

    chunks: np.ndarray  # (q, L) int
    scores: np.ndarray  # (q, L) float, -inf on padding
    keep: np.ndarray  # (q, L) bool, top keep_ratio of each query's chunks
    entities: np.ndarray  # (q, H) int
    entity_scores: np.ndarray  # (q, H) float


# ---------------------------------------------------------------- doc-doc block


def doc_doc_block(doc_emb: np.ndarray, k_std: float = 3.0, block_rows: int = 1024, max_neighbors: int = 0,
                  stats_sample: int = 8192, search: str = "exact", ivf_nlist: int = 0,
                  ivf_nprobe: int = 8, exact_max: int = 50_000) -> sp.csr_array:
    """A_doc->doc(i1, i2) = exp(cos(p_i1, p_i2)), no diagonal, kept above row mean + k*std (ZoomRAG eq. 2, §3.1).

    ``max_neighbors > 0`` (beyond the paper): also within the row's ``max_neighbors`` best, found by faiss, with
    the row statistics from ``stats_sample`` sampled columns (exact up to that many documents); ``search=auto``
    searches exactly up to ``exact_max`` documents, by an inverted file above (:func:`tasks.graph.knn.search_for`).
    """
    if max_neighbors <= 0:  # the paper's rule: every cell of a row is a candidate (time and output ~ n²)
        return knn_graph(doc_emb, k_std=k_std, transform=np.exp, block_rows=block_rows)
    return knn_graph(doc_emb, k=min(max_neighbors, max(doc_emb.shape[0] - 1, 1)), k_std=k_std, transform=np.exp,
                     block_rows=block_rows, stats_sample=stats_sample, search=search,  # type: ignore[arg-type]
                     exact_max=exact_max, ivf_nlist=ivf_nlist, ivf_nprobe=ivf_nprobe)


def query_doc_block(cos: np.ndarray, k_std: float = 3.0, best_when_none: bool = True) -> sp.csr_array:
    """A_doc->qry = exp(cos(q, p)) kept above each query's mean + k*std (ZoomRAG eq. 2, §3.1); (q x n) cosines in.

    ``best_when_none`` (beyond the paper): a query whose row keeps no document links to its best one instead. No
    value of n <= 10 can lie 3 standard deviations above their mean, so on such a corpus (one document, say)
    eq. 2 keeps nothing, the walk has no start from the documents and every score is 0."""
    block = sparsify(cos, k_std=k_std, transform=np.exp)
    if not best_when_none or cos.shape[1] == 0:
        return block
    empty = np.flatnonzero(np.diff(block.indptr) == 0)
    if empty.size == 0:
        return block
    best = np.argmax(np.where(np.isnan(cos[empty]), -np.inf, cos[empty]), axis=1)
    extra = sp.csr_array((np.exp(cos[empty, best]).astype(np.float64), (empty, best)), shape=cos.shape)
    return sp.csr_array(block + extra)


# ---------------------------------------------------------------- global graph


def rescale_block(block: sp.sparray, rescale: Rescale = "nonzero_mean") -> tuple[sp.csr_array, float]:
    """Scale one block of A to average weight 1 (ZoomRAG §3.2, last paragraph)."""
    block = sp.csr_array(block, dtype=np.float64)
    block.eliminate_zeros()
    cells = block.nnz if rescale == "nonzero_mean" else block.shape[0] * block.shape[1]
    total = float(block.sum())
    factor = cells / total if total > 0 else 1.0
    return block * factor, factor


def rescale_rows(block: sp.sparray, rescale: Rescale = "nonzero_mean") -> tuple[sp.csr_array, np.ndarray]:
    """Scale each row (one query's block of its own A_i, eq. 6) to average weight 1 (§3.2). ``block`` is left
    as it was (a copy is scaled)."""
    block = sp.csr_array(block, dtype=np.float64, copy=True)
    block.eliminate_zeros()
    per_row = np.diff(block.indptr)
    cells = per_row if rescale == "nonzero_mean" else np.full(block.shape[0], block.shape[1])
    totals = block.sum(axis=1)
    factor = np.divide(cells, totals, out=np.ones(block.shape[0]), where=totals > 0)
    block.data *= np.repeat(factor, per_row)
    return block, factor


def global_block(
    doc_doc: sp.sparray,
    doc_entity: sp.sparray,
    *,
    use_entities: bool = True,
    use_doc_doc: bool = True,
    rescale: Rescale = "nonzero_mean",
) -> tuple[sp.csr_array, dict[str, float]]:
    """Shared doc-entity matrix M = [[A_dd, D], [D^T, 0]] of ZoomRAG eqs. (1), (2), (6).

    Blocks rescaled to equal average weight (§3.2); switched-off blocks are zero, the
    shape stays (n+m) x (n+m).  Column normalisation happens inside the walk.
    """
    n, m = doc_entity.shape
    incidence = (sp.csr_array(doc_entity) != 0).astype(np.float64)
    dd, f_dd = rescale_block(doc_doc, rescale) if use_doc_doc else (sp.csr_array((n, n)), 0.0)
    de, f_de = rescale_block(incidence, rescale) if use_entities else (sp.csr_array((n, m)), 0.0)
    M = sp.block_array([[dd, de], [de.T, sp.csr_array((m, m))]], format="csr")
    return M, {"doc_doc": f_dd, "doc_entity": f_de}


def title_walk_block(M: sp.sparray, n_docs: int, titled: sp.sparray, idf: np.ndarray,
                     title_edge_weight: float = 0.0, title_name_weight: float = 1.0,
                     idf_edges: bool = False, lowercase: sp.sparray | None = None,
                     lowercase_name_weight: float = 1.0) -> sp.csr_array:
    """M with the title walk's edges (:func:`tasks.graph.title_walk.title_walk_edges`, beyond the paper); the
    defaults return M unchanged.

    M[i, j] is the weight of j -> i (the walk normalises columns), so M's D block holds the entity -> document
    edges and its D^T block the document -> entity edges, each the transpose of the walk's orientation.
    ``titled`` (m x n) and ``lowercase`` (n x m) as :func:`tasks.graph.title_walk.title_walk_edges` takes them.
    """
    M = sp.csr_array(M)
    n, m = n_docs, M.shape[0] - n_docs
    dd, de, ed = M[:n, :n], M[:n, n:], M[n:, :n]
    to_entity, to_passage = title_walk_edges(ed.T, de.T, titled, idf, title_edge_weight, title_name_weight,
                                             idf_edges, lowercase, lowercase_name_weight)
    out = sp.block_array([[dd, to_passage.T], [to_entity.T, sp.csr_array((m, m), dtype=M.dtype)]], format="csr")
    return out.astype(M.dtype, copy=False)


def query_links(
    query_doc: sp.sparray,
    query_entity: sp.sparray,
    *,
    use_entities: bool = True,
    use_query_entity: bool = True,
    rescale: Rescale = "nonzero_mean",
    weighted: bool = False,
    entity_weight: float = 1.0,
) -> tuple[sp.csr_array, np.ndarray]:
    """Query rows H = [A_doc->qry^T, A_ent->qry^T] of eq. (6), each block rescaled per query (§3.2).

    The paper's query-entity links are 0/1; ``weighted`` (beyond the paper) keeps ``query_entity``'s
    values (e.g. IDF weights) before the rescaling. ``entity_weight`` (beyond the paper) multiplies the
    rescaled entity block: §3.2 gives both blocks the same average weight, so a query linked to 15 documents
    and 2 names sends 2/17 of its mass to the names. Returns H (q x (n+m)) and the per-query factors
    (q x 2: doc block, entity block).
    """
    qd, f_doc = rescale_rows(query_doc, rescale)
    q, m = query_entity.shape
    if use_entities and use_query_entity:
        qe = sp.csr_array(query_entity, dtype=np.float64) if weighted else \
            (sp.csr_array(query_entity) != 0).astype(np.float64)
        qe, f_ent = rescale_rows(qe, rescale)
        qe = qe * entity_weight
    else:
        qe, f_ent = sp.csr_array((q, m)), np.zeros(q)
    return sp.hstack([qd, qe], format="csr"), np.column_stack([f_doc, f_ent])


# ---------------------------------------------------------------- DocZoom walks


@dataclass(frozen=True)
class WalkGraph:
    """M as DocZoom walks it: in the walk's dtype, its nodes renumbered by ``order`` (``matrix[a, b]`` joins
    nodes ``order[a]`` and ``order[b]``; ``None``: the stored numbering). Built once per index."""

    matrix: sp.csr_array
    order: np.ndarray | None
    transpose: sp.csr_array  # matrix^T as CSR: the sparse steps of decoupled_walk read its rows
    col_sum: np.ndarray  # float64 column sums of matrix: eq. (7)'s shared denominators c_j
    inv_col_sum: np.ndarray  # their reciprocals, 0 for an empty column
    position: np.ndarray | None = None  # inverse of order: position[stored node] = walk node (None: stored)


NODE_ORDERS = ("locality", "stored")


def walk_graph(M: sp.sparray, node_order: str = "locality", dtype: str | type = np.float32) -> WalkGraph:
    """M prepared for :func:`doc_zoom`: cast to ``dtype`` and, for ``node_order="locality"``, renumbered by
    :func:`tasks.graph.sparse.locality_order` (the walks' products read memory in order; the scores only move
    by float rounding, since each sum then adds its terms in another order)."""
    if node_order not in NODE_ORDERS:
        raise ValueError(f"node_order must be one of {NODE_ORDERS}, got {node_order!r}")
    M = sp.csr_array(M, dtype=dtype, copy=True)
    M.sum_duplicates()  # canonical (sorted, no repeats): a product that sorts in place would change later sums
    order = None if node_order == "stored" else locality_order(M)
    if order is not None:
        M = sp.csr_array(M[order][:, order])
        M.sort_indices()
    position = None
    if order is not None:
        position = np.empty_like(order)
        position[order] = np.arange(order.shape[0], dtype=order.dtype)
    return WalkGraph(M, order, sp.csr_array(M.T), *inverse_column_sums(M), position)


def columns_renumbered(H: sp.csr_array, position: np.ndarray) -> sp.csr_array:
    """``H[:, order]`` for ``position`` the inverse of ``order``, in canonical form: each column index mapped, not
    scipy's column fancy indexing, which sorts all of H (1.7 ms a batch on 2Wiki)."""
    out = sp.csr_array((H.data.copy(), position[H.indices], H.indptr.copy()), shape=H.shape)
    out.sum_duplicates()
    return out


def decoupled_walk(M: sp.sparray | WalkGraph, H: sp.sparray, alpha: float = 0.8, steps: int = 5,
                   dtype: str | type = np.float64, out: np.ndarray | None = None,
                   sparse_max: float = 0.02, patch: EdgePatch | None = None) -> np.ndarray:
    """Algorithm-parallel restarted walk, ZoomRAG eqs. (3), (7)-(9): exact per-query walks on A_i.

    M is shared; each query keeps only its (N+1) state.  The column sum of node j in
    query i's graph is c_j + H_ij (eq. 7 denominator): c_j is shared, the H_ij term is a
    sparse patch at H's non-zeros.  Returns (q, 1+N): [query node, docs, entities], written
    into ``out`` when given. ``M`` is the matrix, or its :func:`walk_graph` (built once: its nodes may be
    renumbered, and H and the result keep the stored numbering); ``dtype`` is the state's float type (a
    walk graph must have it). At most two (N x q) state buffers are alive at once.

    All mass starts on the query node, so the first step has a closed form (the docs and entities hold
    (1 - alpha) H~), and the mass then spreads from H's non-zeros. While the state holds at most
    ``sparse_max`` of its N x q cells, a step is one sparse-by-sparse product (by M^T, over the nodes holding
    mass) instead of a sweep of all of M; after that the state is dense. Both give the numbers of the plain
    iteration (the same products, each cell's terms summed in M's sorted column order).

    ``patch`` (beyond the paper: :func:`gate_patch`): query i walks on M + patch.delta[i] at its edges, whose
    columns keep their sums. Its steps are dense (the sparse steps are for the plain walk).
    """
    dtype = np.dtype(dtype)
    graph = M if isinstance(M, WalkGraph) else walk_graph(M, "stored", dtype)
    if graph.matrix.dtype != dtype:
        raise ValueError(f"the walk graph holds {graph.matrix.dtype}, the walk's state is {dtype}")
    M, order, col_sum, inv_col = graph.matrix, graph.order, graph.col_sum, graph.inv_col_sum.astype(dtype)
    H = sp.csr_array(H, dtype=np.float64)
    if order is not None:
        H = columns_renumbered(H, graph.position)
    H.sum_duplicates()
    H.eliminate_zeros()
    q, N = H.shape
    hc = H.tocoo()
    qi, jj, hv = hc.row, hc.col, hc.data
    inv_patch = (1.0 / (col_sum[jj] + hv)).astype(dtype)
    h_tilde = (hv / np.asarray(H.sum(axis=1)).ravel()[qi]).astype(dtype)  # query column of A_i (eq. 9 H~)
    hv = hv.astype(dtype)
    follow = dtype.type(1.0 - alpha)
    # Not tasks.graph.walk.restarted_walk: each query walks on its own operator (M, its column-sum patch and
    # its query node), and the query node's mass is summed and restarted in float64 before being rounded to
    # the state dtype (r_q below). The shared kernel would round that row before adding the restart (other
    # bits in float32) and copy a (1+N) x q state each step. What is shared is the column normalisation.
    r_q = np.ones(q, dtype)  # r(0) = one-hot on the query node; X columns = queries
    X: np.ndarray | None = None  # the dense state (N x q), once the walk has spread
    Z: np.ndarray | None = None  # the state divided by the column sums; X and Z are the only (N x q) buffers
    Xt: sp.csr_array | None = None  # the state while it is sparse, a row per query (q x N)
    h_row = qi * np.int64(N) + jj  # H's entries as row-major keys of (q x N)
    if patch is not None:  # the edges in walk numbering, grouped by target node: one reduceat per step
        if patch.delta.shape != (q, len(patch.src)):
            raise ValueError(f"the edge patch has shape {patch.delta.shape}, the walk {q} queries")
        src = patch.src if graph.position is None else graph.position[patch.src]
        dst = patch.dst if graph.position is None else graph.position[patch.dst]
        by_dst = np.argsort(dst, kind="stable")
        src, dst = src[by_dst], dst[by_dst]
        patch_rows = np.ascontiguousarray(patch.delta[:, by_dst].T, dtype=dtype)  # (P x q)
        dst_starts = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]]) if len(dst) else np.zeros(0, np.int64)
        dst_nodes = dst[dst_starts]
    for step in range(steps):
        if step == 0:  # nothing but the query node holds mass, and it moves along H~
            Xt = sp.csr_array(((h_tilde * r_q[qi]) * follow, (qi, jj)), shape=(q, N))
            r_q = np.full(q, alpha, dtype)
            continue
        if Xt is not None and patch is None and Xt.nnz <= sparse_max * q * N:  # sparse: only nodes with mass
            Xt.sort_indices()
            keys = np.repeat(np.arange(q, dtype=np.int64), np.diff(Xt.indptr)) * N + Xt.indices
            at_h = np.searchsorted(keys, h_row)  # H's entries always hold mass (each step adds h~ r_q there)
            Zt = sp.csr_array((Xt.data * inv_col[Xt.indices], Xt.indices, Xt.indptr), shape=(q, N))
            Zt.data[at_h] = Xt.data[at_h] * inv_patch  # z_ij of eq. (7)
            to_query = np.bincount(qi, weights=hv * Zt.data[at_h], minlength=q)
            Xt = sp.csr_array(Zt @ graph.transpose) + sp.csr_array((h_tilde * r_q[qi], (qi, jj)), shape=(q, N))
            r_q = ((1.0 - alpha) * to_query + alpha).astype(dtype)
            Xt.data *= follow
            continue
        if Xt is not None:  # the state has spread: dense from here on
            X = np.ascontiguousarray(Xt.toarray().T)
            Xt = None
        Z = np.empty_like(X) if Z is None else Z
        np.multiply(X, inv_col[:, None], out=Z)  # z_ij of eq. (7), laid out (N x q)
        Z[jj, qi] = X[jj, qi] * inv_patch
        to_query = np.bincount(qi, weights=hv * Z[jj, qi], minlength=q)
        csr_times_dense(M, Z, out=X)  # X is not read again: the next state overwrites it
        if patch is not None and len(dst_nodes):
            X[dst_nodes] += np.add.reduceat(patch_rows * Z[src], dst_starts, axis=0)
        X[jj, qi] += h_tilde * r_q[qi]
        r_q = ((1.0 - alpha) * to_query + alpha).astype(dtype)
        X *= follow
    Z = None  # freed before the result is laid out
    out = np.empty((q, 1 + N), dtype) if out is None else out
    out[:, 0] = r_q
    state = X.T if X is not None else (Xt.toarray() if Xt is not None else np.zeros((q, N), dtype))
    if order is None:
        out[:, 1:] = state
    else:
        out[:, 1 + order] = state
    return out


def coupled_walk(M: sp.sparray, H: sp.sparray, alpha: float = 0.8, steps: int = 5,
                 order: np.ndarray | None = None) -> np.ndarray:
    """Naive coupled parallel walk: all queries in one joint graph (ZoomRAG App. H), eq. (3).

    Queries share doc/entity columns, so each query's walk leaks into the others'.
    Returns (q, 1+N): [own query node, docs, entities]. ``order``: as in :func:`decoupled_walk`.
    """
    M, H = sp.csr_array(M, dtype=np.float64), sp.csr_array(H, dtype=np.float64)
    if order is not None:
        H = columns_renumbered(H, np.argsort(order))
    q, N = H.shape
    J = sp.block_array([[sp.csr_array((q, q)), H], [H.T, M]], format="csr")
    R0 = np.zeros((q + N, q))
    R0[np.arange(q), np.arange(q)] = 1.0
    R = restarted_walk(column_normalise(J), R0, alpha, steps)
    out = np.empty((q, 1 + N))
    out[:, 0] = R[np.arange(q), np.arange(q)]
    out[:, 1 + (np.arange(N) if order is None else order)] = R[q:].T
    return out


def doc_zoom(
    M: sp.sparray | WalkGraph, query_doc: sp.sparray, query_entity: sp.sparray, params: ZoomParams = ZoomParams(),
    weighted_entities: bool = False, gate: RelationGate | None = None, q_emb: np.ndarray | None = None,
) -> np.ndarray:
    """DocZoom scores (q, 1+n+m) for [query, docs, entities], ZoomRAG eqs. (3), (6)-(9).

    The decoupled walk advances batch_size queries at a time (exact per-query walks, so batching
    is invisible and only bounds the state memory). params.coupled switches to the App. H
    joint-graph walk over the whole batch given (interference within it). ``weighted_entities``:
    see :func:`query_links`. ``M`` is the matrix, or its :func:`walk_graph` built once (a matrix is
    prepared here by ``params.walk_node_order``). ``gate`` (beyond the paper) with the questions' embeddings
    ``q_emb``: each question walks on M re-weighted by :func:`gate_patch`.
    """
    if gate is not None and (q_emb is None or params.coupled):
        raise ValueError("the relation gate needs the questions' embeddings and the decoupled walk")
    H, _ = query_links(
        query_doc,
        query_entity,
        use_entities=params.use_entities,
        use_query_entity=params.use_query_entity,
        rescale=params.rescale,
        weighted=weighted_entities,
        entity_weight=params.query_entity_weight,
    )
    graph = M if isinstance(M, WalkGraph) else walk_graph(M, params.walk_node_order, params.walk_dtype)
    if graph.matrix.dtype != np.dtype(params.walk_dtype):
        raise ValueError(f"the walk graph holds {graph.matrix.dtype}, method.walk_dtype is {params.walk_dtype}")
    if params.coupled:  # one joint graph: the batch is the point
        return coupled_walk(graph.matrix, H, params.alpha, params.steps, graph.order)
    out = np.empty((H.shape[0], 1 + H.shape[1]), params.walk_dtype)

    def walk(start: int) -> None:  # each batch writes its own rows of out: batches are independent walks
        stop = start + params.batch_size
        patch = None if gate is None else gate_patch(gate, q_emb[start:stop])
        decoupled_walk(graph, H[start:stop], params.alpha, params.steps, params.walk_dtype, out[start:stop],
                       params.walk_sparse_max, patch)

    starts = range(0, H.shape[0], params.batch_size)
    if params.walk_threads > 1 and len(starts) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(params.walk_threads, len(starts))) as pool:
            list(pool.map(walk, starts))
    else:
        for start in starts:
            walk(start)
    return out


def top_docs(scores: np.ndarray, n_docs: int, k: int, tie_break: np.ndarray | None = None) -> np.ndarray:
    """Top-k documents per query by DocZoom score (ZoomRAG §3.1); ties by tie_break (q x n), then index.
    O(n) per query (:func:`tasks.graph.topk.top_k_rows`)."""
    return top_k_rows(scores[:, 1 : 1 + n_docs], k, tie_break)


# ---------------------------------------------------------------- ChunkZoom


def chunk_chunk_block(
    emb: np.ndarray,
    doc: np.ndarray,
    pos: np.ndarray,
    valid: np.ndarray,
    *,
    sigma: float,
    omega: float,
    use_semantic: bool = True,
    use_temporal: bool = True,
) -> np.ndarray:
    """B_chk->chk = omega*nm(B^t) + (1-omega)*nm(B^s), ZoomRAG eq. (4) and the block definitions.

    B^t = exp(-(i-j)^2 / 2 sigma^2) for chunks of the same document, B^s = exp(cos).
    Works on one graph (l, ...) or a padded batch (q, l, ...); `valid` masks padding.
    """
    pair = valid[..., :, None] & valid[..., None, :] & ~np.eye(valid.shape[-1], dtype=bool)
    parts = []
    if use_temporal:
        same_doc = doc[..., :, None] == doc[..., None, :]
        gap = pos[..., :, None].astype(np.float64) - pos[..., None, :]
        parts.append((omega, np.exp(-(gap**2) / (2.0 * sigma**2)) * (pair & same_doc)))
    if use_semantic:
        cos = emb @ np.swapaxes(emb, -1, -2)
        parts.append((1.0 - omega, np.exp(cos.astype(np.float64)) * pair))
    if not parts:
        return np.zeros(pair.shape)
    if len(parts) == 1:  # one kind switched off: the other carries the whole block
        return column_normalise(parts[0][1])
    return sum(w * column_normalise(b) for w, b in parts)


def rescale_dense(block: np.ndarray, cells: np.ndarray, rescale: Rescale) -> np.ndarray:
    """Scale each graph's block to average weight 1 (ZoomRAG §3.2, last paragraph)."""
    total = block.sum(axis=(-2, -1))
    if rescale == "nonzero_mean":
        cells = np.count_nonzero(block, axis=(-2, -1))
    factor = np.divide(cells, total, out=np.ones_like(total, dtype=np.float64), where=total > 0)
    return block * factor[..., None, None]


def local_graph(
    cc: np.ndarray, ce: np.ndarray, n_chunks: np.ndarray, n_ents: np.ndarray, rescale: Rescale
) -> np.ndarray:
    """Local adjacency B = [[B_cc, B_ce], [B_ce^T, 0]], ZoomRAG eq. (4), blocks rescaled (§3.2)."""
    cc = rescale_dense(cc, np.asarray(n_chunks) ** 2, rescale)
    ce = rescale_dense(ce, np.asarray(n_chunks) * np.asarray(n_ents), rescale)
    h = ce.shape[-1]
    zeros = np.zeros(ce.shape[:-2] + (h, h))
    top = np.concatenate([cc, ce], axis=-1)
    bottom = np.concatenate([np.swapaxes(ce, -1, -2), zeros], axis=-1)
    return np.concatenate([top, bottom], axis=-2)


def local_walk(B: np.ndarray, y0: np.ndarray, params: ZoomParams) -> np.ndarray:
    """ChunkZoom's restarted walk on B~ = nm(B): y = beta (I - (1-beta) B~)^-1 y0 (eq. 10) or eq. (5) iterated.

    Batched over leading axes (one local graph per query, padded): one np.linalg.solve for all.
    """
    y = restarted_walk(column_normalise(B), y0[..., None], params.beta, params.chunk_iterations,
                       closed_form=params.closed_form)
    return y[..., 0]


def chunk_zoom(
    chunk_emb: np.ndarray,
    chunk_doc: np.ndarray,
    chunk_pos: np.ndarray,
    chunk_entity: np.ndarray,
    entity_scores: np.ndarray,
    params: ZoomParams = ZoomParams(),
) -> np.ndarray:
    """ChunkZoom on one query's local graph, ZoomRAG eqs. (4), (5), (10); returns y (l + h).

    Inputs are local: l chunks (emb, doc id, position), the (l x h) chunk-entity
    indicator, and the h entities' DocZoom scores, which form y(0) (chunks start at 0).
    """
    l, h = chunk_entity.shape
    cc = chunk_chunk_block(
        chunk_emb,
        chunk_doc,
        chunk_pos,
        np.ones(l, dtype=bool),
        sigma=params.sigma,
        omega=params.omega,
        use_semantic=params.use_semantic,
        use_temporal=params.use_temporal,
    )
    B = local_graph(cc, (np.asarray(chunk_entity) != 0).astype(np.float64), l, h, params.rescale)
    y0 = np.concatenate([np.zeros(l), np.asarray(entity_scores, dtype=np.float64)])
    return local_walk(B, y0, params)


def gather_chunks(doc_ids: np.ndarray, chunk_doc: np.ndarray) -> np.ndarray:
    """Chunks of each query's top-K documents (ZoomRAG §3.2 local nodes); (q, L) ids, -1 padding.

    doc_ids (q, K) may hold -1 for missing documents.  Vectorised, no loop over queries.
    """
    doc_ids = np.asarray(doc_ids)
    q = doc_ids.shape[0]
    order = np.argsort(chunk_doc, kind="stable")
    counts = np.bincount(chunk_doc, minlength=int(doc_ids.max(initial=0)) + 1)
    ptr = np.concatenate([[0], np.cumsum(counts)])
    lens = np.where(doc_ids >= 0, counts[np.maximum(doc_ids, 0)], 0).ravel()
    starts = ptr[np.maximum(doc_ids, 0)].ravel()
    total = int(lens.sum())
    within = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
    flat = order[np.repeat(starts, lens) + within]
    per_query = lens.reshape(q, -1).sum(axis=1)
    slot = np.arange(total) - np.repeat(np.cumsum(per_query) - per_query, per_query)
    out = np.full((q, int(per_query.max(initial=0))), -1, dtype=np.int64)
    out[np.repeat(np.arange(q), per_query), slot] = flat
    return out


def gather_entities(chunks: np.ndarray, chunk_entity: sp.sparray) -> tuple[np.ndarray, np.ndarray]:
    """Local entity nodes and indicator B_chk->entity (q, L, H) of ZoomRAG eq. (4); ids -1 padded.

    A query's entities are those of its local chunks, in increasing global id.
    """
    q, L = chunks.shape
    ce = sp.csr_array(chunk_entity)
    ce.eliminate_zeros()
    m = ce.shape[1]
    qs, slots = np.nonzero(chunks >= 0)
    hits = ce[chunks[qs, slots]].tocoo() if len(qs) else sp.coo_array((0, m))
    pq, ps = qs[hits.row], slots[hits.row]
    keys, inv = np.unique(pq.astype(np.int64) * m + hits.col, return_inverse=True)
    key_q = keys // m
    local = np.arange(len(keys)) - np.searchsorted(key_q, np.arange(q))[key_q]
    n_ents = np.bincount(key_q, minlength=q)
    entities = np.full((q, int(n_ents.max(initial=0))), -1, dtype=np.int64)
    entities[key_q, local] = keys % m
    incidence = np.zeros((q, L, entities.shape[1]))
    incidence[pq, ps, local[np.ravel(inv)]] = 1.0
    return entities, incidence


def local_sizes(chunks: np.ndarray, chunk_entity: sp.sparray) -> np.ndarray:
    """Nodes of each query's local graph (ZoomRAG §3.2): its chunks plus the distinct entities they hold."""
    ce = sp.csr_array(chunk_entity)
    ce.eliminate_zeros()
    return np.array([len(ids) + len(np.unique(ce[ids].indices)) for ids in (row[row >= 0] for row in chunks)],
                    dtype=np.int64)


def bound_local_chunks(chunks: np.ndarray, chunk_entity: sp.sparray, chunk_emb: np.ndarray, q_emb: np.ndarray,
                       entity_scores: np.ndarray, max_nodes: int) -> np.ndarray:
    """Beyond the paper: each query's local chunks cut so that chunks + their entities are at most ``max_nodes``.

    §3.2 takes every chunk of the top-K documents, and its local graph is dense: one 2 MB document (52,523
    sentences) made a 52,523² graph, past 24 GB. A query over the bound keeps the chunks that the local walk's
    first step reaches most from its DocZoom entity scores (y(0) of eq. 5: ``B_chk->ent y_ent``), ties by cosine to
    the question, as many as fit; a query within the bound is left as it is. (q, L) global chunk ids, -1 padded,
    left-packed, each row in its original order."""
    ce = sp.csr_array(chunk_entity)
    ce.eliminate_zeros()
    rows = []
    for r, row in enumerate(chunks):
        ids = row[row >= 0]
        local = ce[ids]
        if len(ids) + len(np.unique(local.indices)) <= max_nodes:
            rows.append(ids)
            continue
        reach = local @ np.asarray(entity_scores[r], dtype=np.float64)
        cos = chunk_emb[ids] @ q_emb[r]
        order = np.lexsort((-cos, -reach))  # the first step's mass first, then cosine
        ranked = ce[ids[order]]
        owner = np.repeat(np.arange(len(ids)), np.diff(ranked.indptr))
        _, first = np.unique(ranked.indices, return_index=True)  # an entity counts where it first appears
        nodes = np.arange(1, len(ids) + 1) + np.cumsum(np.bincount(owner[first], minlength=len(ids)))
        n_keep = max(int(np.searchsorted(nodes, max_nodes, side="right")), 1)
        rows.append(ids[np.sort(order[:n_keep])])
    out = np.full((len(chunks), max((len(r) for r in rows), default=0)), -1, dtype=np.int64)
    for r, ids in enumerate(rows):
        out[r, :len(ids)] = ids
    return out


def solve_groups(order: np.ndarray, sizes: np.ndarray, group_size: int, max_cells: int) -> list[np.ndarray]:
    """Queries (in ``order``) split into groups of ``group_size`` solved together, each group split further until
    its padded graphs hold at most ``max_cells`` cells (queries x largest graph's nodes²): beyond the paper, the
    bound on ChunkZoom's dense batch, whatever the corpus."""
    groups = []
    for group in np.array_split(order, -(-len(order) // group_size)) if len(order) else []:
        per = max(1, max_cells // max(int(sizes[group].max(initial=1)) ** 2, 1))
        groups += np.array_split(group, -(-len(group) // per))
    return groups


def keep_top_chunks(scores: np.ndarray, n_chunks: np.ndarray, keep_ratio: float = 0.7) -> np.ndarray:
    """Keep the ceil(keep_ratio * l) best chunks of each query (ZoomRAG §3.2, "top 70%")."""
    n_keep = np.ceil(keep_ratio * np.asarray(n_chunks) - 1e-9).astype(np.int64)
    order = np.argsort(-scores, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(scores.shape[1]), scores.shape), axis=1)
    return rank < n_keep[:, None]


def chunk_zoom_batch(
    doc_ids: np.ndarray,
    chunk_doc: np.ndarray,
    chunk_pos: np.ndarray,
    chunk_emb: np.ndarray,
    chunk_entity: sp.sparray,
    entity_scores: np.ndarray,
    params: ZoomParams = ZoomParams(),
    chunks: np.ndarray | None = None,
) -> ChunkZoomResult:
    """Batched ChunkZoom, ZoomRAG eqs. (4), (5), (10): padded (q, L+H, L+H) graphs, one batched solve.

    doc_ids (q, K): each query's top-K docs; chunk_* are global per-chunk arrays
    (C,), (C,), (C x d), (C x m); entity_scores (q x m) are the DocZoom entity scores. ``chunks`` (q, L), when
    given, are the local chunks already gathered (:func:`bound_local_chunks`); else all of the top-K documents'.
    """
    if chunks is None:
        chunks = gather_chunks(doc_ids, chunk_doc)
    entities, incidence = gather_entities(chunks, chunk_entity)
    valid, ent_valid = chunks >= 0, entities >= 0
    safe, safe_ent = np.maximum(chunks, 0), np.maximum(entities, 0)
    cc = chunk_chunk_block(
        chunk_emb[safe],
        np.where(valid, chunk_doc[safe], -1),
        chunk_pos[safe],
        valid,
        sigma=params.sigma,
        omega=params.omega,
        use_semantic=params.use_semantic,
        use_temporal=params.use_temporal,
    )
    n_chunks = valid.sum(axis=1)
    B = local_graph(cc, incidence, n_chunks, ent_valid.sum(axis=1), params.rescale)
    ent_y0 = np.where(ent_valid, np.take_along_axis(np.asarray(entity_scores), safe_ent, axis=1), 0.0)
    y0 = np.concatenate([np.zeros(chunks.shape), ent_y0], axis=1)
    y = local_walk(B, y0, params)
    L = chunks.shape[1]
    scores = np.where(valid, y[:, :L], -np.inf)
    keep = keep_top_chunks(scores, n_chunks, params.keep_ratio)
    return ChunkZoomResult(chunks, scores, keep, entities, np.where(ent_valid, y[:, L:], 0.0))
