"""serag online side: (self-query →) encode → coarse communities → hybrid chunk scores → passages (§3.3)."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from tasks.core.store import ArtifactRef, Store
from tasks.data.corpus import stored_source_documents
from tasks.eval.retrieve import Hits
from tasks.graph.sparse import coo_matrix, links_matrix, log1p_transposed
from tasks.methods.serag import algorithm as se
from tasks.methods.serag.params import SeRAGParams
from tasks.methods.serag.stages import chunk_frame
from tasks.text.embed import EmbedderParams, encode_queries, encode_queries_beside, load_embeddings
from tasks.text.entities import query_entity_links
from tasks.text.gazetteer import Gazetteer, aliases_of
from tasks.text.linking import name_idf, query_seeds
from tasks.text.title_index import TitleIndex
from tasks.llm.ner_backends import QueryRecogniser

SELF_QUERY_STAGE = "serag_self_query"
# App. A.1 (Fig. 3) asks the LLM for a fact-dense passage that names the intermediate entities of a
# multi-hop question and prefers a broad description to invented facts. Our own wording, zero-shot
# (the paper's four worked examples are left out: our choice, it keeps prompts short).
SELF_QUERY_SYSTEM = (
    "You help a search engine find evidence for complex questions. Write one short, factual passage "
    "that could answer the question: name the intermediate people, places, works or organisations the "
    "question depends on and connect them. Where you do not know a fact, describe the kind of entity "
    "involved in general terms rather than making details up. Reply with the passage only."
)


class SelfQuery:
    """§3.3 / App. A.1: the LLM's pseudo-document, concatenated with the query before encoding.

    Replies are cached and counted in the LLM ledger under ``serag_self_query``. ``client is None``
    (no LLM configured, or ``method.self_query=false``): questions pass through unchanged.
    """

    def __init__(self, client, max_tokens: int) -> None:
        self.client, self.max_tokens = client, max_tokens

    @property
    def enabled(self) -> bool:
        return self.client is not None

    def __call__(self, questions: list[str]) -> list[str]:
        if self.client is None:
            return list(questions)
        msgs = [[{"role": "system", "content": SELF_QUERY_SYSTEM}, {"role": "user", "content": f"Query: {q}"}]
                for q in questions]
        replies = self.client.chat_many(msgs, stage=SELF_QUERY_STAGE, max_tokens=self.max_tokens)
        return [f"{q}\n{(r.text or '').strip()}".strip() for q, r in zip(questions, replies)]


def self_query_client(params: SeRAGParams, llm, artifacts_dir: str):
    """The LLM client for self-query, or None (self-query off, or no LLM configured)."""
    if not params.self_query or llm is None or getattr(llm, "provider", "none") == "none":
        return None
    from tasks.llm.client import make_client

    return make_client(llm, Path(artifacts_dir) / "llm_cache.duckdb")


def query_entity_pairs(links: list[list[int]], oov: list[list[str]]
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """The (query, entity) pairs of a batch over its distinct entities: ``(owner, name_row, known,
    unknown)``. Pair ``i`` is query ``owner[i]`` and name row ``name_row[i]``; rows ``0 ..
    len(known) − 1`` are the vocabulary entities ``known`` (sorted, each once), the next rows the
    distinct out-of-vocabulary names ``unknown`` (first-seen order)."""
    n_links = np.fromiter((len(x) for x in links), np.int64, len(links))
    vocab = np.fromiter((e for x in links for e in x), np.int64, int(n_links.sum()))
    known, vocab_row = np.unique(vocab, return_inverse=True)
    flat = [n for x in oov for n in x]
    row_of = {n: i for i, n in enumerate(dict.fromkeys(flat))}
    oov_row = np.fromiter((row_of[n] for n in flat), np.int64, len(flat)) + len(known)
    q = np.arange(len(links))
    owner = np.concatenate([np.repeat(q, n_links), np.repeat(q, [len(x) for x in oov])]).astype(np.int64)
    return owner, np.concatenate([vocab_row.ravel(), oov_row]).astype(np.int64), known.astype(np.int64), list(row_of)


class SeRAGRetriever:
    """Online SeRAG over the stored index: eqs. 10–13 for a batch of queries at once."""

    def __init__(self, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], params: SeRAGParams,
                 embedder: EmbedderParams, recogniser: QueryRecogniser | None, self_query: SelfQuery) -> None:
        self.params, self.scoring, self.embedder = params, params.scoring(), embedder
        self.recogniser, self.self_query = recogniser, self_query
        self.doc_ids = Store.read(data["documents"], ["doc_id"])["doc_id"].to_numpy(dtype=object)
        self.chunk_doc, _ = chunk_frame(index["chunks"], self.doc_ids.tolist())
        ids, self.chunk_emb = load_embeddings(index["chunk_embeddings"],
                                              "doc_id" if params.chunk_unit == "passage" else "chunk_id")
        if len(ids) != len(self.chunk_doc):
            raise RuntimeError("chunk embeddings are not aligned with the chunks table; delete the artifacts")
        _, self.comm_emb = load_embeddings(index["community_embeddings"], "community")
        # beyond the paper: passages of one source document share its best eq. 13 bonus (None: no document holds two)
        self.bonus_groups = (se.bonus_groups(self.chunk_doc, stored_source_documents(data["documents"]).to_numpy())
                             if params.bonus_scope == "document" else None)
        self.community = Store.read(index["community"])["community"].to_numpy(np.int64)
        vocab = Store.read(index["entities"])
        self.m = len(vocab)
        self.vocab_index = dict(zip(vocab["entity"], vocab["entity_idx"]))
        self.entity_names = vocab["entity"].to_numpy(dtype=object)
        # 0 (the paper): e_q from the question's NER only; > 0: also vocabulary n-grams (beyond the paper)
        self.max_words = int(min(params.query_ngram_max_words, vocab["n_words"].to_numpy().max(initial=1)))
        self.entity_emb = (load_embeddings(index["entity_embeddings"], "entity_id")[1]
                           if params.entity_sim == "embedding" else None)
        self.chunk_entity = coo_matrix(Store.read(index["chunk_entity"]), (len(self.chunk_doc), self.m))
        self.entity_chunk_log = log1p_transposed(self.chunk_entity)  # eq. 13's log counts, made once
        if params.query_linking == "gazetteer":  # beyond the paper: the names the question contains
            self.gazetteer = Gazetteer.of(self.entity_names, params.gazetteer_min_chars, aliases_of(vocab))
            self.idf = name_idf(coo_matrix(Store.read(index["doc_entity"]), (len(self.doc_ids), self.m)))
            if params.cover_named_min_seed > 0:
                self.titles = TitleIndex.read(data["documents"], self.doc_ids, self.gazetteer, qualified=True)
        self.tree_meta = Store.read(index["tree_meta"]).iloc[0].to_dict()
        self.graph_meta = Store.read(index["W_meta"]).iloc[0].to_dict()
        encode_queries(["warm-up"], embedder)

    def query_entity_sim(self, questions: list[str], named: sp.csr_array | None = None):
        """(q × m) sim(e, e_q) of eq. 12. e_q: the question's NER names plus the vocabulary entities its
        n-grams match (the corpus's normalisation). ``entity_sim=embedding``: cosine of the names'
        embeddings (gated at τ later); ``exact``: a contained vocabulary entity has sim = 1, others 0.
        ``query_linking: gazetteer`` (beyond the paper): the names the gazetteer finds have sim 1, times
        ``query_lowercase_weight`` when written all in lower case, with spaCy's kept when ``query_ner``.

        A vocabulary entity (matched by an n-gram, or a NER name in the vocabulary) uses its stored
        embedding; only the batch's distinct out-of-vocabulary NER names are encoded, in one call.
        ``named``: :meth:`named_entities` of the questions, when the caller has them already."""
        if self.params.query_linking == "gazetteer":
            named = self.named_entities(questions) if named is None else named
            if not self.params.query_ner:
                return named
            return sp.csr_array(named.maximum(sp.csr_array(self._paper_sim(questions))))
        return self._paper_sim(questions)

    def named_entities(self, questions: list[str]) -> sp.csr_array:
        """(q × m) the gazetteer's names in each question: 1, or ``query_lowercase_weight`` if all lower case."""
        return query_seeds(questions, self.gazetteer, np.ones(self.m), self.params.query_lowercase_weight)

    def _paper_sim(self, questions: list[str]):
        """Eq. 12's sim(e, e_q) from the question's NER names and vocabulary n-grams (the paper's linking)."""
        ner_names = self.recogniser.names(questions)
        links = query_entity_links(questions, self.vocab_index, self.max_words, ner_names)
        if self.entity_emb is None:
            return links_matrix(links, self.m)
        oov = [[n for n in names if n not in self.vocab_index] for names in ner_names]
        owner, name_row, known, unknown = query_entity_pairs(links, oov)
        name_emb = self.entity_emb[known]
        if unknown:
            name_emb = np.vstack([name_emb, encode_queries(unknown, self.embedder)])
        return se.query_entity_similarity(name_emb, owner, self.entity_emb, len(questions), self.scoring.tau,
                                          name_row=name_row)

    def search(self, questions: list[str], k: int) -> Hits:
        """Top-k passages by their best chunk's S(q, v) (eq. 10), candidates of the top k_coarse communities first."""
        t = [time.perf_counter()]
        texts = self.self_query(questions)
        t.append(time.perf_counter())
        pending = encode_queries_beside(texts, self.embedder)  # encoded while spaCy reads the questions
        cover = self.params.cover_named_min_seed > 0  # beyond the paper: each named entity's passage first
        named = self.named_entities(questions) if cover else None
        sim = self.query_entity_sim(questions, named)
        q_emb = pending.result()
        t.append(time.perf_counter())
        bonus = se.entity_bonus(sim, self.chunk_entity, self.scoring.tau, self.entity_chunk_log,
                                self.scoring.bonus_norm)
        if self.bonus_groups is not None:
            bonus = se.document_bonus(bonus, *self.bonus_groups)
        scores, candidates = se.hybrid_scores(q_emb, self.chunk_emb, self.comm_emb, self.community, bonus,
                                              self.scoring)
        n_docs = len(self.doc_ids)
        if cover:  # passages scored by minus their best chunk's rank; the names weigh their IDF (as seeds)
            order = se.rank_chunks(scores, candidates)
            rank = se.best_chunk_rank(order, self.chunk_doc, n_docs).astype(np.float64)
            lifted = self.titles.cover(-rank, named.multiply(self.idf[None, :]), questions,
                                       self.params.cover_named_min_seed)
            docs = np.argsort(-lifted, axis=1, kind="stable")[:, :min(k, n_docs)]
        else:
            docs = se.top_documents(scores, candidates, self.chunk_doc, n_docs, k)  # = the chunk order's passages
        t.append(time.perf_counter())
        # a passage's score: its best chunk's S
        best = se.segment_reduce(scores, self.chunk_doc, len(self.doc_ids), np.maximum, -np.inf)
        parts = dict(zip(["self_query", "query_encoding", "scoring"], np.diff(t)))
        return Hits(docs, np.take_along_axis(best, docs, axis=1), parts)

    def run_stats(self) -> dict:
        """Index facts worth reporting with the metrics."""
        keep = ("n_communities", "entropy_1d", "entropy_2d", "singletons", "size_max", "size_median",
                "size_quantiles", "seconds")
        return {"self_query": self.self_query.enabled, "entity_sim": self.params.entity_sim,
                "bonus_scope": "document" if self.bonus_groups is not None else "passage",
                "self_query_note": None if self.self_query.enabled else
                "ran WITHOUT self-query (no LLM configured or method.self_query=false)",
                "self_query_ledger": self.self_query.client.ledger_summary(SELF_QUERY_STAGE)
                if self.self_query.enabled else None,
                "n_chunks": len(self.chunk_doc),
                "graph": {k: (v if isinstance(v, str) else float(v) if isinstance(v, (float, np.floating))
                              else int(v)) for k, v in self.graph_meta.items()},
                "tree": {k: (v if isinstance(v, str) else float(v)) for k, v in self.tree_meta.items() if k in keep}}
