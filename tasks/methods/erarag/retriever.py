"""erarag online side: the retriever that answers questions over the stored index."""
from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np
import pandas as pd

from tasks.core.store import ArtifactRef, Store
from tasks.core.vectors import arrow_to_embeddings
from tasks.eval.metrics import recall_at_k
from tasks.eval.retrieve import Hits
from tasks.methods.erarag import algorithm as erarag
from tasks.methods.erarag.params import VIEWS, EraParams
from tasks.methods.erarag.stages import read_meta
from tasks.text.embed import EmbedderParams, encode_queries

# ---------------------------------------------------------------- online retrieval (Alg. 2)


class EraRetriever:
    """Online EraRAG: encode → Alg. 2 selection (collapsed or biased, top-k under the token budget) for
    the reader's context, and a document ranking that follows the collapsed ranking as deep as needed.

    Documents: a leaf gives its document; a summary gives nothing (``leaves`` view) or the documents
    of its descendant leaves, nearest to the query first (``expanded`` view). Both views are ranked
    for every query; ``recall_view`` picks the one returned, ``run_stats`` scores both.
    """

    def __init__(self, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], params: EraParams,
                 embedder: EmbedderParams, ks: tuple[int, ...]) -> None:
        self.params = params
        self.embedder, self.ks = embedder, tuple(ks)
        t = Store.read_arrow(index["nodes"])
        self.emb = np.ascontiguousarray(arrow_to_embeddings(t.column("emb")))
        nodes = t.drop_columns(["emb"]).to_pandas()
        self.node_ids = nodes["node_id"].to_numpy(dtype=object)
        self.layer = nodes["layer"].to_numpy()
        self.texts = nodes["text"].tolist()
        self.tokens = erarag.whitespace_tokens(self.texts)
        self.meta = read_meta(index["meta"])
        self.doc_ids = Store.read(data["documents"], ["doc_id"])["doc_id"].to_numpy(dtype=object)
        doc_pos = pd.Series(np.arange(len(self.doc_ids)), index=pd.Index(self.doc_ids))
        self.leaf_doc = np.full(len(nodes), -1, dtype=np.int64)
        leaf = self.layer == 0
        self.leaf_doc[leaf] = doc_pos.reindex(nodes.loc[leaf, "doc_id"]).fillna(-1).to_numpy(dtype=np.int64)
        self._descendants(nodes)
        q = Store.read(data["questions"], ["qid", "question"])
        self.qids_of: dict[str, list[str]] = q.groupby("question", sort=False)["qid"].agg(list).to_dict()
        self.gold = Store.read(data["gold"])
        self.seen: dict[str, list[tuple[str, list[int]]]] = {v: [] for v in VIEWS}
        self.depth: list[int] = []
        self.context_summaries: list[float] = []
        encode_queries(["warm-up"], self.embedder)

    def _descendants(self, nodes: pd.DataFrame) -> None:
        """CSR map: summary row → its descendant leaf rows (all layers below)."""
        row_of = pd.Series(np.arange(len(nodes)), index=pd.Index(nodes["node_id"]))
        parent = row_of.reindex(nodes["parent_id"]).fillna(-1).to_numpy(dtype=np.int64)
        leaves = np.flatnonzero(self.layer == 0)
        pairs_leaf, pairs_anc, cur = [], [], parent[leaves]
        live = cur >= 0
        while live.any():
            pairs_leaf.append(leaves[live]), pairs_anc.append(cur[live])
            cur = np.where(live, parent[np.maximum(cur, 0)], -1)
            live = cur >= 0
        anc = np.concatenate(pairs_anc) if pairs_anc else np.empty(0, np.int64)
        lf = np.concatenate(pairs_leaf) if pairs_leaf else np.empty(0, np.int64)
        order = np.argsort(anc, kind="stable")
        self.desc_leaf = lf[order]
        self.desc_ptr = np.searchsorted(anc[order], np.arange(len(nodes) + 1))

    def _rank(self, qv: np.ndarray, seq: np.ndarray, scores: np.ndarray, k: int) -> dict[str, tuple[list, list]]:
        """Documents (row indices into doc_ids) and scores of one query for both views, first ``k``."""
        out = {}
        for view in VIEWS:
            docs: dict[int, float] = {}
            for node, s in zip(seq.tolist(), scores.tolist()):
                if len(docs) >= k:
                    break
                if self.layer[node] == 0:
                    d = self.leaf_doc[node]
                    if d >= 0:
                        docs.setdefault(int(d), s)
                elif view == "expanded":
                    leaves = self.desc_leaf[self.desc_ptr[node]:self.desc_ptr[node + 1]]
                    for lf in leaves[np.argsort(-(self.emb[leaves] @ qv), kind="stable")]:
                        if self.leaf_doc[lf] >= 0:
                            docs.setdefault(int(self.leaf_doc[lf]), s)
            out[view] = (list(docs)[:k], list(docs.values())[:k])
        return out

    def search(self, questions: list[str], k: int) -> Hits:
        """Alg. 2 context per query, and the document ranking of ``recall_view`` (at least k where possible)."""
        t = [time.perf_counter()]
        q = encode_queries(questions, self.embedder)
        t.append(time.perf_counter())
        sel = erarag.search(q, self.emb, self.tokens, self.layer, self.params)
        n = len(self.node_ids)
        m = min(n, max(4 * k, self.params.top_k))
        ranked: list[Optional[dict]] = [None] * len(questions)
        todo = np.arange(len(questions))
        while len(todo):
            scores, idx = erarag.flat_topk(q[todo], self.emb, m)  # the stored array; no index copy of it
            again = []
            for row, i in enumerate(todo):
                first = sel.indices[i][sel.indices[i] >= 0]
                deep = (idx[row] >= 0) & ~np.isin(idx[row], first)
                seq = np.concatenate([first, idx[row][deep]])
                sc = np.concatenate([sel.scores[i][sel.indices[i] >= 0], scores[row][deep]])
                r = self._rank(q[i], seq, sc, k)
                if m < n and min(len(r[v][0]) for v in VIEWS) < k:
                    again.append(i)
                else:
                    ranked[i] = r
                    self.depth.append(m)
            todo = np.array(again, dtype=np.int64)
            m = min(n, 4 * m)
        t.append(time.perf_counter())
        doc_idx = np.full((len(questions), k), -1, dtype=np.int64)
        doc_scores = np.full((len(questions), k), -np.inf, dtype=np.float32)
        trace = []
        for i, (question, r) in enumerate(zip(questions, ranked)):
            docs, sc = r[self.params.recall_view]
            doc_idx[i, :len(docs)], doc_scores[i, :len(docs)] = docs, sc
            for view in VIEWS:
                self.seen[view].append((question, r[view][0]))
            chosen = sel.indices[i][sel.indices[i] >= 0]
            self.context_summaries.append(float((self.layer[chosen] > 0).mean()) if len(chosen) else 0.0)
            trace.append({"nodes": [str(x) for x in self.node_ids[chosen]],
                          "node_layers": [int(x) for x in self.layer[chosen]],
                          "node_scores": [float(x) for x in sel.scores[i][sel.indices[i] >= 0]],
                          "kept_chunks": [self.texts[c] for c in chosen],
                          "context_docs": [self.node_docs(c) for c in chosen]})
        t.append(time.perf_counter())
        return Hits(doc_idx, doc_scores, dict(zip(["query_encoding", "search", "ranking"], np.diff(t))), trace)

    def node_docs(self, node: int) -> list[str]:
        """The passages a node's text stands for: a leaf's own, or every passage under a summary."""
        leaves = [node] if self.layer[node] == 0 else self.desc_leaf[self.desc_ptr[node]:self.desc_ptr[node + 1]]
        return [str(self.doc_ids[d]) for d in dict.fromkeys(int(self.leaf_doc[lf]) for lf in leaves) if d >= 0]

    def view_recall(self, view: str) -> dict[str, float]:
        """recall@k of one view over the questions searched so far (the same scorer as evaluate)."""
        rows, qids = [], []
        for question, docs in self.seen[view]:
            for qid in self.qids_of.get(question, []):
                qids.append(qid)
                rows.extend((qid, r + 1, self.doc_ids[d]) for r, d in enumerate(docs))
        hits = pd.DataFrame(rows, columns=["qid", "rank", "doc_id"])
        return recall_at_k(hits, self.gold, list(self.ks), list(dict.fromkeys(qids)))

    def run_stats(self) -> dict:
        """Index facts and both recall views, reported with the metrics."""
        per_layer = np.bincount(self.layer).tolist()
        out: dict[str, Any] = {"recall_view": self.params.recall_view, "summariser": self.meta["summariser"],
                               "search": "biased" if self.params.biased else "collapsed",
                               "nodes_per_layer": per_layer, "hierarchy_mode": self.meta["mode"],
                               "mean_search_depth": round(float(np.mean(self.depth)), 1) if self.depth else 0.0,
                               "context_summary_share": round(float(np.mean(self.context_summaries)), 3)
                               if self.context_summaries else 0.0}
        if self.gold is not None and len(self.gold):
            for view in VIEWS:
                out.update({f"recall_{view}@{k.split('@')[1]}": v for k, v in self.view_recall(view).items()})
        return out
