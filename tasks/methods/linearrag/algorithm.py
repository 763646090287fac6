"""LinearRAG retrieval, pure layer: Tri-Graph, semantic bridging, global importance PPR.

Paper: LinearRAG (Zhuang et al., 2025; the docs' bibliography), section 3 and appendices
D, E.2, G. Everything here is numpy / scipy.sparse in, arrays out: no I/O, no models.

Shapes used throughout (Q queries, P passages, S sentences, E entities, d embedding dim):
embeddings are float arrays ``(n, d)``, L2-normalised so a dot product is a cosine;
``contain`` C is a ``(P, E)`` csr of occurrence counts N; ``mention`` M is a ``(S, E)``
binary csr; activations are ``(Q, E)`` csr float32.

Entity normalisation and the numeric-label filter are not here: the single source is
``tasks.text.ner`` (``normalize_entity``, ``is_numeric_label``), shared with every graph method.

Readings of spots the paper leaves open (the PDF conversion garbles little here, but
several quantities are only named in prose):

* eq. (3): a query entity links to its arg-max corpus entity with weight = cosine; two
  query entities hitting one corpus entity keep the max; links with non-positive
  similarity or below ``min_similarity`` are dropped (a zero/negative weight carries no
  mass in eq. (7) or the PPR reset).
* eq. (5) + "Dynamic pruning" (section 3.2.1): per iteration t, only the frontier (seeds
  at t = 1, afterwards the entities *newly* activated at t - 1) with score >= delta
  propagates; a reached entity is kept only if its score >= delta; the loop stops when
  no new entity passes delta. ``max_iterations`` counts activation tiers including the
  seeds: Table 10 (appendix E.6) shows tiers "Iter 0..2" with the 2Wiki default 3, so at
  most ``max_iterations - 1`` propagation steps run.
* ``top_k_sentence`` (not named in the paper; the authors' released configuration): each
  frontier entity propagates only through its k sentences most relevant to the query
  (sigma_q of eq. (4)) that this query has not traversed yet -- the sparse M of eq. (5)
  restricted per (query, entity). Without the "not traversed yet" rule a newly reached
  entity's best sentence is usually the one it was reached through, and k = 1 could
  never take a second hop (the Table 10 chain would stop at "Frederick Barbarossa").
* eq. (7): N_{e,p} = occurrences of e in p (counts in C); L_e = "hierarchical level" of e
  = its activation tier (seeds 1, entities first reached at step t get t + 1); W_p =
  ``passage_node_weight``, one scalar for all passage nodes; sim(q, p) is min-max
  normalised over the passages per query, so lambda does not depend on the embedder's
  cosine range.
* lambda of eq. (7) is ``passage_ratio``, and W_p is ``passage_node_weight``: the
  authors' released code multiplies the min-max sim(q, p) by ``passage_ratio`` and the
  whole passage score by ``passage_node_weight``; it has no third coefficient, so a
  separate ``lam`` next to ``passage_ratio`` would be a misreading. Defaults are their
  run.py's (``passage_ratio`` 2, ``top_k_sentence`` 3); appendix E.2's "lambda = 0.05" is
  the value their per-dataset script sets for HotpotQA / 2Wiki (with ``top_k_sentence``
  1). With 0.05 the dense term is 40 times smaller, and passages that no active entity
  reaches keep an almost-zero reset, which costs recall at depth 10.
* eq. (6): ``damping`` d is the probability of following an edge (networkx's ``alpha``);
  the reset is the per-query normalised personalization; dangling nodes jump according
  to the personalization, as networkx does. The passage-entity graph is undirected; its
  edges are "based on occurrence" (section 3.2.2): ``edge_weighting`` "share" weighs
  (p, e) by N_{e,p} / sum_e' N_{e',p} (default), "count" by N_{e,p}, "indicator" by
  eq. (1)'s C > 0.
* Only passage-entity edges: nothing links passages by their position in the corpus. (The authors' released code,
  not the paper's text, also links each chunk to the next one in corpus order; on the long-document set that did
  not add to ``passage_reset=auto``: docs/methods/linearrag.md, "Long documents".)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, Union

import numpy as np
import scipy.sparse as sp

from tasks.graph.relation_gate import RelationGate, gate_patch
from tasks.graph.sparse import log1p_transposed, transposed_csr
from tasks.graph.title_walk import title_walk_edges, title_walk_on
from tasks.graph.topk import top_k_rows
from tasks.graph.walk import SWEEPS, RandomWalk, SidePatch, personalized_pagerank, random_walk
from tasks.core.limits import COUNT, COUNT0, POSITIVE, PROB, one_of, within

PASSAGE_RESETS = ("auto", "eq7", "top_similarity")  # LinearRAGParams.passage_reset


@dataclass(frozen=True)
class LinearRAGParams:
    """LinearRAG retrieval parameters; field names equal the config keys."""

    max_iterations: int = field(default=3, metadata=COUNT)  # activation tiers incl. seeds (Table 10)
    iteration_threshold: float = 0.4  # delta of dynamic pruning (section 3.2.1)
    top_k_sentence: int = field(default=3, metadata=COUNT)  # sentences per frontier entity and step
    # lambda of eq. (7): weight of min-max sim(q, p) in the passage reset
    passage_ratio: float = field(default=2.0, metadata=COUNT0)
    passage_node_weight: float = field(default=0.05, metadata=COUNT0)  # W_p of eq. (7)
    damping: float = field(default=0.5, metadata=PROB)  # eq. (6) d, probability of following an edge
    # passage-entity edges: share | count | indicator (section 3.2.2)
    edge_weighting: str = field(default="share", metadata=one_of(('share', 'count', 'indicator')))
    top_k: int = field(default=5, metadata=COUNT)  # passages retrieved
    min_similarity: float = field(default=0.0, metadata=within("[-1, 1]"))  # floor on eq. (3) links; 0.0 = no floor
    ppr_tol: float = field(default=1e-6, metadata=POSITIVE)  # per-query L1 change that stops the power iteration
    ppr_max_iter: int = field(default=100, metadata=COUNT)
    # float32 halves the memory traffic; its noise floor is ~1e-7 (L1)
    ppr_dtype: str = field(default="float32", metadata=one_of(('float32', 'float64')))
    # blocks of queries walked at once; each block stops on its own queries (config 0: one per CPU)
    ppr_threads: int = field(default=1, metadata=COUNT0)
    # alternating (block Gauss-Seidel over passages and entities) | power: same fixed point
    ppr_sweeps: str = field(default="alternating", metadata=one_of(SWEEPS))
    # beyond the paper, each at its paper value: the title walk and the passage reset
    # omega: extra weight of the edge from a title's entity to the passage it titles
    title_edge_weight: float = field(default=0.0, metadata=COUNT0)
    # factor on passage -> entity edges whose entity is some passage's title
    title_name_weight: float = field(default=1.0, metadata=COUNT0)
    idf_edges: bool = False  # passage -> entity edges also weighted by the entity's IDF (hubs carry less)
    # factor on passage -> entity edges the passage writes only in lower case
    lowercase_name_weight: float = field(default=1.0, metadata=COUNT0)
    # eq7 (paper) | top_similarity (the top passages by cosine, see top_similarity_reset) | auto (beyond the paper:
    # top_similarity where documents are cut into several passages, eq7 where every passage is its own document;
    # resolve_passage_reset, before the walk)
    passage_reset: str = field(default="eq7", metadata=one_of(PASSAGE_RESETS))
    # top_similarity: how many passages per query get reset mass
    passage_reset_depth: int = field(default=20, metadata=COUNT)
    # top_similarity: passage share of the reset against the entities' (sum 1)
    passage_reset_weight: float = field(default=0.3, metadata=COUNT0)
    # > 0: passage -> title-entity edges gated per question (RelationGate)
    relation_gate_temperature: float = field(default=0.0, metadata=COUNT0)
    # beyond the paper: a node per source document cut into several passages, linked to its passages
    document_nodes: bool = False

    @property
    def title_walk(self) -> bool:
        """Whether the walk's graph differs from the paper's (needs the passages' title entities)."""
        return title_walk_on(self.title_edge_weight, self.title_name_weight, self.idf_edges,
                             self.lowercase_name_weight)


# ----------------------------------------------------------- Tri-Graph (eqs. (1)-(2))

def build_tri_graph(
    sentence_passage: np.ndarray,
    mention_sentence: np.ndarray,
    mention_entity: np.ndarray,
    n_passages: int,
    n_sentences: int,
    n_entities: int,
) -> tuple[sp.csr_array, sp.csr_array]:
    """Contain matrix C (passage x entity counts) and mention matrix M, LinearRAG eqs. (1)-(2).

    ``sentence_passage[s]`` is the passage of sentence s; each mention row
    (``mention_sentence[i]``, ``mention_entity[i]``) is one occurrence of an entity in a
    sentence. C[p, e] = N_{e,p}, the number of such occurrences in p's sentences (eq. (1)'s
    indicator is C > 0; the counts feed eq. (7)); M is the binary indicator of eq. (2)
    (binary sentence-entity edges, appendix G.3).
    """
    sentence_passage = np.asarray(sentence_passage, dtype=np.int64)
    rows = np.asarray(mention_sentence, dtype=np.int64)
    cols = np.asarray(mention_entity, dtype=np.int64)
    if rows.shape != cols.shape or sentence_passage.shape != (n_sentences,):
        raise ValueError("mention arrays must align and sentence_passage must have n_sentences rows")
    ones = np.ones(rows.shape[0], dtype=np.float32)
    contain = sp.coo_array((ones, (sentence_passage[rows], cols)), shape=(n_passages, n_entities)).tocsr()
    mention = sp.coo_array((ones, (rows, cols)), shape=(n_sentences, n_entities)).tocsr()
    contain.sum_duplicates()
    mention.sum_duplicates()
    mention.data[:] = 1.0
    return contain, mention


def passage_entity_graph(contain: sp.sparray, weighting: str = "indicator") -> sp.csr_array:
    """Symmetric adjacency of the passage-entity bipartite graph, nodes = P passages then E entities (section 3.2.2).

    ``weighting``: "indicator" (default; eq. (1)'s C > 0, so eq. (6)'s deg counts links),
    "count" (N_{e,p}) or "share" (N_{e,p} / sum_e N_{e,p}) -- the last two are readings of
    "edges ... based on occurrence" (section 3.2.2), offered for ablations.
    """
    edges = sp.csr_array(contain).astype(np.float64, copy=True)
    edges.eliminate_zeros()
    if weighting == "indicator":
        edges.data[:] = 1.0
    elif weighting == "share":
        edges = sp.diags_array(1.0 / np.maximum(np.asarray(edges.sum(axis=1)).ravel(), 1e-300)) @ edges
    elif weighting != "count":
        raise ValueError(f"unknown weighting {weighting!r}")
    return sp.block_array([[None, edges], [edges.T, None]], format="csr")


def with_document_nodes(contain: sp.sparray, passage_document: np.ndarray) -> sp.csr_array:
    """Beyond the paper: ``contain`` (P x E) with one more column per source document that holds several passages,
    so the walk's graph (:func:`passage_entity_graph`) gets a node per such document, linked to its passages.

    ``passage_document`` (P,): a code per passage's source document. The paper's passages are independent units
    (its benchmarks' passages have no source document); passages cut from one document are not, and this node is
    that relation, written as an entity each of its passages names once (N = 1), so every ``edge_weighting`` weighs
    it like one mention and no new constant enters. A document of one passage gets no node: a corpus of
    independent passages keeps exactly the paper's graph.
    """
    c = sp.csr_array(contain)
    codes, index = np.unique(np.asarray(passage_document), return_inverse=True)
    sizes = np.bincount(index, minlength=codes.size)
    several = sizes[index] > 1
    if not several.any():
        return c
    column = np.cumsum(sizes > 1)[index] - 1  # the node of each passage's document, in document-code order
    rows = np.flatnonzero(several)
    nodes = sp.csr_array((np.ones(rows.size, c.dtype), (rows, column[rows])), shape=(c.shape[0], int((sizes > 1).sum())))
    return sp.csr_array(sp.hstack([c, nodes], format="csr"))


def title_walk_graph(
    contain: sp.sparray,
    titled: sp.sparray,
    idf: np.ndarray,
    weighting: str = "share",
    title_edge_weight: float = 0.0,
    title_name_weight: float = 1.0,
    idf_edges: bool = False,
    lowercase: sp.sparray | None = None,
    lowercase_name_weight: float = 1.0,
) -> sp.csr_array:
    """Directed passage-entity adjacency for the title walk (beyond the paper); passages first.

    The paper's ``weighting`` edges (:func:`passage_entity_graph`) re-weighted by
    :func:`tasks.graph.title_walk.title_walk_edges` (``titled``: E x P, ``lowercase``: P x E). With the
    defaults (0, 1, False, None) this equals :func:`passage_entity_graph`. :func:`random_walk` row-normalises,
    so only each row's proportions matter.
    """
    base = passage_entity_graph(contain, weighting)
    n_p = contain.shape[0]
    to_entity, to_passage = title_walk_edges(base[:n_p, n_p:], base[n_p:, :n_p], titled, idf, title_edge_weight,
                                             title_name_weight, idf_edges, lowercase, lowercase_name_weight)
    return sp.block_array([[None, to_entity], [to_passage, None]], format="csr")


# ------------------------------------------------------ entity activation (eqs. (3)-(5))

QueryEntities = Union[Sequence[np.ndarray], tuple[np.ndarray, np.ndarray]]


def flatten_query_entities(per_query: Sequence[np.ndarray], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Stack ragged per-query entity embeddings into (query index per row, (n, dim) matrix)."""
    blocks = [np.asarray(b, dtype=np.float32).reshape(-1, dim) for b in per_query]
    q_idx = np.repeat(np.arange(len(blocks)), [b.shape[0] for b in blocks])
    emb = np.concatenate(blocks, axis=0) if blocks else np.zeros((0, dim), np.float32)
    return q_idx.astype(np.int64), emb


def _max_by_cell(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape: tuple[int, int]) -> sp.csr_array:
    """Sparse matrix keeping the max (not the sum) of duplicate (row, col) entries."""
    order = np.lexsort((cols, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    first = np.r_[True, (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])] if rows.size else np.zeros(0, bool)
    starts = np.flatnonzero(first)
    best = np.maximum.reduceat(vals, starts) if starts.size else vals[:0]
    return sp.csr_array((best, (rows[starts], cols[starts])), shape=shape)


def initial_activation(
    query_entities: QueryEntities,
    entity_emb: np.ndarray,
    min_similarity: float = 0.0,
    n_queries: int | None = None,
    block_rows: int = 2048,
) -> sp.csr_array:
    """Initial entity activation a_q for a batch of queries (Q x E), LinearRAG eq. (3).

    ``query_entities``: either a list (one ``(k_q, d)`` array per query, k_q may be 0) or
    ``(q_idx, emb)`` with ``q_idx`` the query of each row of ``emb`` (then pass
    ``n_queries``). Each query entity links to its most similar corpus entity with weight
    = cosine; links with similarity <= 0 or < ``min_similarity`` are dropped; duplicate
    links of one query keep the max.
    """
    entity_emb = np.asarray(entity_emb, dtype=np.float32).reshape(-1, np.shape(entity_emb)[-1])
    if isinstance(query_entities, tuple):
        if n_queries is None:
            raise ValueError("n_queries is required with the (q_idx, emb) form")
        q_idx, emb = np.asarray(query_entities[0], np.int64), np.asarray(query_entities[1], np.float32)
    else:
        n_queries = len(query_entities)
        q_idx, emb = flatten_query_entities(query_entities, entity_emb.shape[1])
    if entity_emb.shape[0] == 0:
        return sp.csr_array((n_queries, 0), dtype=np.float32)
    best = np.zeros(len(q_idx), dtype=np.int64)
    sim = np.zeros(len(q_idx), dtype=np.float32)
    for lo in range(0, len(q_idx), block_rows):  # blocks bound the (rows x E) similarity memory
        block = emb[lo:lo + block_rows] @ entity_emb.T
        best[lo:lo + block_rows] = block.argmax(axis=1)
        sim[lo:lo + block_rows] = block[np.arange(block.shape[0]), best[lo:lo + block_rows]]
    return _links(q_idx, best, sim, n_queries, entity_emb.shape[0], min_similarity)


def _links(q_idx: np.ndarray, best: np.ndarray, sim: np.ndarray, n_queries: int, n_entities: int,
           min_similarity: float) -> sp.csr_array:
    """Eq. (3) links (query, arg-max entity, cosine) -> a_q, dropping sim <= 0 or < the floor, max per cell."""
    keep = (sim > 0) & (sim >= min_similarity)
    return _max_by_cell(q_idx[keep], best[keep], sim[keep], (n_queries, n_entities))


def activation_from_similarity(
    q_idx: np.ndarray, similarity: np.ndarray, n_queries: int, min_similarity: float = 0.0,
) -> sp.csr_array:
    """:func:`initial_activation` from a precomputed (rows x E) query-entity cosine matrix.

    For callers that compute the similarities elsewhere (e.g. on the encoder's own thread
    pool); ``q_idx`` is the query of each row.
    """
    similarity = np.asarray(similarity)
    n_e = similarity.shape[1]
    if n_e == 0 or similarity.shape[0] == 0:
        return sp.csr_array((n_queries, n_e), dtype=np.float32)
    best = similarity.argmax(axis=1)
    sim = similarity[np.arange(similarity.shape[0]), best].astype(np.float32)
    return _links(np.asarray(q_idx, np.int64), best.astype(np.int64), sim, n_queries, n_e, min_similarity)


def query_sentence_relevance(query_emb: np.ndarray, sentence_emb: np.ndarray) -> np.ndarray:
    """Query-sentence relevance distribution sigma_q = sim(q, s) for a batch (Q x S), LinearRAG eq. (4)."""
    return np.asarray(query_emb, dtype=np.float32) @ np.asarray(sentence_emb, dtype=np.float32).T


@dataclass(frozen=True)
class PairRelevance:
    """sigma of eq. (4) computed only where bridging reads it: ``relevance[q, s]`` for arrays of query and
    sentence indices gives the cosines of those pairs (float32). Bridging reads the sentences of its frontier
    entities, a small share of a large corpus's (at 100k passages: 450k sentences per query otherwise). The
    values equal :func:`query_sentence_relevance`'s up to float32 rounding (a dot product summed in another
    order)."""

    query_emb: np.ndarray  # (Q, d) float32
    sentence_emb: np.ndarray  # (S, d) float32
    # pairs gathered at a time: two (chunk x d) float32 blocks, 3 MB each at d = 384, reused from the heap and
    # the cache; at 65,536 they were fresh pages every batch (2Wiki, 89,201 pairs: 0.10-0.45 s -> 22-25 ms)
    chunk: int = 2048

    @property
    def shape(self) -> tuple[int, int]:
        return self.query_emb.shape[0], self.sentence_emb.shape[0]

    def __getitem__(self, pairs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        q, s = (np.asarray(i, dtype=np.int64) for i in pairs)
        out = np.empty(q.shape[0], np.float32)
        for a in range(0, q.shape[0], self.chunk):
            b = a + self.chunk
            out[a:b] = np.einsum("ij,ij->i", self.query_emb[q[a:b]], self.sentence_emb[s[a:b]])
        return out


@dataclass(frozen=True)
class Bridging:
    """Result of semantic bridging for a batch of Q queries over E entities.

    ``activation``: (Q, E) csr float32, final a_q. ``level``: (Q, E) csr, same pattern,
    the tier L_e of each active entity (seeds 1, first reached at step t -> t + 1).
    ``trace``: one ``(q_idx, e_idx)`` pair of int arrays per propagation step that ran,
    the entities newly activated at that step (the last one is empty if pruning stopped it).
    """

    activation: sp.csr_array
    level: sp.csr_array
    trace: list[tuple[np.ndarray, np.ndarray]]

    def new_counts(self, n_steps: int) -> np.ndarray:
        """Newly activated entities per query and step, (Q, n_steps) int, zero-padded."""
        counts = np.zeros((self.activation.shape[0], n_steps), dtype=np.int64)
        for t, (q, _) in enumerate(self.trace[:n_steps]):
            counts[:, t] = np.bincount(q, minlength=counts.shape[0])
        return counts


def _frontier_paths(
    frontier: sp.coo_array, relevance: np.ndarray | PairRelevance, entity_sentence: sp.csr_array,
    traversed: np.ndarray, top_k_sentence: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query, sentence, a_e * sigma_{q,s}) of every path a frontier entity takes this step, eq. (5).

    ``traversed``: the sorted keys ``query * S + sentence`` of the pairs taken in earlier steps (S sentences):
    a set as small as the paths taken, where a (Q x S) mask would be 115 MB per batch of 256 at 100k passages.
    """
    fq, fe, fa = frontier.row.astype(np.int64), frontier.col.astype(np.int64), frontier.data
    starts, lengths = entity_sentence.indptr[fe], entity_sentence.indptr[fe + 1] - entity_sentence.indptr[fe]
    path = np.repeat(np.arange(fe.size), lengths)
    offset = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    q, s = fq[path], entity_sentence.indices[np.repeat(starts, lengths) + offset].astype(np.int64)
    keys = q * np.int64(entity_sentence.shape[1]) + s
    at = np.minimum(np.searchsorted(traversed, keys), max(traversed.size - 1, 0))
    fresh = traversed[at] != keys if traversed.size else np.ones(keys.size, bool)
    path, q, s = path[fresh], q[fresh], s[fresh]
    sigma = relevance[q, s].astype(np.float64)
    if top_k_sentence is not None and top_k_sentence > 0:
        order = np.lexsort((s, -sigma, path))  # per frontier entity, most relevant sentence first
        grouped = path[order]
        first = np.r_[True, grouped[1:] != grouped[:-1]] if grouped.size else np.zeros(0, bool)
        rank = np.arange(grouped.size) - np.maximum.accumulate(np.where(first, np.arange(grouped.size), 0))
        keep = order[rank < top_k_sentence]
        path, q, s, sigma = path[keep], q[keep], s[keep], sigma[keep]
    return q, s, fa[path] * sigma


def _prune(reached: sp.csr_array, threshold: float) -> sp.csr_array:
    """Keep only activations >= delta (and > 0), LinearRAG section 3.2.1 dynamic pruning."""
    reached = reached.tocoo()
    keep = (reached.data >= threshold) & (reached.data > 0)
    return sp.csr_array((reached.data[keep], (reached.row[keep], reached.col[keep])), shape=reached.shape)


def semantic_bridging(
    seed_activation: sp.sparray,
    relevance: np.ndarray | PairRelevance,
    mention: sp.sparray,
    iteration_threshold: float = 0.4,
    max_iterations: int = 3,
    top_k_sentence: int | None = 3,
    entity_sentence: sp.csr_array | None = None,
) -> Bridging:
    """Semantic bridging with dynamic pruning for a batch of queries, LinearRAG eqs. (4)-(5).

    ``seed_activation``: (Q, E) a^0 from eq. (3); ``relevance``: (Q, S) sigma from eq. (4), dense or a
    :class:`PairRelevance` that computes the pairs read;
    ``mention``: (S, E) M. Each step computes M^T(sigma (.) M a) over the frontier's
    top-k untraversed sentences (rows = queries, so the whole batch is two sparse
    products), prunes below delta, and takes MAX with the previous activation. Taken
    literally, eq. (5) sums over paths, and M^T M has a diagonal: a frontier entity also
    collects sum_s sigma_s a_e over its chosen sentences (kept, as written).
    ``entity_sentence``: M^T as float64 CSR (:func:`tasks.graph.sparse.transposed_csr`), for a caller that
    bridges many batches; transposed from ``mention`` here when not given (at 100k passages: 433,076 entries,
    every batch).
    """
    n_q, n_e = seed_activation.shape
    act = sp.csr_array(seed_activation).astype(np.float64, copy=True)
    act.eliminate_zeros()
    seeds = act.tocoo()
    levels = [(seeds.row, seeds.col, np.ones(seeds.nnz))]
    entity_sentence = transposed_csr(mention) if entity_sentence is None else entity_sentence
    mention = sp.csr_array(mention, dtype=np.float64)
    traversed = np.zeros(0, np.int64)  # sorted keys query * S + sentence of the pairs taken so far
    frontier, trace = _prune(act, iteration_threshold).tocoo(), []
    for step in range(1, max_iterations):
        if frontier.nnz == 0:
            break
        q, s, weight = _frontier_paths(frontier, relevance, entity_sentence, traversed, top_k_sentence)
        traversed = np.union1d(traversed, q * np.int64(relevance.shape[1]) + s)
        message = sp.coo_array((weight, (q, s)), shape=relevance.shape).tocsr()  # sigma (.) (M a)
        reached = _prune(message @ mention, iteration_threshold).tocoo()  # M^T(...), pruned
        old = act.tocoo()
        is_new = ~np.isin(reached.row.astype(np.int64) * n_e + reached.col, old.row.astype(np.int64) * n_e + old.col)
        frontier = sp.coo_array((reached.data[is_new], (reached.row[is_new], reached.col[is_new])), shape=(n_q, n_e))
        trace.append((frontier.row.astype(np.int64), frontier.col.astype(np.int64)))
        levels.append((frontier.row, frontier.col, np.full(frontier.nnz, step + 1.0)))
        act = act.maximum(reached.tocsr())  # eq. (5) MAX
    rows, cols, vals = (np.concatenate(parts) for parts in zip(*levels))
    level = sp.csr_array((vals, (rows, cols)), shape=(n_q, n_e))
    return Bridging(act.astype(np.float32), level, trace)


# ----------------------------------------------------- passage retrieval (eqs. (6)-(7))

def passage_initial_scores(
    passage_similarity: np.ndarray,
    activation: sp.sparray,
    level: sp.sparray,
    contain: sp.sparray,
    passage_ratio: float = 2.0,
    passage_node_weight: float = 0.05,
    entity_passage_log: sp.csr_array | None = None,
) -> np.ndarray:
    """Initial importance of passage nodes for a batch (Q x P), LinearRAG eq. (7).

    I(p) = (lambda * sim(q, p) + ln(1 + sum_e a_e ln(1 + N_{e,p}) / L_e)) * W_p, with
    ``passage_similarity`` (Q, P) cosines (min-max normalised per query here),
    ``activation`` / ``level`` the (Q, E) a_q and L_e of :class:`Bridging`, and
    ``contain`` the (P, E) counts N; lambda = ``passage_ratio``, W_p = ``passage_node_weight``.
    ``entity_passage_log``: (E, P) ln(1 + N^T) in CSR (:func:`tasks.graph.sparse.log1p_transposed` of
    ``contain``), for a caller that scores many batches; computed from ``contain`` when not given.
    """
    act = sp.csr_array(activation, dtype=np.float64)
    inv_level = sp.csr_array(level, dtype=np.float64).power(-1)
    log_counts_t = log1p_transposed(contain) if entity_passage_log is None else entity_passage_log
    entity_bonus = sp.coo_array(act.multiply(inv_level) @ log_counts_t)  # sparse: the passages naming a_q's entities
    entity_bonus.sum_duplicates()
    scores = np.array(passage_similarity, dtype=np.float64)  # one (Q x P) array, every step below in place
    lo, hi = scores.min(axis=1, keepdims=True), scores.max(axis=1, keepdims=True)
    scores -= lo
    scores /= np.where(hi > lo, hi - lo, 1.0)  # min-max per query; a constant row becomes 0
    scores *= passage_ratio
    scores[entity_bonus.row, entity_bonus.col] += np.log1p(entity_bonus.data)  # log1p(0) = 0 elsewhere
    scores *= passage_node_weight
    return scores


def resolve_passage_reset(rule: str, cut: bool) -> str:
    """``passage_reset=auto`` (beyond the paper): ``top_similarity`` on a corpus of documents cut into several
    passages (``cut``: :func:`tasks.data.corpus.documents_cut`), ``eq7`` (the paper's) where every passage is its own
    document; another rule is kept as it is.

    Why (measured on the long-document set; docs/methods/linearrag.md, "Long documents"): eq. (7) gives every
    passage restart mass, its cosine min-max normalised over the whole corpus, so with thousands of passages cut
    from a few hundred documents the question's ten best passages hold about 1 % of the restart or less, and the
    walk ranks by the graph's shape more than by the question: a passage that names no entity (a dangling node)
    ends below passages of the same restart that name a generic seed ("api", "python": hubs of hundreds of
    passages). Restarting from the question's top passages by cosine keeps the walk where the question is.
    """
    if rule != "auto":
        return rule
    return "top_similarity" if cut else "eq7"


def rank_passages(scores: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k passage indices and scores per query, best first, ties by lower index."""
    ranked = top_k_rows(scores, top_k)
    return ranked, np.take_along_axis(scores, ranked, axis=1)


def top_similarity_reset(passage_similarity: np.ndarray, depth: int = 20, weight: float = 0.3) -> np.ndarray:
    """Passage reset of the title walk (beyond the paper): (Q x P), each row sums to ``weight``.

    The ``depth`` passages most similar to the query share ``weight`` in proportion to their
    cosine above the (depth + 1)-th one, so the reset is a soft dense top-``depth`` rather than
    eq. (7)'s mass on every passage. With eq. (7) the whole corpus keeps reset mass and the walk
    from the named titles is drowned; here entity seeds (summing to 1) carry most of the restart.
    """
    sim = np.asarray(passage_similarity, dtype=np.float64)
    n_q, n_p = sim.shape
    out = np.zeros_like(sim)
    if n_p == 0 or depth <= 0:
        return out
    k = min(depth, n_p)
    top = np.argpartition(-sim, k - 1, axis=1)[:, :k]
    top_sim = np.take_along_axis(sim, top, axis=1)
    floor = (np.partition(-sim, k, axis=1)[:, k:k + 1] * -1.0) if k < n_p else top_sim.min(axis=1, keepdims=True)
    mass = np.maximum(top_sim - floor, 0.0)
    flat = mass.sum(axis=1, keepdims=True) <= 0
    mass = np.where(flat, 1.0, mass)  # all top passages tie: share equally
    np.put_along_axis(out, top, weight * mass / mass.sum(axis=1, keepdims=True), axis=1)
    return out


# ----------------------------------------------------------------------- orchestrator

@dataclass(frozen=True)
class Retrieval:
    """Ranked passages for a batch: ``ranked`` / ``scores`` (Q, top_k); ``fallback`` (Q,) bool
    marks queries with no linked entity, ranked by dense sim(q, p) (appendix G.4)."""

    ranked: np.ndarray
    scores: np.ndarray
    fallback: np.ndarray
    bridging: Bridging


def activate_entities(
    query_emb: np.ndarray,
    seeds: sp.sparray,
    sentence_emb: np.ndarray,
    mention: sp.sparray,
    params: LinearRAGParams = LinearRAGParams(),
) -> Bridging:
    """First stage (section 3.2.1): eq. (4) relevance, then eq. (5) bridging from the eq. (3) ``seeds``."""
    return semantic_bridging(
        seeds, query_sentence_relevance(query_emb, sentence_emb), mention,
        params.iteration_threshold, params.max_iterations, params.top_k_sentence,
    )


def global_importance(
    passage_similarity: np.ndarray,
    bridging: Bridging,
    contain: sp.sparray,
    graph: sp.sparray | RandomWalk,
    params: LinearRAGParams = LinearRAGParams(),
    patch: SidePatch | None = None,
    entity_passage_log: sp.csr_array | None = None,
) -> np.ndarray:
    """Second stage (section 3.2.2): PPR scores of the P passages (Q x P).

    Reset = [eq. (7) I(p) on passages, a_q on entities] (``passage_reset: top_similarity``, beyond
    the paper: :func:`top_similarity_reset` on passages, a_q scaled to sum 1); ``graph`` is
    :func:`passage_entity_graph` or :func:`title_walk_graph` (passages first) or its :func:`tasks.graph.walk.random_walk`. A query with
    no active entity is ranked by ``passage_similarity`` itself (appendix G.4). ``patch`` (beyond the paper,
    alternating sweeps): each query's own passage -> entity transitions (:func:`relation_gate_patch`).
    ``entity_passage_log``: :func:`tasks.graph.sparse.log1p_transposed` of ``contain``, when the caller keeps it
    across batches.
    """
    entity_reset = sp.csr_array(bridging.activation)
    if params.passage_reset == "auto":
        raise ValueError("passage_reset=auto is resolved by the corpus (resolve_passage_reset) before the walk")
    if params.passage_reset == "top_similarity":  # beyond the paper
        passage_reset = top_similarity_reset(passage_similarity, params.passage_reset_depth,
                                             params.passage_reset_weight)
        sums = np.asarray(entity_reset.sum(axis=1), dtype=np.float64).ravel()
        entity_reset = sp.diags_array(1.0 / np.maximum(sums, 1e-300)) @ entity_reset.astype(np.float64)
    else:
        passage_reset = passage_initial_scores(
            passage_similarity, bridging.activation, bridging.level, contain,
            params.passage_ratio, params.passage_node_weight, entity_passage_log,
        )
    n_p = passage_similarity.shape[1]
    if params.ppr_sweeps == "alternating" and not isinstance(graph, RandomWalk):  # passages first, then entities
        graph = random_walk(graph, params.ppr_dtype, split=n_p)
    n_nodes = (graph.matrix if isinstance(graph, RandomWalk) else graph).shape[0]
    if n_nodes > n_p + entity_reset.shape[1]:  # document nodes (beyond the paper, with_document_nodes): no reset
        entity_reset = sp.csr_array(sp.hstack([entity_reset, sp.csr_array((entity_reset.shape[0],
                                                                          n_nodes - n_p - entity_reset.shape[1]))]))
    reset = [passage_reset, entity_reset]  # passages first, then entities: the blocks are not joined (eq. 7 is dense)
    importance = personalized_pagerank(graph, reset, params.damping, params.ppr_tol, params.ppr_max_iter,
                                       params.ppr_dtype, nodes=n_p, threads=params.ppr_threads,
                                       sweeps=params.ppr_sweeps, patch=patch)
    fallback = np.diff(sp.csr_array(bridging.activation).indptr) == 0
    return np.where(fallback[:, None], passage_similarity, importance)


def relation_gate_patch(gate: RelationGate, q_emb: np.ndarray, n_passages: int, n_entities: int) -> SidePatch:
    """Beyond the paper: the relation gate (:func:`tasks.graph.relation_gate.gate_patch`, built on
    the walk's column-stochastic matrix) as per-query changes to the PPR's passage -> entity transitions. Each
    passage keeps its total probability towards the titles it names, so the walk stays stochastic."""
    edges = gate_patch(gate, q_emb)
    return SidePatch.of(edges.src, edges.dst - n_passages, edges.delta.T, n_entities)


def linearrag_retrieve(
    query_emb: np.ndarray,
    query_entities: QueryEntities,
    passage_emb: np.ndarray,
    sentence_emb: np.ndarray,
    entity_emb: np.ndarray,
    contain: sp.sparray,
    mention: sp.sparray,
    params: LinearRAGParams = LinearRAGParams(),
    graph: sp.sparray | None = None,
    top_k: int | None = None,
) -> Retrieval:
    """Two-stage LinearRAG retrieval for a batch of queries, LinearRAG section 3.2 (eqs. (3)-(7)).

    Activation (eq. 3) -> bridging (eqs. 4-5) -> passage initial scores (eq. 7) -> PPR
    (eq. 6) on the passage-entity graph with reset = [I(p) on passages, a_q on entities]
    -> the ``top_k`` (default ``params.top_k``) passages by PPR score. Queries without a
    linked entity fall back to dense ranking (appendix G.4). ``graph`` may pass a prebuilt
    :func:`passage_entity_graph`. Memory is O(Q * (S + P + E)); split large query sets.
    """
    n_q = np.asarray(query_emb).shape[0]
    seeds = initial_activation(query_entities, entity_emb, params.min_similarity, n_queries=n_q)
    bridging = activate_entities(query_emb, seeds, sentence_emb, mention, params)
    passage_similarity = np.asarray(query_emb, np.float32) @ np.asarray(passage_emb, np.float32).T
    graph = passage_entity_graph(contain, params.edge_weighting) if graph is None else graph
    scores = global_importance(passage_similarity, bridging, contain, graph, params)
    ranked, top_scores = rank_passages(scores, params.top_k if top_k is None else top_k)
    return Retrieval(ranked, top_scores, np.diff(seeds.indptr) == 0, bridging)
