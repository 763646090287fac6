"""The relation gate (beyond the papers), shared by ZoomRAG's DocZoom and LinearRAG's PPR.

A passage that names several titles (a film's director, producer and cast) sends a title walk's mass to all of
them alike; the gate re-weights, per question, its edges to those titles by how well the sentence naming each
reads like the question. numpy / scipy.sparse only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class RelationGate:
    """Beyond the paper: which of the titles a document names does the question's relation point to?

    A document that names several titles (a film's director, producer and cast) sends the title walk's mass to
    all of them alike. The gate re-weights, per question, M's document -> title-entity edges (entity e names
    another document; a document's own title is left out) by the question's cosine to the sentences that
    write the name: within document p's gated edges, edge (p, e) gets the share of their total weight T_p
    proportional to M[e, p] exp(s_qpe / temperature), with s_qpe the best cosine over p's chunks writing e.
    T_p is kept, so each column sum of M, and with it eq. (7)'s normalisation, is unchanged.
    """

    doc: np.ndarray  # (P,) stored node of document p, sorted
    entity: np.ndarray  # (P,) stored node of entity e (n + entity index)
    weight: np.ndarray  # (P,) M[n + e, p] (float64)
    starts: np.ndarray  # first pair of each document (the pairs are grouped by document)
    pair_chunks: sp.csr_array  # (P x C) 1 at the gate's chunks of p that write e
    chunk_emb: np.ndarray  # (C, d) those chunks' embeddings (unit length, as the questions')
    temperature: float
    chunks: np.ndarray  # (C,) the chunk each row of chunk_emb embeds


@dataclass(frozen=True)
class EdgePatch:
    """Per-query additions to the walk matrix: query i walks on M + delta[i] at (``dst``, ``src``) (stored nodes)."""

    src: np.ndarray  # (P,)
    dst: np.ndarray  # (P,)
    delta: np.ndarray  # (q, P)


def relation_gate(M: sp.sparray, n_docs: int, titled: sp.sparray, chunk_entity: sp.sparray,
                  chunk_doc: np.ndarray, chunk_emb: np.ndarray, temperature: float) -> RelationGate:
    """The :class:`RelationGate` of M (stored numbering: documents, then entities) for ``temperature`` > 0.
    M is read by columns (``M[dst, src]``): ZoomRAG's M, or LinearRAG's column-stochastic walk matrix, whose
    gated shares are then transition probabilities.

    ``titled`` (m x n) is 1 where entity e is document p's title; ``chunk_entity`` (chunks x m) where a chunk
    writes e; ``chunk_doc`` each chunk's document. Gated pairs: e titles some document, p is not titled by e,
    a chunk of p writes e, and M holds the edge p -> e.
    """
    if temperature <= 0:
        raise ValueError(f"the relation gate needs a temperature > 0, got {temperature}")
    titled = sp.csr_array(titled)
    is_title = np.asarray(titled.sum(axis=1)).ravel() > 0
    ce = sp.coo_array(chunk_entity)
    chunk, ent = ce.row.astype(np.int64), ce.col.astype(np.int64)
    doc = np.asarray(chunk_doc, np.int64)[chunk]
    own = np.asarray(titled[ent, doc]).ravel() != 0
    keep = is_title[ent] & ~own
    chunk, ent, doc = chunk[keep], ent[keep], doc[keep]
    m = titled.shape[0]
    # scipy returns a sparse array, not values, for an empty fancy index: no pair is gated (a corpus whose titles
    # no other document writes)
    weight_all = (np.asarray(sp.csr_array(M)[n_docs + ent, doc], dtype=np.float64).ravel() if len(ent)
                  else np.zeros(0))
    keep = weight_all > 0
    chunk, ent, doc, weight_all = chunk[keep], ent[keep], doc[keep], weight_all[keep]
    if not len(chunk):  # nothing to gate: the walk keeps M as it is
        none = np.zeros(0, np.int64)
        return RelationGate(none, none, np.zeros(0), none, sp.csr_array((0, 0)),
                            np.zeros((0, chunk_emb.shape[1]), np.float32), float(temperature), none)
    key = doc * m + ent
    order = np.lexsort((chunk, key))
    chunk, key, weight_all = chunk[order], key[order], weight_all[order]
    first = np.r_[True, key[1:] != key[:-1]]
    pair_key, weight = key[first], weight_all[first]
    pair_of = np.cumsum(first) - 1
    used, local = np.unique(chunk, return_inverse=True)
    pair_chunks = sp.csr_array((np.ones(len(chunk)), (pair_of, local)), shape=(len(pair_key), len(used)))
    pair_chunks.sum_duplicates()
    pdoc, pent = pair_key // m, pair_key % m
    starts = np.flatnonzero(np.r_[True, pdoc[1:] != pdoc[:-1]]) if len(pdoc) else np.zeros(0, np.int64)
    return RelationGate(pdoc, n_docs + pent, weight, starts, pair_chunks,
                        np.ascontiguousarray(chunk_emb[used], dtype=np.float32), float(temperature), used)


def gate_patch(gate: RelationGate, q_emb: np.ndarray) -> EdgePatch:
    """The per-question change the gate makes to M (an :class:`EdgePatch`; its rows sum to 0 per document)."""
    q = q_emb.shape[0]
    if len(gate.doc) == 0:
        return EdgePatch(gate.doc, gate.entity, np.zeros((q, 0)))
    pc = gate.pair_chunks
    sims = (np.asarray(q_emb, np.float32) @ gate.chunk_emb.T).astype(np.float64)
    best = np.maximum.reduceat(sims[:, pc.indices], pc.indptr[:-1], axis=1)  # s_qpe: p's best chunk writing e
    logit = np.log(gate.weight)[None, :] + best / gate.temperature
    group = np.repeat(np.arange(len(gate.starts)), np.diff(np.r_[gate.starts, len(gate.doc)]))
    logit -= np.maximum.reduceat(logit, gate.starts, axis=1)[:, group]
    share = np.exp(logit)
    share /= np.add.reduceat(share, gate.starts, axis=1)[:, group]
    total = np.add.reduceat(gate.weight, gate.starts)[group]  # T_p, kept
    return EdgePatch(gate.doc, gate.entity, share * total[None, :] - gate.weight[None, :])
