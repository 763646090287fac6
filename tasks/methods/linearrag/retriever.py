"""linearrag online side: the retriever that answers questions over the stored index (its settings:
:class:`tasks.methods.linearrag.params.LinearParams`).

LinearRAG builds no index stage of its own (:mod:`tasks.methods.linearrag.stages`): the algorithms live in :mod:`tasks.methods.linearrag.algorithm` (pure
numpy/scipy), and the Tri-Graph's matrices are the shared entity layer's incidence tables
(:func:`tasks.text.entities.entity_graph` over sentence chunks): ``doc_entity`` is the contain matrix C (mention
counts N_{e,p}), ``chunk_entity`` the mention matrix M (binarised on load).
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pandas as pd
import scipy.sparse as sp

from tasks.core.store import ArtifactRef, Store
from tasks.eval.retrieve import Hits
from tasks.graph.relation_gate import relation_gate
from tasks.graph.second_hop import second_hop, title_links
from tasks.graph.sparse import coo_matrix, group_positions, log1p_transposed, transposed_csr
from tasks.graph.walk import random_walk
from tasks.methods.linearrag import algorithm as lr
from tasks.text.embed import EmbedderParams, encode_queries, encode_queries_beside, load_embeddings
from tasks.text.gazetteer import Gazetteer, aliases_of, lowercase_only, mask_names
from tasks.text.linking import name_idf, query_seeds
from tasks.text.linking_stages import masked_relation_gate
from tasks.text.question_parse import load_parser, parse_questions, rest_of_question
from tasks.text.title_index import TitleIndex
from tasks.llm.ner_backends import QueryRecogniser
from tasks.data.corpus import documents_cut, stored_source_documents
from tasks.methods.linearrag.params import LinearParams


def _dot(a: np.ndarray, b: np.ndarray, via_torch: bool) -> np.ndarray:
    """``a @ b.T``: through numpy, or (``via_torch``, when questions were encoded by torch) on torch's thread pool.

    Right after a torch encode, numpy's BLAS threads contend with torch's still-spinning OpenMP workers
    (one question against 2Wiki's 6,119 passages: 2.3 ms through numpy, 1.1 through torch). After an ONNX
    Runtime encode, which does not spin, numpy is the faster: 0.41 against 1.03 ms for one question, 7.3
    against 10.7 ms for 256, and 1.9 against 4.7 ms for one question against 30,011 entities.
    """
    if a.shape[0] == 0 or b.shape[0] == 0:
        return np.zeros((a.shape[0], b.shape[0]), np.float32)
    if not via_torch:
        return np.ascontiguousarray(a, np.float32) @ b.T
    import torch

    return (torch.from_numpy(np.ascontiguousarray(a, np.float32)) @ torch.from_numpy(b).T).numpy()


class LinearRetriever:
    """Online LinearRAG for a batch: query NER + encoding -> eq. (3) seeds -> bridging -> eq. (7) + PPR."""

    def __init__(self, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], params: LinearParams,
                 embedder: EmbedderParams, recogniser: QueryRecogniser | None, parser_model: str | None = None) -> None:
        self.params, self.algo, self.embedder, self.recogniser = params, params.retrieval(), embedder, recogniser
        self.parser_model = parser_model  # second_hop_query=parsed: the spaCy pipeline that parses questions
        self.doc_ids, self.passage_emb = load_embeddings(index["passage_embeddings"], "doc_id")
        if params.passage_reset == "auto":  # beyond the paper: top_similarity where documents are cut into passages
            cut = documents_cut(self.source_documents(data))
            self.algo = replace(self.algo, passage_reset=lr.resolve_passage_reset("auto", cut))
        sentence_ids, self.sentence_emb = load_embeddings(index["sentence_embeddings"], "chunk_id")
        sentences = Store.read(index["sentences"], ["chunk_id", "doc_id"])
        chunks = sentences["chunk_id"].to_numpy(dtype=object)
        if not np.array_equal(sentence_ids, chunks):
            raise RuntimeError("sentence embeddings are not aligned with the sentences table; delete the artifacts")
        vocab = Store.read(index["entities"]).sort_values("entity_idx")
        self.entity_names = vocab["entity"].astype(str).to_numpy(dtype=object)
        if "entity_embeddings" in index:
            entity_ids, self.entity_emb = load_embeddings(index["entity_embeddings"], "entity_id")
            if not np.array_equal(entity_ids, self.entity_names):
                raise RuntimeError("entity embeddings are not aligned with the vocabulary; delete the artifacts")
        else:  # method.query_ner=false: no question string is matched by cosine, so none were computed
            self.entity_emb = np.zeros((len(self.entity_names), 0), np.float32)
        # writable and contiguous, as torch.from_numpy (see _dot) wants: load_embeddings' arrays are, so no copy
        self.passage_emb, self.sentence_emb, self.entity_emb = (
            np.require(x, np.float32, ["C", "W"]) for x in (self.passage_emb, self.sentence_emb, self.entity_emb))
        self.vocab_index = {name: i for i, name in enumerate(self.entity_names.tolist())}  # a dict: O(1) per name
        n_p, n_s, n_e = len(self.doc_ids), len(chunks), len(self.entity_names)
        contain = Store.read(index["contain"])
        self.contain = coo_matrix(contain, (n_p, n_e))
        self.mention = coo_matrix(Store.read(index["mention"]), (n_s, n_e))
        self.mention.data[:] = 1.0  # eq. (2): binary sentence-entity edges (appendix G.3)
        # the transposes every batch reads, made once (at 100k passages: 433,076 and 360,292 entries)
        self.entity_sentence = transposed_csr(self.mention)
        self.entity_passage_log = log1p_transposed(self.contain)
        if params.query_linking == "gazetteer" or params.graph_linking == "gazetteer":
            self.gazetteer = Gazetteer.of(self.entity_names, params.gazetteer_min_chars, aliases_of(vocab))
            self.idf = name_idf(self.contain)
        if params.graph_linking == "gazetteer":  # titles are entity nodes: the title walk and cover_named use them
            self.titles = TitleIndex.read(data["documents"], self.doc_ids, self.gazetteer,
                                          qualified=params.cover_named_min_seed > 0)
        self.n_document_nodes = 0  # the title walk's graph has none: its title entities link a document's passages
        if self.algo.title_walk:  # beyond the paper: title entities lead the walk to the passages they title
            a = self.algo
            lowercase = lowercase_only(contain, (n_p, n_e)) if a.lowercase_name_weight != 1.0 else None
            self.graph = lr.title_walk_graph(self.contain, self.titles.titled, self.idf, a.edge_weighting,
                                             a.title_edge_weight, a.title_name_weight, a.idf_edges, lowercase,
                                             a.lowercase_name_weight)
        elif self.algo.document_nodes:  # beyond the paper: the passages cut from one document share its node
            linked = lr.with_document_nodes(self.contain, self.source_documents(data))
            self.n_document_nodes = linked.shape[1] - n_e
            self.graph = lr.passage_entity_graph(linked, self.algo.edge_weighting)
        else:
            self.graph = lr.passage_entity_graph(self.contain, self.algo.edge_weighting)
        split = n_p if self.algo.ppr_sweeps == "alternating" else 0  # passages first, then entities: bipartite
        self.walk = random_walk(self.graph, self.algo.ppr_dtype, split=split)
        self.gate = None
        if self.algo.relation_gate_temperature > 0:  # beyond the paper: the question's relation picks the bridge
            sentence_doc = pd.Series(np.arange(n_p), index=pd.Index(self.doc_ids)).loc[sentences["doc_id"]].to_numpy()
            self.gate = relation_gate(self.walk.matrix, n_p, self.titles.titled, self.mention, sentence_doc,
                                      self.sentence_emb, self.algo.relation_gate_temperature)
            if params.relation_gate_masked:  # the naming sentences without their names (relation_sentences)
                self.gate = masked_relation_gate(self.gate, index, chunks)
        if params.second_hop:  # beyond the paper: the passages the first hop's top passages are title-linked to
            self.links = title_links(self.contain, self.titles.titled, params.second_hop_links)
            if params.second_hop_query == "parsed":
                if parser_model is None:
                    raise ValueError("method.second_hop_query=parsed needs a spaCy pipeline with a parser (ner.model)")
                load_parser(parser_model)
        encode_queries(["warm-up"], embedder)
        self.queries = self.fallbacks = self.seeds_total = self.active_total = self.hop_rounds = 0

    def source_documents(self, data: dict[str, ArtifactRef]) -> np.ndarray:
        """(P,) each passage's source document (its lineage ``document``; a passage without one is its own)."""
        return stored_source_documents(data["documents"]).reindex(self.doc_ids).to_numpy()

    def lookup(self, names: list[list[str]]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Query entity strings -> (query of each, vocabulary index or -1, the strings not in the vocabulary)."""
        q_idx = np.repeat(np.arange(len(names)), [len(x) for x in names])
        flat = [n for x in names for n in x]
        col = np.fromiter((self.vocab_index.get(n, -1) for n in flat), dtype=np.int64, count=len(flat))
        return q_idx, col, [n for n, c in zip(flat, col) if c < 0]

    def seed_activation(self, n_q: int, q_idx: np.ndarray, col: np.ndarray, unseen_emb: np.ndarray,
                        questions: list[str] | None = None) -> sp.csr_array:
        """Eq. (3) seeds (Q x E) from :meth:`lookup` and the embeddings of its unseen strings.

        A query entity whose normalised string is a corpus entity links to it with similarity 1
        (its own embedding is the arg-max); only the other strings are matched by cosine. With
        ``query_linking: gazetteer`` (beyond the paper) an exact link weighs the name's IDF instead
        of 1, and the names the ``questions`` contain are seeds too, with their IDF (max per cell).
        """
        known = col >= 0
        similarity = _dot(unseen_emb, self.entity_emb, self.dot_via_torch)
        matched = lr.activation_from_similarity(q_idx[~known], similarity, n_q, self.algo.min_similarity)
        gazetteer = self.params.query_linking == "gazetteer"
        weight = self.idf[col[known]].astype(np.float32) if gazetteer else np.ones(known.sum(), np.float32)
        exact = sp.csr_array((weight, (q_idx[known], col[known])), shape=matched.shape)
        seeds = sp.csr_array(matched.maximum(exact))
        if gazetteer and questions is not None:
            seeds = sp.csr_array(seeds.maximum(query_seeds(questions, self.gazetteer, self.idf,
                                                             self.params.query_lowercase_weight).astype(np.float32)))
        seeds.eliminate_zeros()
        return seeds

    def rests(self, questions: list[str]) -> list[str]:
        """Each question without the bridge it describes (:func:`tasks.text.question_parse.rest_of_question`), else
        whole, and then masked (the names it writes capitalised left out)."""
        parsed = parse_questions(questions, self.parser_model)
        return mask_names([rest_of_question(t) or q for q, t in zip(questions, parsed)], self.gazetteer)

    @property
    def dot_via_torch(self) -> bool:
        """Products after a question encode run on torch only when torch encoded the questions (see :func:`_dot`)."""
        return self.embedder.query_runtime == "torch"

    def search(self, questions: list[str], k: int) -> Hits:
        """Top-k passages by LinearRAG's PPR importance (dense order for queries with no linked entity)."""
        n_q = len(questions)
        t0 = time.perf_counter()
        pending = encode_queries_beside(questions, self.embedder)  # encoded while the entities are recognised
        names = self.recogniser.names(questions) if self.params.query_ner else [[] for _ in questions]
        t1 = time.perf_counter()
        q_idx, col, unseen = self.lookup(names)
        unseen_emb = encode_queries(unseen, self.embedder)
        q_emb = gate_emb = pending.result()
        masked = self.gate is not None and self.params.relation_gate_masked  # the gate reads the relation alone
        if masked or (self.params.second_hop and self.params.second_hop_query == "masked"):
            gate_emb = encode_queries(mask_names(questions, self.gazetteer), self.embedder)
        hop_emb = None
        if self.params.second_hop:  # what the second hop matches a candidate with (SecondHopParams)
            hop_emb = {"whole": q_emb, "masked": gate_emb}.get(self.params.second_hop_query)
            if self.params.second_hop_query == "parsed":
                hop_emb = encode_queries(self.rests(questions), self.embedder)
        t2 = time.perf_counter()
        seeds = self.seed_activation(n_q, q_idx, col, unseen_emb, questions)
        a = self.algo
        relevance = lr.PairRelevance(np.asarray(q_emb, np.float32), self.sentence_emb)  # eq. (4): the pairs read
        bridging = lr.semantic_bridging(seeds, relevance, self.mention,  # eqs. (4)-(5)
                                        a.iteration_threshold, a.max_iterations, a.top_k_sentence,
                                        self.entity_sentence)
        t3 = time.perf_counter()
        similarity = _dot(q_emb, self.passage_emb, self.dot_via_torch)
        patch = None
        if self.gate is not None:
            patch = lr.relation_gate_patch(self.gate, gate_emb, len(self.doc_ids), len(self.entity_names))
        scores = lr.global_importance(similarity, bridging, self.contain, self.walk, self.algo, patch,
                                      self.entity_passage_log)
        cover = self.params.cover_named_min_seed
        ranking = self.titles.cover(scores, seeds, questions, cover) if cover > 0 else scores  # beyond the paper:
        t4 = time.perf_counter()  # each named entity's passage first
        rounds = np.zeros(n_q, np.int64)
        if self.params.second_hop:  # beyond the paper: follow the titles the top passages name, and what names them
            scores, rounds = second_hop(ranking, self.links, hop_emb, self.passage_emb, self.params)
            ranking = self.titles.cover(scores, seeds, questions, cover) if cover > 0 else scores  # named stay first
        ranked, _ = lr.rank_passages(ranking, k)
        top = np.take_along_axis(scores, ranked, axis=1)
        t5 = time.perf_counter()
        fallback = np.diff(seeds.indptr) == 0
        self.queries += n_q
        self.fallbacks += int(fallback.sum())
        self.seeds_total += int(seeds.nnz)
        self.active_total += int(bridging.activation.nnz)
        parts = {"query_ner": t1 - t0, "query_encoding": t2 - t1, "bridging": t3 - t2, "ppr": t4 - t3,
                 "second_hop": t5 - t4}
        self.hop_rounds += int(rounds.sum())
        return Hits(ranked, top, parts, self._trace(names, seeds, bridging, fallback, ranked, top, rounds))

    def _trace(self, names: list[list[str]], seeds: sp.csr_array, bridging: lr.Bridging, fallback: np.ndarray,
               ranked: np.ndarray, top: np.ndarray, rounds: np.ndarray) -> list[dict]:
        """Per query: its entity strings, seeds with eq. (3) scores, entities new at each step, top passages."""
        n_q = len(names)
        steps = [[e[g] for g in group_positions(q, n_q)] for q, e in bridging.trace]  # per query, stable
        trace = []
        for i in range(n_q):
            cols = seeds.indices[seeds.indptr[i]:seeds.indptr[i + 1]]
            vals = seeds.data[seeds.indptr[i]:seeds.indptr[i + 1]]
            trace.append({"query_entities": names[i],
                          "seeds": self.entity_names[cols].tolist(), "seed_scores": np.round(vals, 4).tolist(),
                          "activated": [self.entity_names[s[i]].tolist() for s in steps],
                          "dense_fallback": bool(fallback[i]), "second_hop_rounds": int(rounds[i]),
                          "top_passages": self.doc_ids[ranked[i]].tolist(), "top_scores": top[i].tolist()})
        return trace

    def run_stats(self) -> dict:
        """Index facts and per-run counters (accumulated over every batch searched)."""
        q = max(self.queries, 1)
        return {"dense_fallback_queries": self.fallbacks, "n_entities": len(self.entity_names),
                "n_document_nodes": self.n_document_nodes,
                "passage_reset": self.params.passage_reset + (f" -> {self.algo.passage_reset}"
                                                              if self.algo.passage_reset != self.params.passage_reset else ""),
                "n_sentences": self.sentence_emb.shape[0], "contain_nnz": int(self.contain.nnz),
                "mention_nnz": int(self.mention.nnz), "seeds_per_query": round(self.seeds_total / q, 3),
                "active_entities_per_query": round(self.active_total / q, 3),
                "second_hop_rounds_per_query": round(self.hop_rounds / q, 3)}


__all__ = ["LinearParams", "LinearRetriever"]
