"""zoomrag online side: the retriever that answers questions over the stored index."""
from __future__ import annotations

import json
import time
from concurrent.futures import Future

import numpy as np
import pandas as pd
import scipy.sparse as sp

from tasks.core.store import ArtifactRef, Store
from tasks.data.corpus import documents_cut, stored_source_documents
from tasks.eval.retrieve import Hits
from tasks.graph.sparse import coo_matrix, links_matrix
from tasks.methods.zoomrag import algorithm as zoom
from tasks.methods.zoomrag.params import ZoomRAGParams
from tasks.text.embed import EmbedderParams, encode_queries, encode_queries_beside, load_embeddings
from tasks.text.entities import query_entity_links
from tasks.text.gazetteer import Gazetteer, aliases_of, lowercase_only, mask_names
from tasks.text.linking import name_idf, query_seeds, title_restart
from tasks.text.linking_stages import masked_relation_gate
from tasks.text.title_index import TitleIndex
from tasks.llm.ner_backends import QueryRecogniser


class ZoomRetriever:
    """Online ZoomRAG: query NER + encoding → DocZoom over M → ChunkZoom over the top-K documents."""

    def __init__(self, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], params: ZoomRAGParams,
                 embedder: EmbedderParams, recogniser: QueryRecogniser | None) -> None:
        self.params, self.embedder, self.recogniser = params, embedder, recogniser
        self.doc_ids, self.doc_emb = load_embeddings(index["doc_embeddings"], "doc_id")
        # beyond the paper (#58, method.split_walk): on documents cut into passages, DocZoom's own walk settings
        self.split = params.split_walk and documents_cut(self.source_documents(data))
        self.walk = params.walk(split=self.split)
        meta = Store.read(index["M_meta"]).iloc[0]
        self.n, self.m = int(meta["n_docs"]), int(meta["n_entities"])
        self.scales = json.loads(meta["scales"])
        M = coo_matrix(Store.read(index["M"]), (self.n + self.m, self.n + self.m)).astype(params.walk_dtype,
                                                                                           copy=False)
        vocab = Store.read(index["entities"])
        self.entity_names = vocab["entity"].to_numpy()
        self.vocab_index = dict(zip(vocab["entity"], vocab["entity_idx"]))
        self.max_words = int(min(params.max_entity_words, vocab["n_words"].to_numpy().max(initial=1)))
        if params.query_linking == "gazetteer":  # beyond the paper: IDF-weighted names the question contains
            self.gazetteer = Gazetteer.of(self.entity_names, params.gazetteer_min_chars, aliases_of(vocab))
            doc_entity = Store.read(index["doc_entity"])
            self.idf = name_idf(coo_matrix(doc_entity, (self.n, self.m)))
            self.titles = TitleIndex.read(data["documents"], self.doc_ids, self.gazetteer,
                                          qualified=params.cover_named_min_seed > 0)
            if self.walk.title_walk:  # beyond the paper: title entities lead the walk to the documents they title
                w = self.walk
                lowercase = lowercase_only(doc_entity, (self.n, self.m)) if w.lowercase_name_weight != 1.0 else None
                M = zoom.title_walk_block(M, self.n, self.titles.titled, self.idf, w.title_edge_weight,
                                          w.title_name_weight, w.idf_edges, lowercase, w.lowercase_name_weight)
        self._load_chunks(data, index)
        self.gate = None
        if params.relation_gate_temperature > 0:  # beyond the paper: the question's relation picks the bridge
            self.gate = zoom.relation_gate(M, self.n, self.titles.titled, self.chunk_entity, self.chunk_doc,
                                           self.chunk_emb, params.relation_gate_temperature)
            if params.relation_gate_masked:  # the naming sentences without their names (relation_sentences)
                self.gate = masked_relation_gate(self.gate, index, self.chunk_ids)
        self.graph = zoom.walk_graph(M, params.walk_node_order, params.walk_dtype)  # once: M renumbered
        encode_queries(["warm-up"], embedder)
        self.fallbacks = 0

    def source_documents(self, data: dict[str, ArtifactRef]) -> np.ndarray:
        """Each document's (passage's) source document, in ``doc_ids`` order (a passage without lineage: itself)."""
        return stored_source_documents(data["documents"]).reindex(self.doc_ids).to_numpy()

    def _load_chunks(self, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef]) -> None:
        chunks = Store.read(index["chunks"], ["chunk_id", "doc_id", "position", "text"])
        doc_pos = pd.Series(np.arange(self.n), index=pd.Index(self.doc_ids))
        self.chunk_doc = doc_pos.loc[chunks["doc_id"]].to_numpy()
        self.chunk_pos = chunks["position"].to_numpy()
        self.chunk_text = chunks["text"].to_numpy()
        self.chunk_ids, self.chunk_emb = load_embeddings(index["chunk_embeddings"], "chunk_id")
        if not np.array_equal(self.chunk_ids, chunks["chunk_id"].to_numpy(dtype=object)):
            raise RuntimeError("chunk embeddings are not aligned with the chunks table; delete the artifacts")
        self.chunk_entity = coo_matrix(Store.read(index["chunk_entity"]), (len(chunks), self.m))
        self.chunk_entity_rows = sp.csr_array(self.chunk_entity)  # row slices for the local graph's bound
        self.chunk_entity_rows.eliminate_zeros()

    def query_links(self, questions: list[str]) -> list[list[int]]:
        """Vocabulary entities each question contains (n-gram matches and its NER mentions)."""
        return query_entity_links(questions, self.vocab_index, self.max_words, self.recogniser.names(questions))

    def query_entity(self, questions: list[str]) -> tuple[list[list[int]], sp.csr_array]:
        """Each question's linked entities and its (q x m) query–entity block: the paper's 0/1 links, or
        (``query_linking: gazetteer``) the gazetteer's names weighted by IDF, with the NER names kept."""
        if self.params.query_linking != "gazetteer":
            links = self.query_links(questions)
            return links, links_matrix(links, self.m)
        block = query_seeds(questions, self.gazetteer, self.idf, self.params.query_lowercase_weight)
        if self.params.query_ner:  # spaCy's mentions (and the n-gram matches) kept beside the gazetteer's names
            ner = sp.csr_array(links_matrix(self.query_links(questions), self.m).multiply(self.idf[None, :]))
            block = sp.csr_array(block.maximum(ner))
        block.eliminate_zeros()
        return [block.indices[a:b].tolist() for a, b in zip(block.indptr[:-1], block.indptr[1:])], block

    def encode(self, questions: list[str], pending: Future[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The questions' embeddings (``pending``'s, when they are being encoded already), and what the relation
        gate compares: the same, or (``relation_gate_masked``) the questions' embeddings with their capitalised
        names left out."""
        q_emb = pending.result() if pending is not None else encode_queries(questions, self.embedder)
        if self.gate is None or not self.params.relation_gate_masked:
            return q_emb, q_emb
        return q_emb, encode_queries(mask_names(questions, self.gazetteer), self.embedder)

    def query_doc(self, q_emb: np.ndarray) -> tuple[np.ndarray, sp.csr_array]:
        """(q x n) cosines (the tie-break) and A_doc->qry = exp(cos) kept above mean + k_std·std (eq. 2)."""
        cos = q_emb @ self.doc_emb.T
        return cos, zoom.query_doc_block(cos, self.walk.k_std, self.walk.query_doc_best)

    def search(self, questions: list[str], k: int) -> Hits:
        """Rank documents by DocZoom (ties by cosine); ChunkZoom picks each query's evidence chunks."""
        t = [time.perf_counter()]
        pending = encode_queries_beside(questions, self.embedder)  # encoded while the entities are recognised
        links, query_entity = self.query_entity(questions)
        t.append(time.perf_counter())
        q_emb, gate_emb = self.encode(questions, pending)
        t.append(time.perf_counter())
        cos, query_doc = self.query_doc(q_emb)
        if self.params.query_linking == "gazetteer":  # the restart also starts at the passages the names title
            query_doc = title_restart(query_doc, cos, query_entity, self.titles.titled)
        scores = zoom.doc_zoom(self.graph, query_doc, query_entity, self.walk,
                               weighted_entities=self.params.query_linking == "gazetteer", gate=self.gate,
                               q_emb=gate_emb)
        ordering = scores
        if self.params.cover_named_min_seed > 0:  # beyond the paper: each named entity's document first
            ordering = scores.copy()
            ordering[:, 1:1 + self.n] = self.titles.cover(scores[:, 1:1 + self.n], query_entity, questions,
                                                          self.params.cover_named_min_seed)
        ranked = zoom.top_docs(ordering, self.n, max(k, self.walk.top_k_docs), tie_break=cos)
        t.append(time.perf_counter())
        trace = self._chunk_zoom(questions, links, scores, ranked, q_emb) if self.walk.fine_stage else None
        t.append(time.perf_counter())
        doc_scores = np.take_along_axis(scores[:, 1:1 + self.n], ranked, 1)
        parts = dict(zip(["query_ner", "query_encoding", "doc_zoom", "chunk_zoom"], np.diff(t)))
        return Hits(ranked[:, :k], doc_scores[:, :k], parts, trace)

    def _chunk_zoom(self, questions: list[str], links: list[list[int]], scores: np.ndarray,
                    ranked: np.ndarray, q_emb: np.ndarray) -> list[dict]:
        """ChunkZoom over each query's top-K documents; returns the per-query trace with kept chunks.

        Queries are solved in groups of similar local-graph size, so padding (and the cubic
        solve) is sized to the group rather than to the largest graph of the whole batch. Beyond the paper,
        a local graph is bounded (``chunk_local_max_nodes``) and so is a group (``chunk_zoom_max_cells``).
        """
        top = ranked[:, :self.walk.top_k_docs]
        entity_scores = scores[:, 1 + self.n:]
        chunks = zoom.bound_local_chunks(zoom.gather_chunks(top, self.chunk_doc), self.chunk_entity_rows,
                                         self.chunk_emb, q_emb, entity_scores, self.params.chunk_local_max_nodes)
        n_chunks = (chunks >= 0).sum(axis=1)
        order = np.argsort(n_chunks, kind="stable")
        groups = zoom.solve_groups(order, zoom.local_sizes(chunks, self.chunk_entity_rows),
                                   self.params.chunk_group_size, self.params.chunk_zoom_max_cells)
        trace: list[dict] = [{} for _ in questions]
        for group in groups:
            res = zoom.chunk_zoom_batch(top[group], self.chunk_doc, self.chunk_pos, self.chunk_emb,
                                        self.chunk_entity, entity_scores[group], self.walk,
                                        chunks=chunks[group][:, :int(n_chunks[group].max(initial=0))])
            for row, i in enumerate(group):
                keep = res.keep[row] & (res.chunks[row] >= 0)
                best = np.argsort(-np.where(keep, res.scores[row], -np.inf))[:int(keep.sum())]
                trace[i] = {"seed_entities": [str(self.entity_names[e]) for e in links[i]],
                            "top_docs": [str(d) for d in self.doc_ids[top[i]]],
                            "top_doc_scores": [float(s) for s in scores[i, 1 + top[i]]],
                            "kept_chunks": [str(self.chunk_text[c]) for c in res.chunks[row][best]],
                            "context_docs": [[str(self.doc_ids[self.chunk_doc[c]])] for c in res.chunks[row][best]],
                            "kept_chunk_scores": [float(s) for s in res.scores[row][best]]}
        return trace

    def memory_probe(self, questions: list[str]) -> dict[str, float]:
        """Peak bytes allocated by the DocZoom walk alone for this batch (tracemalloc), and M's size."""
        import tracemalloc

        _, links = self.query_entity(questions)
        q_emb, gate_emb = self.encode(questions)
        _, query_doc = self.query_doc(q_emb)
        tracemalloc.start()
        zoom.doc_zoom(self.graph, query_doc, links, self.walk, weighted_entities=self.params.query_linking == "gazetteer",
                      gate=self.gate, q_emb=gate_emb)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        M = self.graph.matrix
        m_bytes = M.data.nbytes + M.indices.nbytes + M.indptr.nbytes
        return {"walk_peak_mb": peak / 2**20, "M_mb": m_bytes / 2**20}

    def run_stats(self) -> dict:
        """Index facts worth reporting with the metrics."""
        return {"n_entities": self.m, "M_nnz": int(self.graph.matrix.nnz), "block_scales": self.scales,
                "split_walk": self.split}
