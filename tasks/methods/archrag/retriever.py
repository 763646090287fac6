"""ArchRAG online side: encode → hierarchical search on C-HNSW (§3.2.1, Alg. 2) → passages for recall@k,
and the retrieved entities / relations / community reports that adaptive filtering (§3.2.2) reads.

Passage ranking is the HARNESS's rule, not the paper's (ArchRAG retrieves entities and communities, never
passages): a passage scores the sum, over the retrieved items that involve an entity it mentions, of the
item's similarity to the query (clipped at 0), where a retrieved community spreads its similarity evenly
over its member entities. Passages that involve no retrieved item are not returned.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from tasks.core.store import ArtifactRef, Store
from tasks.eval.retrieve import Hits
from tasks.methods.archrag import algorithm as alg
from tasks.methods.archrag.chnsw import CHNSW
from tasks.methods.archrag.stages import ArchParams
from tasks.text.embed import EmbedderParams, encode_queries


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
        self.doc_spread = passage_spread(spread_matrices(Store.read(index["parents"]), len(self.entities)),
                                         entity_documents(self.entities, chunks, self.doc_ids))
        self.meta = Store.read(index["hierarchy_meta"]).iloc[0].to_dict()
        self.layers = [0] if params.entity_only else list(range(len(self.index.sizes)))
        encode_queries(["warm-up"], embedder)  # load the model outside the timed path

    def search(self, questions: list[str], k: int) -> Hits:
        t0 = time.perf_counter()
        q = encode_queries(questions, self.embedder)
        t1 = time.perf_counter()
        ks = [self.params.k_of_layer(l) for l in range(len(self.index.sizes))]
        found = self.index.search(q, ks, layers=self.layers)
        t2 = time.perf_counter()
        doc_idx, scores = rank_passages(found, self.doc_spread, k)
        t3 = time.perf_counter()
        trace = [{"retrieved": [ids[i][ids[i] >= 0].tolist() for ids, _ in found],
                  "similarity": [np.round(s[i][ids[i] >= 0], 4).tolist() for ids, s in found]}
                 for i in range(len(questions))]
        return Hits(doc_idx, scores, {"encode": t1 - t0, "search": t2 - t1, "rank": t3 - t2}, trace)

    def run_stats(self) -> dict:
        """What the metrics record about this index: which KG builder and summariser made it, and its layers."""
        return {"kg_builder": self.meta["kg_builder"], "summariser": self.meta["summariser"],
                "layers": int(self.meta["layers"]), "layer_sizes": list(self.index.sizes),
                "layers_searched": self.layers, "k_per_layer": [self.params.k_of_layer(l) for l in self.layers],
                "hierarchy": json.loads(self.meta["per_layer"]), "stop_reason": self.meta["stop_reason"],
                "passage_rule": "harness: passages by the query similarity of retrieved entities / communities "
                                "whose entities they mention (not the paper's)"}

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
        chosen = np.asarray(ids, dtype=np.int64)
        head, tail = self.relations["head"].to_numpy(), self.relations["tail"].to_numpy()
        hit_h, hit_t = np.isin(head, chosen), np.isin(tail, chosen)
        mask = hit_h & hit_t if self.params.relation_scope == "among" else hit_h | hit_t
        rel = self.relations[mask].sort_values("weight", ascending=False, kind="stable").head(self.params.max_relations)
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


def answer(client, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg, questions: pd.DataFrame,
           traces: pd.DataFrame, dry_run: bool) -> tuple[pd.DataFrame | None, dict]:
    """Adaptive filtering-based generation (eqs. 3–4; ``generation=direct``: Table 4's Direct Prompt) over what
    each question retrieved. Scores: EM / F1 / contain-acc of the extracted answer, and the paper's accuracy
    and recall of the raw output. ``dry_run``: the estimate only, nothing sent."""
    from tasks.eval.answer_metrics import aggregate, paper_metrics
    from tasks.methods.archrag.filtering import filter_estimate, generate_answers

    retriever = ArchRetriever(data, index, cfg.method, cfg.embedder)
    layers = retrieved_layers(retriever, questions, traces)
    params = filter_params(cfg.method)
    texts = questions["question"].tolist()
    if dry_run:
        return None, {"llm_dry_run": filter_estimate(client, texts, layers, params)}
    gen = generate_answers(client, texts, layers, params)
    answers = questions["answers"].map(list).tolist()
    scores = {**aggregate(gen.answers, answers), **paper_metrics(gen.raw, answers)}
    table = pd.DataFrame({"qid": questions["qid"], "prediction": gen.answers, "raw": gen.raw})
    return table, {**scores, "generation": cfg.method.generation, **{f"gen_{k}": v for k, v in gen.stats.items()}}
