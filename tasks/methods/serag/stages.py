"""SeRAG index stages: multi-perspective graph (§3.1), 2-D encoding tree (eq. 1, K = 2), community
vectors (§3.2). The equations live in :mod:`tasks.methods.serag.algorithm`; this module stores them.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core.stage import RunContext, input_fps, run_stage, stage, stored_versions
from tasks.core.store import ArtifactRef, Store
from tasks.graph.encoding_tree import encoding_tree
from tasks.graph.sparse import coo_matrix, to_coo
from tasks.data.corpus import source_documents
from tasks.methods.serag import algorithm as se
from tasks.text.embed import embeddings_to_arrow, load_embeddings
from tasks.methods.serag.params import CommunitiesParams, SeRAGGraphParams, TreeParams

log = logging.getLogger("dagrag.serag")


def _emb_id(params: "SeRAGGraphParams | CommunitiesParams") -> str:
    """Id column of the chunk embeddings: whole-passage chunks reuse the passage embeddings (title + text)."""
    return "doc_id" if params.chunk_unit == "passage" else "chunk_id"


def chunk_frame(chunks: ArtifactRef, doc_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(document index, position in document) of every chunk, in chunk-table order."""
    ch = Store.read(chunks, ["doc_id", "position"])
    doc_pos = pd.Series(np.arange(len(doc_ids)), index=pd.Index(doc_ids))
    return doc_pos.loc[ch["doc_id"]].to_numpy(np.int64), ch["position"].to_numpy(np.int64)


def distance_frame(documents: ArtifactRef, chunks: ArtifactRef, doc_ids: list[str], scope: str
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(document, position) of every chunk for eq. 5's distance layer, in chunk-table order.

    ``scope`` ``document`` (§3.1, eq. 5: chunks of the same document, by their distance in it): a passage cut from a
    longer document (the lineage columns ``document`` and ``char_start``) belongs to that source document, and
    its chunks are numbered in reading order (passage start, then the chunk's position in the passage); a passage
    without a source document, as every benchmark passage, is its own document, exactly as with ``passage``.
    ``passage``: :func:`chunk_frame` (every passage its own document)."""
    doc, pos = chunk_frame(chunks, doc_ids)
    names = set(pq.read_schema(documents.path).names)  # the footer alone
    if scope == "passage" or not {"document", "char_start"} <= names:
        return doc, pos
    lineage = Store.read(documents, ["doc_id", "document", "char_start"])
    source = source_documents(lineage).to_numpy()
    start = pd.to_numeric(lineage["char_start"], errors="coerce").fillna(0).to_numpy(np.int64)
    return se.source_positions(source, start, doc, pos)


GRAPH = "serag_graph"
TREE = "serag_tree"
LAYERS = ("sem", "log", "dist")


def layers_tables(layers: se.Layers, doc_ids: np.ndarray) -> dict[str, pd.DataFrame]:
    """What an update starts from: each layer as a COO table, the chunk id (and document) of each row,
    and each entity's chunk frequency."""
    parts = [to_coo(getattr(layers, name)).assign(layer=name) for name in LAYERS]
    return {"W_layers": pd.concat(parts, ignore_index=True)[["layer", "row", "col", "value"]],
            "W_chunks": pd.DataFrame({"chunk_id": layers.ids.astype(str), "doc_id": np.asarray(doc_ids, dtype=str)}),
            "W_entity_df": pd.DataFrame({"entity": list(layers.entity_df), "df": list(layers.entity_df.values())},
                                        columns=["entity", "df"]).astype({"entity": str, "df": np.int64})}


def load_layers(refs: dict[str, ArtifactRef]) -> tuple[se.Layers, set[str]]:
    """A stored graph's layers (:func:`layers_tables`) and its documents."""
    chunks = Store.read(refs["W_chunks"])
    n = len(chunks)
    table = Store.read(refs["W_layers"])
    mats = {name: coo_matrix(table[table["layer"] == name], (n, n)) for name in LAYERS}
    df = Store.read(refs["W_entity_df"])
    return (se.Layers(chunks["chunk_id"].to_numpy(dtype=object), mats["sem"], mats["log"], mats["dist"],
                      dict(zip(df["entity"].tolist(), df["df"].astype(int).tolist()))),
            set(chunks["doc_id"]))


@dataclass(frozen=True)
class GraphBase:
    """The stored graph an update starts from."""

    fp: str
    refs: dict[str, ArtifactRef]


def find_base(store: Store, dataset: str, params: SeRAGGraphParams, inputs: dict[str, str]
              ) -> tuple[dict[str, str] | None, GraphBase | None]:
    """For ``flows.commands.update``: (the inputs of a stored graph of exactly these inputs, or None; the latest
    stored graph of ``dataset`` with the same params, made by this code, whose files exist).

    A stored graph of the same inputs (a full build, or an earlier update of this corpus) is reused as
    it is; otherwise the newest one is the base."""
    base = None
    for fp, _, inp in stored_versions(store, params, "W_layers", dataset):
        refs = store.lookup(GRAPH, fp)
        if refs is None:
            continue
        if {k: v for k, v in inp.items() if k != "base"} == inputs:
            return inp, None
        base = base or GraphBase(fp, refs)
    return None, base


def stored_update(ctx: RunContext, params: SeRAGGraphParams, documents: ArtifactRef, chunks: ArtifactRef,
                  chunk_embeddings: ArtifactRef, chunk_entity: ArtifactRef, entities: ArtifactRef) -> bool:
    """Whether ``flows.commands.update`` stored a graph grown for exactly these inputs (with these params and code):
    then ``serag_graph(..., incremental=True)`` finds it cached instead of building one."""
    inputs = input_fps(documents=documents, chunks=chunks, chunk_embeddings=chunk_embeddings,
                       chunk_entity=chunk_entity, entities=entities)
    same, _ = find_base(ctx.store, ctx.dataset, params, inputs)
    return same is not None and "base" in same


@stage(GRAPH, params=SeRAGGraphParams)
def serag_graph(ctx: RunContext, params: SeRAGGraphParams, documents: ArtifactRef, chunks: ArtifactRef,
                chunk_embeddings: ArtifactRef, chunk_entity: ArtifactRef, entities: ArtifactRef,
                incremental: bool = False) -> dict[str, ArtifactRef]:
    """Stage: W = λ1 W_sem + λ2 W_log + (1 − λ1 − λ2) W_dist (eqs. 3–6), a COO table, plus layer sizes,
    and the stored layers an update starts from.

    ``incremental`` (``flows.commands.update``): starts from the latest stored graph of this dataset with the same
    params and computes only the rows involving new chunks (:func:`se.grow_layers`). That W differs from a
    full build's in old-old semantic edges, so unlike EraRAG it is NOT stored under the full build's
    fingerprint: its inputs also hold ``base`` (the fingerprint of the graph it grew from)."""
    gp = params.graph()
    inputs = input_fps(documents=documents, chunks=chunks, chunk_embeddings=chunk_embeddings,
                       chunk_entity=chunk_entity, entities=entities)
    base = None
    if incremental:
        same, base = find_base(ctx.store, ctx.dataset, params, inputs)
        if same is not None:
            inputs = same  # this corpus's graph is stored (a full build or an earlier update): cached
        elif base is not None:
            inputs = {**inputs, "base": base.fp}
        else:
            log.info("serag update: no stored graph of %s with this config; building from scratch", ctx.dataset)

    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        t0 = time.perf_counter()
        _, emb = load_embeddings(chunk_embeddings, _emb_id(params))
        doc_ids = Store.read(documents, ["doc_id"])["doc_id"].tolist()
        doc, pos = distance_frame(documents, chunks, doc_ids, params.dist_scope)
        ch = Store.read(chunks, ["chunk_id", "doc_id"])
        ids = ch["chunk_id"].to_numpy(dtype=object)
        if emb.shape[0] != len(doc):
            raise RuntimeError("chunk embeddings are not aligned with the chunks table")
        vocab = Store.read(entities, ["entity_idx", "entity"]).sort_values("entity_idx")
        names = vocab["entity"].to_numpy(dtype=object)
        inc = coo_matrix(Store.read(chunk_entity), (len(doc), entities.rows))
        now_docs = set(ch["doc_id"])
        info: dict[str, Any] = {"mode": "build", "base_fp": "", "added_docs": len(now_docs), "removed_docs": 0,
                                "added_chunks": len(ids), "removed_chunks": 0, "rows_computed": len(ids),
                                "log_rows_refreshed": 0}
        if base is None:
            layers = se.build_layers(ids, emb, inc, names, doc, pos, gp)
        else:
            old, old_docs = load_layers(base.refs)
            layers, rep = se.grow_layers(old, ids, emb, inc, names, doc, pos, gp)
            info.update(mode="update", base_fp=base.fp, added_docs=len(now_docs - old_docs),
                        removed_docs=len(old_docs - now_docs), added_chunks=rep.added, removed_chunks=rep.removed,
                        rows_computed=rep.rows_computed, log_rows_refreshed=rep.log_rows_refreshed)
        w, sizes = se.layers_graph(layers, gp)
        meta = pd.DataFrame([{"n_chunks": len(doc), "W_nnz": int(w.nnz), **sizes, **info,
                              "seconds": time.perf_counter() - t0}])
        return {"W": to_coo(w), "W_meta": meta, **layers_tables(layers, ch["doc_id"].to_numpy())}, \
            int(info["rows_computed"])

    return run_stage(ctx, params, inputs, compute)


@stage(TREE, params=TreeParams)
def serag_tree(ctx: RunContext, params: TreeParams, W: ArtifactRef, W_meta: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: the 2-D encoding tree minimising H²(G) (eq. 1): community per chunk, and its statistics
    (H¹, H², number of communities, size distribution, seconds) in ``tree_meta``."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        n = int(Store.read(W_meta)["n_chunks"].iloc[0])
        t0 = time.perf_counter()
        tree = encoding_tree(coo_matrix(Store.read(W), (n, n)), engine=params.tree_engine)
        seconds = time.perf_counter() - t0
        community = np.asarray(tree.community, np.int64)
        sizes = np.bincount(community)
        meta = pd.DataFrame([{
            "n_communities": int(sizes.size), "entropy_1d": float(tree.entropy_1d),
            "entropy_2d": float(tree.entropy_2d), "n_merges": int(tree.n_merges), "seconds": seconds,
            "singletons": int((sizes == 1).sum()), "size_max": int(sizes.max(initial=0)),
            "size_median": float(np.median(sizes)) if sizes.size else 0.0,
            "size_quantiles": json.dumps({q: float(np.quantile(sizes, q)) for q in (0.1, 0.5, 0.9, 0.99)}
                                         if sizes.size else {})}])
        return {"community": pd.DataFrame({"chunk": np.arange(n), "community": community}),
                "tree_meta": meta}, n

    return run_stage(ctx, params, input_fps(W=W, W_meta=W_meta), compute)


@stage("serag_communities", params=CommunitiesParams)
def serag_communities(ctx: RunContext, params: CommunitiesParams, W: ArtifactRef, community: ArtifactRef,
                      chunk_embeddings: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: W(v|β) (eq. 8, K = 2: −p log2 p, p = d_v / vol(β)) and h_β (eq. 9) per community."""
    def compute() -> tuple[dict[str, pa.Table], int]:
        _, emb = load_embeddings(chunk_embeddings, _emb_id(params))
        comm = Store.read(community)["community"].to_numpy(np.int64)
        n = comm.shape[0]
        adj = coo_matrix(Store.read(W), (n, n))
        weight = se.structural_weight(adj, comm)
        n_comm = int(comm.max(initial=-1)) + 1
        h = se.consolidate(emb, comm, weight, n_comm)
        return {"community_embeddings": pa.table({"community": np.arange(n_comm, dtype=np.int64),
                                                  "emb": embeddings_to_arrow(h)}),
                "structural_weight": pa.table({"chunk": np.arange(n), "weight": weight})}, n_comm

    return run_stage(ctx, params, input_fps(W=W, community=community, chunk_embeddings=chunk_embeddings), compute)


# ---------------------------------------------------------------- update report


def _tree_meta_of(store: Store, graph_fp: str) -> dict | None:
    """The ``tree_meta`` row of the encoding tree built on the graph ``graph_fp``, if one is stored."""
    rows = store.query("SELECT path, input_fps FROM stages WHERE stage = ? AND name = 'tree_meta' "
                       "ORDER BY created_at DESC", [TREE])
    for r in rows.itertuples():
        if json.loads(r.input_fps).get("W") == graph_fp:
            try:
                return Store.read(r.path).iloc[0].to_dict()
            except OSError:
                continue
    return None


def update_summary(store: Store, run_id: str, dataset: str, index: dict[str, ArtifactRef]) -> dict[str, Any]:
    """What a SeRAG update did: documents and chunks added / removed, graph rows computed of the total,
    the graph's seconds, and the cost of the (global) encoding-tree rebuild, with the communities before
    (the base graph's tree) and after."""
    ev = store.events(run_id)

    def computed(stage: str) -> bool:
        status = ev.loc[ev["stage"] == stage, "status"]
        return bool((status == "computed").any())

    meta = Store.read(index["W_meta"]).iloc[0].to_dict()
    tree = Store.read(index["tree_meta"]).iloc[0].to_dict()
    fresh = computed(GRAPH)
    before = _tree_meta_of(store, meta["base_fp"]) if fresh and meta["base_fp"] else None
    community_ev = ev[(ev["stage"] == "serag_communities") & (ev["status"] == "computed")]
    return {
        "mode": meta["mode"] if fresh else "cached",
        "base_fp": meta["base_fp"] if fresh else index["W"].fp,
        "added_docs": int(meta["added_docs"]) if fresh else 0,
        "removed_docs": int(meta["removed_docs"]) if fresh else 0,
        "added_chunks": int(meta["added_chunks"]) if fresh else 0,
        "removed_chunks": int(meta["removed_chunks"]) if fresh else 0,
        "graph_rows_computed": int(meta["rows_computed"]) if fresh else 0,
        "graph_rows_total": int(meta["n_chunks"]),
        "graph_log_rows_refreshed": int(meta["log_rows_refreshed"]) if fresh else 0,
        "graph_seconds": round(float(meta["seconds"]), 3) if fresh else 0.0,
        "tree_rebuilt": computed(TREE),
        "tree_seconds": round(float(tree["seconds"]), 3) if computed(TREE) else 0.0,
        "communities_seconds": round(float(community_ev["seconds"].sum()), 3),
        "communities_before": None if before is None else int(before["n_communities"]),
        "communities_after": int(tree["n_communities"]),
        "segments_total": None, "segments_resummarized": None, "layers": None,
    }
