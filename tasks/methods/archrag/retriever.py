"""ArchRAG online side: encode → hierarchical search on C-HNSW (§3.2.1, Alg. 2) → passages for recall@k,
and the retrieved entities / relations / community reports that adaptive filtering (§3.2.2) reads.

Passage ranking is the HARNESS's rule, not the paper's (ArchRAG retrieves entities and communities, never
passages), ``method.passage_rule``:

- ``entity_rank`` (default; its principle fixed before it was measured): the passages of the retrieved
  entities, in the order of their rank. A passage ranks at the best-ranked retrieved entity it mentions; passages
  of one entity by how many retrieved entities they mention, then corpus order. Communities rank no passage.
- ``similarity_sum`` (the earlier rule, kept for comparison): a passage scores the sum, over the retrieved items that involve
  an entity it mentions, of the item's similarity to the query (clipped at 0), where a retrieved community
  spreads its similarity evenly over its member entities.

- ``source_relevance`` (beyond the paper, issue 58): the passages every retrieved item was made from (an entity's
  own; a community's, through its member entities; every searched layer), by the question's cosine to the passage
  (the dense passage index of ``topk_chunk``), a stand-in for adaptive filtering's relevance scores (§3.2.2).
  With ``source_unit=chunk`` (the default, beyond the paper) an item's sources are the passages of the §3.1.1
  chunks its own passages lie in: the KG's ``window_tokens`` windows (``overlap_tokens`` shared) cut from the
  source document, which a passage of a long document is smaller than; a passage no entity is named in is
  then still the source of the entities of its chunk. ``source_unit=passage``, or a KG built from passages or
  sentences (``chunk_unit``): only the passages themselves.
- ``auto`` (the default): ``source_relevance`` where documents are cut into several passages (``dataset.split``),
  ``entity_rank`` where every passage is its own document (the benchmarks).

Passages that involve no retrieved item are not returned. ``method.topk_chunk`` (from the authors' code) adds the
top passages of a dense index after them.

The reader's context (the trace's ``kept_chunks``, what answer_in_context and context_recall read): per layer,
the retrieved items' texts as adaptive filtering reads them (layer 0: entity descriptions, then the relations
among them; above: community reports), then the ``topk_chunk`` passages. ``context_docs``: the passages an item
was made from: an entity's, a relation's (both ends mentioned), a community's member entities', a passage itself.
"""
from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import scipy.sparse as sp

from tasks.core.store import ArtifactRef, Store
from tasks.data.corpus import documents_cut, source_documents
from tasks.eval.retrieve import Hits
from tasks.eval.spans import passage_lineage
from tasks.methods.archrag import algorithm as alg
from tasks.methods.archrag.chnsw import CHNSW
from tasks.methods.archrag.params import ArchParams
from tasks.text.chunk import window_spans
from tasks.text.embed import EmbedderParams, encode_queries, load_embeddings


def entity_documents(entities: pd.DataFrame, chunks: pd.DataFrame, doc_ids: np.ndarray) -> sp.csr_array:
    """entities x documents, 0/1: the entity is mentioned in one of the document's chunks."""
    doc_of_chunk = pd.Series(chunks["doc_id"].to_numpy(), index=chunks["chunk_id"].to_numpy())
    doc_pos = pd.Series(np.arange(len(doc_ids)), index=doc_ids)
    pairs = entities[["entity_id", "chunk_ids"]].explode("chunk_ids").dropna()
    docs = doc_pos.reindex(doc_of_chunk.reindex(pairs["chunk_ids"].to_numpy()).to_numpy()).to_numpy()
    ok = ~np.isnan(docs)
    rows, cols = pairs["entity_id"].to_numpy(np.int64)[ok], docs[ok].astype(np.int64)
    m = sp.csr_array((np.ones(rows.size), (rows, cols)), shape=(len(entities), len(doc_ids)))
    m.data[:] = 1.0  # an entity in two chunks of one document counts once
    return m


def spread_matrices(parents: pd.DataFrame, n_entities: int) -> list[sp.csr_array]:
    """Per layer l >= 1: communities x entities, each row summing to 1 over the community's member entities."""
    h = alg.Hierarchy(parent=[g.sort_values("node")["parent"].to_numpy(np.int64)
                              for _, g in parents.groupby("layer", sort=True)],
                      embeddings=[np.zeros((n_entities, 1))])
    h.embeddings += [np.zeros((int(p.max()) + 1, 1)) for p in h.parent]
    out = [sp.eye_array(n_entities, format="csr")]
    for layer in range(1, h.n_layers):
        m = h.entity_members(layer)
        size = np.asarray(m.sum(axis=1)).ravel()
        out.append(sp.csr_array(sp.diags_array(1.0 / np.maximum(size, 1)) @ m))
    return out


def passage_spread(spread: list[sp.csr_array], entity_docs: sp.csr_array) -> list[sp.csr_array]:
    """Per layer, items x documents: how much of an item's similarity each document receives (spread @ docs),
    computed once at load so a query batch never materialises its entity scores."""
    return [sp.csr_array(s @ entity_docs) for s in spread]


def rank_passages(found: list[tuple[np.ndarray, np.ndarray]], doc_spread: list[sp.csr_array],
                  k: int) -> tuple[np.ndarray, np.ndarray]:
    """The harness's passage rule (module doc), batched: (doc_idx (B, k) with -1 padding, scores)."""
    b, n_docs = found[0][0].shape[0], doc_spread[0].shape[1]
    scores = np.zeros((b, n_docs))
    for layer, (ids, sims) in enumerate(found):
        if ids.size == 0:
            continue
        rows = np.broadcast_to(np.arange(b)[:, None], ids.shape)
        ok = ids >= 0
        item = sp.csr_array((np.clip(sims[ok], 0, None).astype(np.float64), (rows[ok], ids[ok])),
                            shape=(b, doc_spread[layer].shape[0]))
        scores += (item @ doc_spread[layer]).toarray()
    k = min(k, n_docs)
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k else np.zeros((b, 0), np.int64)
    top_scores = np.take_along_axis(scores, top, axis=1)
    order = np.lexsort((top, -top_scores), axis=1)
    top, top_scores = np.take_along_axis(top, order, axis=1), np.take_along_axis(top_scores, order, axis=1)
    top = np.where(top_scores > 0, top, -1)
    return top.astype(np.int64), top_scores


def entity_rank_passages(entity_ids: np.ndarray, entity_sims: np.ndarray, entity_docs: sp.csr_array,
                         k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``entity_rank`` rule (module doc), per query: (doc_idx (B, k) with -1 padding, score = minus the rank of
    the passage's best-ranked entity). Entities rank by their similarity (``entity_ids < 0``: none)."""
    b = entity_ids.shape[0]
    docs_out, scores_out = np.full((b, k), -1, np.int64), np.full((b, k), -np.inf)
    for i in range(b):
        ok = entity_ids[i] >= 0
        ids = entity_ids[i][ok][np.argsort(-entity_sims[i][ok], kind="stable")]
        sub = entity_docs[ids].tocoo()  # rows in rank order
        if sub.nnz == 0:
            continue
        docs, inv = np.unique(sub.col, return_inverse=True)
        best = np.full(docs.size, ids.size, np.int64)
        np.minimum.at(best, inv, sub.row.astype(np.int64))
        count = np.bincount(inv, minlength=docs.size)
        order = np.lexsort((docs, -count, best))[:k]
        docs_out[i, :order.size], scores_out[i, :order.size] = docs[order], -best[order].astype(np.float64)
    return docs_out, scores_out


def source_relevance_passages(found: list[tuple[np.ndarray, np.ndarray]], doc_spread: list[sp.csr_array],
                              passage_sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``source_relevance`` rule (module doc), per query: the passages any retrieved item was made from (an
    entity's own passages; a community's, through its member entities), by the question's cosine to the passage,
    ties in corpus order. ``passage_sims``: (B, n_docs) cosines. Returns (doc_idx (B, k) with -1 padding, cosine,
    how many source passages each query had to rank)."""
    b = passage_sims.shape[0]
    docs_out, scores_out = np.full((b, k), -1, np.int64), np.full((b, k), -np.inf)
    n_sources = np.zeros(b, np.int64)
    for i in range(b):
        sources = [doc_spread[layer][ids[i][ids[i] >= 0]].indices for layer, (ids, _) in enumerate(found)]
        docs = np.unique(np.concatenate(sources)) if sources else np.zeros(0, np.int64)
        order = np.argsort(-passage_sims[i][docs], kind="stable")[:k]
        docs_out[i, :order.size], scores_out[i, :order.size] = docs[order], passage_sims[i][docs[order]]
        n_sources[i] = docs.size
    return docs_out, scores_out, n_sources


def document_text(starts: np.ndarray, ends: np.ndarray, texts: list[str]) -> str:
    """A source document put back together from its passages (their spans in it; overlaps agree, a gap between
    two passages is blank)."""
    parts: list[str] = []
    length = 0
    for start, end, text in sorted(zip(starts.tolist(), ends.tolist(), texts), key=lambda t: t[0]):
        if end > length:
            parts += [" " * max(start - length, 0), text[max(length - start, 0):]]
            length = max(start, length) + len(parts[-1])
    return "".join(parts)


def chunk_neighbours(lineage: pd.DataFrame, texts: list[str], window_tokens: int, overlap_tokens: int
                     ) -> sp.csr_array:
    """passages x passages, 0/1: the two passages lie in one §3.1.1 chunk, a window of ``window_tokens``
    whitespace tokens (``overlap_tokens`` shared with the next) of their source document, the unit the paper
    builds its KG from (GraphRAG's 600-token windows in the authors' code). ``lineage``: ``document``,
    ``char_start``, ``char_end`` per passage, in the order of ``texts``. A passage meets itself; a document that is
    one passage (the benchmarks) meets only itself."""
    n = len(lineage)
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    window = 0
    starts, ends = lineage["char_start"].to_numpy(np.int64), lineage["char_end"].to_numpy(np.int64)
    for idx in lineage.groupby("document", sort=False).indices.values():
        text = document_text(starts[idx], ends[idx], [texts[i] for i in idx]) if idx.size > 1 else ""
        spans = window_spans(text, window_tokens, overlap_tokens) if idx.size > 1 else []
        for inside in [idx[(starts[idx] < b) & (ends[idx] > a)] for a, b in spans] or [idx]:
            rows.append(np.full(inside.size, window))
            cols.append(inside)
            window += 1
    r, c = np.concatenate(rows), np.concatenate(cols)
    member = sp.csr_array((np.ones(r.size), (r, c)), shape=(window, n))
    out = sp.csr_array(member.T @ member)
    out.data[:] = 1.0
    return out


def resolve_rule(rule: str, documents: pd.DataFrame) -> str:
    """``passage_rule=auto`` (beyond the paper): ``source_relevance`` on a corpus of documents cut into several
    passages, ``entity_rank`` on a corpus whose passages are their own documents (the benchmarks)."""
    if rule != "auto":
        return rule
    return "source_relevance" if documents_cut(source_documents(documents)) else "entity_rank"


def append_passages(doc_idx: np.ndarray, scores: np.ndarray, extra: np.ndarray, k: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``extra`` passages (B, c), in order, after each row's own (not repeated), cut at k; their score is below
    every own score."""
    out, out_s = np.full((doc_idx.shape[0], k), -1, np.int64), np.full((doc_idx.shape[0], k), -np.inf)
    for i in range(doc_idx.shape[0]):
        own = [int(d) for d in doc_idx[i] if d >= 0]
        seen = set(own)
        added = [int(d) for d in extra[i] if d >= 0 and d not in seen][:max(k - len(own), 0)]
        row = own + added
        out[i, :len(row)] = row
        floor = min(scores[i][:len(own)], default=0.0)
        out_s[i, :len(row)] = list(scores[i][:len(own)]) + [floor - 1 - j for j in range(len(added))]
    return out, out_s


class ArchRetriever:
    """Online ArchRAG over the stored index, a batch of questions at a time."""

    def __init__(self, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], params: ArchParams,
                 embedder: EmbedderParams) -> None:
        self.params, self.embedder = params, embedder
        self.doc_ids = Store.read(data["documents"], ["doc_id"])["doc_id"].to_numpy(dtype=object)
        self.entities = Store.read(index["entities"]).sort_values("entity_id").reset_index(drop=True)
        self.relations = Store.read(index["relations"])
        self.communities = Store.read(index["communities"])
        self.index = CHNSW.from_bytes(Store.read_bytes(index["chnsw"]))
        chunks = Store.read(index["chunks"], ["chunk_id", "doc_id"])
        self.entity_docs = entity_documents(self.entities, chunks, self.doc_ids)
        spread = spread_matrices(Store.read(index["parents"]), len(self.entities))
        self.doc_spread = passage_spread(spread, self.entity_docs)
        self.reports = {layer: g.sort_values("community")["report"].astype(str).to_numpy(dtype=object)
                        for layer, g in self.communities.groupby("layer")}
        docs = Store.read(data["documents"])
        self.passage_texts = (docs["title"] + ": " + docs["text"]).to_numpy(dtype=object)  # as contexts_for renders
        self.rule = resolve_rule(params.passage_rule, docs)
        self.source_spread = self.doc_spread  # source_relevance's sources per item (source_unit=passage)
        if self.rule == "source_relevance" and params.source_unit == "chunk" and params.chunk_unit == "window":
            # beyond the paper (module doc); a KG built from passages or sentences has chunks no longer than a passage
            near = chunk_neighbours(passage_lineage(docs), docs["text"].astype(str).tolist(), params.window_tokens,
                                    params.overlap_tokens)
            chunk_docs = sp.csr_array(self.entity_docs @ near)
            chunk_docs.data[:] = 1.0
            self.source_spread = passage_spread(spread, chunk_docs)
        if self.rule == "source_relevance" and "passage_embeddings" not in index:
            raise ValueError("method.passage_rule=source_relevance ranks passages by the dense index of the passages, "
                             "which this index lacks: rebuild it with this rule (the flow embeds the passages then)")
        self.passage_emb = (load_embeddings(index["passage_embeddings"], "doc_id")[1] if "passage_embeddings" in index
                            else None)
        self.meta = Store.read(index["hierarchy_meta"]).iloc[0].to_dict()
        self.layers = [0] if params.entity_only else list(range(len(self.index.sizes)))
        self.source_counts: list[int] = []  # source_relevance: passages each question's retrieved items came from
        encode_queries(["warm-up"], embedder)  # load the model outside the timed path

    def search(self, questions: list[str], k: int) -> Hits:
        t0 = time.perf_counter()
        q = encode_queries(questions, self.embedder)
        t1 = time.perf_counter()
        ks = [self.params.k_of_layer(l) for l in range(len(self.index.sizes))]
        found = self.index.search(q, ks, layers=self.layers)
        t2 = time.perf_counter()
        if self.rule == "source_relevance":
            doc_idx, scores, n_sources = source_relevance_passages(found, self.source_spread, q @ self.passage_emb.T, k)
            self.source_counts += n_sources.tolist()
        elif self.rule == "entity_rank":
            doc_idx, scores = entity_rank_passages(found[0][0], found[0][1], self.entity_docs, k)
        else:
            doc_idx, scores = rank_passages(found, self.doc_spread, k)
        chunks = np.zeros((len(questions), 0), np.int64)
        if self.params.topk_chunk:  # the authors' code: a separate dense index's passages
            top = min(self.params.topk_chunk, len(self.doc_ids))
            chunks = np.argsort(-(q @ self.passage_emb.T), axis=1, kind="stable")[:, :top]
            doc_idx, scores = append_passages(doc_idx, scores, chunks, k)
        t3 = time.perf_counter()
        trace = []
        for i in range(len(questions)):
            retrieved = [ids[i][ids[i] >= 0].tolist() for ids, _ in found]
            texts, docs = self.context(retrieved, chunks[i].tolist())
            trace.append({"retrieved": retrieved, "similarity": [np.round(s[i][ids[i] >= 0], 4).tolist()
                                                                 for ids, s in found],
                          "kept_chunks": texts, "context_docs": docs})
        t4 = time.perf_counter()
        return Hits(doc_idx, scores, {"encode": t1 - t0, "search": t2 - t1, "rank": t3 - t2, "context": t4 - t3},
                    trace)

    def context(self, retrieved: list[list[int]], chunks: list[int]) -> tuple[list[str], list[list[str]]]:
        """The reader's context items (module doc) and, for each, the passages it was made from."""
        texts: list[str] = []
        docs: list[list[str]] = []
        for layer, ids in enumerate(retrieved):
            if layer == 0:
                ent = self.entities.iloc[ids]
                texts += [f"{n}: {d}" if d else n for n, d in zip(ent["name"], ent["description"])]
                docs += [self._docs(self.entity_docs, [e]) for e in ids]
                rel = self.relation_rows(ids)
                texts += self.relation_lines(rel)
                docs += [self._docs(self.entity_docs, [h, t], both=True) for h, t in zip(rel["head"], rel["tail"])]
            else:
                texts += self.reports[layer][ids].tolist() if ids else []
                docs += [self._docs(self.doc_spread[layer], [c]) for c in ids]
        texts += self.passage_texts[chunks].tolist() if chunks else []
        docs += [[str(self.doc_ids[c])] for c in chunks]
        return texts, docs

    def _docs(self, matrix: sp.csr_array, rows: list[int], both: bool = False) -> list[str]:
        """Passage ids of the union (``both``: intersection) of ``matrix``'s rows' non-zero columns."""
        sets = [set(matrix.indices[matrix.indptr[r]:matrix.indptr[r + 1]].tolist()) for r in rows]
        found = set.intersection(*sets) if both else set().union(*sets)
        return [str(self.doc_ids[d]) for d in sorted(found)]

    def run_stats(self) -> dict:
        """What the metrics record about this index: which KG builder and summariser made it, and its layers."""
        return {"kg_builder": self.meta["kg_builder"], "summariser": self.meta["summariser"],
                "layers": int(self.meta["layers"]), "layer_sizes": list(self.index.sizes),
                "layers_searched": self.layers, "k_per_layer": [self.params.k_of_layer(l) for l in self.layers],
                "hierarchy": json.loads(self.meta["per_layer"]), "stop_reason": self.meta["stop_reason"],
                "passage_rule": f"harness (not the paper's): {self.params.passage_rule}"
                                + (f" -> {self.rule}" if self.rule != self.params.passage_rule else ""),
                "topk_chunk": self.params.topk_chunk,
                **({"source_unit": self.params.source_unit} if self.rule == "source_relevance" else {}),
                **({"source_passages_median": float(np.median(self.source_counts)),
                    "source_passages_share": round(float(np.mean(self.source_counts)) / len(self.doc_ids), 4)}
                   if self.source_counts else {})}

    # ------------------------------------------------------------ the text adaptive filtering reads

    def layer_texts(self, retrieved: list[list[int]]) -> list[list[str]]:
        """Per layer, the retrieved items' texts in rank order (layer 0: entities, then their relations)."""
        out: list[list[str]] = []
        for layer, ids in enumerate(retrieved):
            if layer == 0:
                ent = self.entities.iloc[ids]
                texts = [f"{n}: {d}" if d else n for n, d in zip(ent["name"], ent["description"])]
                out.append(texts + self.relation_texts(ids))
            else:
                comm = self.communities[self.communities["layer"] == layer].set_index("community")
                out.append(comm.loc[ids, "report"].astype(str).tolist() if ids else [])
        return out

    def relation_texts(self, ids: list[int]) -> list[str]:
        """§3.2.1: the relations among the retrieved entities (``incident``: touching one), heaviest first."""
        return self.relation_lines(self.relation_rows(ids))

    def relation_rows(self, ids: list[int]) -> pd.DataFrame:
        """The relations :meth:`relation_texts` gives, as rows (head, tail, description, weight)."""
        chosen = np.asarray(ids, dtype=np.int64)
        head, tail = self.relations["head"].to_numpy(), self.relations["tail"].to_numpy()
        hit_h, hit_t = np.isin(head, chosen), np.isin(tail, chosen)
        mask = hit_h & hit_t if self.params.relation_scope == "among" else hit_h | hit_t
        return self.relations[mask].sort_values("weight", ascending=False, kind="stable").head(self.params.max_relations)

    def relation_lines(self, rel: pd.DataFrame) -> list[str]:
        """A relation as text: ``head -- tail: description``."""
        names = self.entities["name"].to_numpy(dtype=object)
        return [f"{names[h]} -- {names[t]}: {d}" if d else f"{names[h]} -- {names[t]}"
                for h, t, d in zip(rel["head"], rel["tail"], rel["description"])]


# ---------------------------------------------------------------- §3.2.2 generation (the evaluate hook)


def filter_params(params: ArchParams):
    """The generation knobs of ``method=archrag`` as :class:`FilterParams`."""
    from tasks.methods.archrag.filtering import FilterParams

    return FilterParams(filter_budget_tokens=params.filter_budget_tokens,
                        merge_budget_tokens=params.merge_budget_tokens, filter_max_tokens=params.filter_max_tokens,
                        answer_max_tokens=params.answer_max_tokens, mode=params.generation)


def retrieved_layers(retriever: ArchRetriever, questions: pd.DataFrame, traces: pd.DataFrame) -> list[list[list[str]]]:
    """Per question (in ``questions`` order), the texts of what it retrieved on each layer."""
    by_qid = dict(zip(traces["qid"], traces["retrieved"]))
    out = []
    for qid in questions["qid"]:
        ids = by_qid[qid]
        out.append(retriever.layer_texts(json.loads(ids) if isinstance(ids, str) else list(ids)))
    return out


def answer(client, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], params: ArchParams,
           embedder: EmbedderParams, questions: pd.DataFrame, traces: pd.DataFrame, dry_run: bool
           ) -> tuple[pd.DataFrame | None, dict]:
    """Adaptive filtering-based generation (eqs. 3–4; ``generation=direct``: Table 4's Direct Prompt) over what
    each question retrieved: ``(qid, prediction, raw)`` and the generation's own figures (scored by the caller,
    :func:`tasks.eval.answer_metrics.score_predictions`). ``dry_run``: the estimate only, nothing sent."""
    from tasks.methods.archrag.filtering import filter_estimate, generate_answers

    retriever = ArchRetriever(data, index, params, embedder)
    layers = retrieved_layers(retriever, questions, traces)
    generation = filter_params(params)
    texts = questions["question"].tolist()
    if dry_run:
        return None, {"llm_dry_run": filter_estimate(client, texts, layers, generation)}
    gen = generate_answers(client, texts, layers, generation)
    table = pd.DataFrame({"qid": questions["qid"], "prediction": gen.answers, "raw": gen.raw})
    return table, {"generation": params.generation, **{f"gen_{k}": v for k, v in gen.stats.items()}}
