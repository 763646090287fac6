"""EraRAG stages (leaves, stored hyperplanes, the hierarchy) and the online retriever.

The algorithms live in :mod:`tasks.methods.erarag.algorithm`; this module stores and loads their inputs and outputs.

* Leaves are token-window chunks (``tasks.text.chunk``, unit ``window``) carrying their document's title;
  they are embedded like passages (``embedder.doc_template``), so a passage shorter than the window
  is embedded exactly as ``method=dense`` embeds it.
* The hyperplanes are a stage of their own whose fingerprint depends only on (n, seed, dim): every
  build and every later update of any corpus hashes with exactly these stored bytes (section III-E).
* The hierarchy stage writes every layer's nodes (parent links, LSH codes, embeddings, the document
  of each leaf) and a one-row ``meta`` table: which summariser made the summaries (``extractive`` or
  ``llm``, never switched silently), whether the graph was built (Alg. 1) or updated (Alg. 3) and
  from which stored graph, and the per-layer count of re-summarised segments.
* An update starts from the latest stored hierarchy of the same dataset and stage params (same
  hyperplanes, chunking, embedder, structure, summariser) and code version. With
  ``update_segmenting=local`` (Alg. 3, the default) it keeps that hierarchy's segments, so the result
  depends on it and is stored with the base's fingerprint among its inputs; with ``rebuild`` every
  layer is cut as a build cuts it and the result is stored under a full build's fingerprint. Old files
  are never touched, the new ones are written atomically and the catalog row comes last, so a crash
  leaves the previous hierarchy as it was.
"""
from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core.stage import (
    UNKNOWN_INPUT,
    RunContext,
    input_fps,
    planned,
    run_stage,
    stage,
    stored_versions,
)
from tasks.core.store import ArtifactRef, Store
from tasks.core.vectors import arrow_to_embeddings, embedding_width, embeddings_to_arrow
from tasks.llm.client import make_client
from tasks.llm.params import LLMDryRun, LLMParams
from tasks.llm.summarize import Summarise, dry_run_summariser, make_summariser
from tasks.methods.erarag import algorithm as erarag
from tasks.text.embed import EmbedderParams, cached_encode, load_embeddings
from tasks.methods.erarag.params import ExtractiveHierarchyParams, HyperplanesParams, LLMHierarchyParams, LeavesParams

log = logging.getLogger("dagrag.erarag")

HIERARCHY = "erarag_hierarchy"
SUMMARY_STAGE = "erarag_summary"  # LLM ledger stage of the summaries
TEXT_EMB = "erarag_text_emb"  # row cache of summary / sentence embeddings, by text content


# ---------------------------------------------------------------- leaves and hyperplanes


def leaf_texts(table: pd.DataFrame) -> list[str]:
    """A leaf node's text: ``title: chunk text`` (what the reader and the summariser see)."""
    return [f"{t}: {x}" if t else x for t, x in zip(table["title"].tolist(), table["text"].tolist())]


@stage("erarag_leaves", params=LeavesParams)
def leaves_stage(ctx: RunContext, params: LeavesParams, documents: ArtifactRef, chunks: ArtifactRef
                 ) -> dict[str, ArtifactRef]:
    """Stage: ``leaves(chunk_id, doc_id, title, text)`` = window chunks with their document's title."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        c = Store.read(chunks, ["chunk_id", "doc_id", "text"])
        titles = Store.read(documents, ["doc_id", "title"]).drop_duplicates("doc_id").set_index("doc_id")["title"]
        c.insert(2, "title", titles.reindex(c["doc_id"]).fillna("").to_numpy())
        return {"leaves": c}, len(c)

    return run_stage(ctx, params, input_fps(documents=documents, chunks=chunks), compute)


def embedding_dim(ref: ArtifactRef) -> int:
    """Width of an ``embeddings`` artifact, read from its Parquet schema."""
    return embedding_width(pq.read_schema(ref.path).field("emb").type)


@stage("erarag_hyperplanes", params=HyperplanesParams)
def hyperplanes_stage(ctx: RunContext, params: HyperplanesParams, embeddings: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: the (n, d) hyperplane normals as ``.npy`` bytes, Alg. 1 line 3. Its only input is the embeddings'
    width d, not the corpus, so every later build or update with the same (n, seed, d) reuses exactly these
    bytes."""
    dim = None if planned(embeddings) else embedding_dim(embeddings)  # a plan before the embeddings exist

    def compute() -> tuple[dict[str, bytes], int]:
        buf = io.BytesIO()
        np.save(buf, erarag.hyperplanes(dim, params.n_hyperplanes, params.seed), allow_pickle=False)
        return {"hyperplanes": buf.getvalue()}, params.n_hyperplanes

    return run_stage(ctx, params, {"dim": UNKNOWN_INPUT if dim is None else str(dim)}, compute,
                     ext={"hyperplanes": "npy"})


def load_planes(ref: ArtifactRef | str) -> np.ndarray:
    """The stored hyperplane matrix."""
    return np.load(io.BytesIO(Store.read_bytes(ref)), allow_pickle=False)  # checked against its recorded hash


# ---------------------------------------------------------------- summarisers


def summary_messages(child_texts: tuple[str, ...], words: int) -> list[dict[str, str]]:
    """EraRAG's summary prompt (the ``prompt`` of its LLM summariser): one paragraph of about ``words``
    words per segment (Alg. 1 line 13)."""
    body = "\n\n".join(f"Passage {i + 1}: {t}" for i, t in enumerate(child_texts))
    return [{"role": "system", "content": "You condense groups of related passages into short summaries "
                                          "that are used as entries of a search index."},
            {"role": "user", "content": f"Summarise the passages below in one paragraph of about {words} words. "
                                        "Keep the specific names, places, dates and numbers they mention and "
                                        "write only what the passages support.\n\n" + body}]


def erarag_summariser(kind: str, params: "ExtractiveHierarchyParams | LLMHierarchyParams", embedder: EmbedderParams,
                      client: Any, store: Store) -> Summarise:
    """EraRAG's ``Summarise`` (Alg. 1 line 13): extractive (no model calls but the encoder) or the LLM's
    summaries with EraRAG's prompt under ledger stage ``erarag_summary``; summaries (and, for the
    ``centroid`` rank, sentences) are embedded with the leaves' encoder through the text row cache."""
    def embed(texts: list[str]) -> np.ndarray:
        return cached_encode(store, texts, embedder, TEXT_EMB)

    return make_summariser(kind, params.summary_tokens, embed, client=client, prompt=summary_messages,
                           stage=SUMMARY_STAGE, embed_sentences=params.extractive_rank == "centroid")


# ---------------------------------------------------------------- hierarchy artifact


def nodes_table(h: erarag.Hierarchy, doc_of_leaf: dict[str, str]) -> pa.Table:
    """Every layer's nodes with parent links, codes, the document of each leaf, and embeddings."""
    n = h.nodes
    layer = n["layer"].to_numpy()
    doc = [doc_of_leaf[i] if l == 0 else None for i, l in zip(n["node_id"].tolist(), layer)]
    return pa.table({
        "node_id": pa.array(n["node_id"].tolist(), pa.string()),
        "layer": pa.array(layer, pa.int64()),
        "text": pa.array(n["text"].tolist(), pa.string()),
        "parent_id": pa.array([None if pd.isna(p) else p for p in n["parent_id"].tolist()], pa.string()),
        "code": pa.array(n["code"].to_numpy(dtype=np.uint64), pa.uint64()),
        "n_children": pa.array(n["n_children"].to_numpy(), pa.int64()),
        "doc_id": pa.array(doc, pa.string()),
        "emb": embeddings_to_arrow(h.embeddings if len(n) else np.zeros((0, 1), np.float32)),
    })


def load_hierarchy(path: ArtifactRef | str) -> tuple[erarag.Hierarchy, pd.Series]:
    """(Hierarchy, doc_id per node: a leaf's document, None for summaries) of a stored ``nodes`` table."""
    t = Store.read_arrow(path)
    emb = arrow_to_embeddings(t.column("emb"))
    df = t.drop_columns(["emb"]).to_pandas()
    nodes = df[erarag.NODE_COLUMNS].copy()
    nodes["parent_id"] = nodes["parent_id"].astype(object).where(nodes["parent_id"].notna(), None)
    return erarag.Hierarchy(nodes, emb), df["doc_id"]


@dataclass(frozen=True)
class Base:
    """A stored hierarchy an update starts from."""

    fp: str
    nodes_path: str


def find_base(store: Store, dataset: str, params: "ExtractiveHierarchyParams | LLMHierarchyParams", planes_fp: str,
              inputs: dict[str, str], reuse_updates: bool) -> tuple[Optional[dict[str, str]], Optional[Base]]:
    """(the inputs of a stored hierarchy of exactly these leaves, or None; the latest other stored hierarchy
    of ``dataset`` with the same params, code and hyperplanes whose files exist, or None).

    A local update (Alg. 3) is stored with its base's fingerprint among its inputs; it counts as this
    corpus's hierarchy only with ``reuse_updates`` (``update_segmenting=local``), since under ``rebuild``
    a hierarchy must equal a build."""
    same, base = None, None
    for fp, path, inp in stored_versions(store, params, "nodes", dataset):
        if inp.get("planes") != planes_fp:
            continue  # other hyperplanes
        if {k: v for k, v in inp.items() if k != "base"} == inputs and (reuse_updates or "base" not in inp):
            same = same or inp
        else:
            base = base or Base(fp, path)
    return same, base


def _compute_hierarchy(ctx: RunContext, hp: "ExtractiveHierarchyParams | LLMHierarchyParams", llm: LLMParams,
                       leaves: ArtifactRef, leaf_embeddings: ArtifactRef, planes: ArtifactRef,
                       base: Optional[Base]) -> tuple[dict[str, pa.Table | pd.DataFrame], int]:
    """Alg. 1 from scratch, or Alg. 3 from ``base``: only segments whose membership changed are summarised."""
    t0 = time.perf_counter()
    kind, params, embedder = hp.kind, hp.structure(), hp.encoder()
    store = ctx.store
    table = Store.read(leaves, ["chunk_id", "doc_id", "title", "text"])
    ids, emb = load_embeddings(leaf_embeddings, "chunk_id")
    if not np.array_equal(ids, table["chunk_id"].to_numpy(dtype=object)):
        raise RuntimeError("leaf embeddings are not aligned with the leaves table; delete the artifacts")
    texts = leaf_texts(table)
    doc_of = dict(zip(table["chunk_id"].tolist(), table["doc_id"].tolist()))
    P = load_planes(planes)
    client = make_client(llm, Path(ctx.artifacts_dir) / "llm_cache.duckdb") if kind == "llm" else None
    summarise = erarag_summariser(kind, hp, embedder, client, store)
    estimate: dict[str, int] | None = None
    if client is not None and ctx.llm_dry_run:  # count the LLM's summaries, build with extractive stand-ins
        stand_in = erarag_summariser("extractive", hp, embedder, None, store)
        summarise, estimate = dry_run_summariser(client, summary_messages, params.summary_tokens, stand_in)
    meta: dict[str, Any] = {"summariser": kind, "mode": "build", "base_fp": None, "planes_fp": planes.fp}
    if base is None:
        h, report = erarag.build(ids, emb, summarise, P, params, texts)
        meta.update(added_leaves=len(ids), removed_leaves=0, added_docs=int(table["doc_id"].nunique()),
                    removed_docs=0)
    else:
        old, old_doc = load_hierarchy(base.nodes_path)
        is_leaf = old.nodes["layer"].to_numpy() == 0
        old_ids = set(old.nodes["node_id"].to_numpy()[is_leaf])
        old_docs, new_docs = set(old_doc[is_leaf]), set(table["doc_id"])
        now = set(ids)
        add = np.array([i not in old_ids for i in ids], dtype=bool)
        removed = sorted(old_ids - now)
        h, report = erarag.replace_leaves(old, removed, ids[add], emb[add], summarise, P, params,
                                          [t for t, a in zip(texts, add) if a])
        meta.update(mode="update", base_fp=base.fp, update_segmenting=params.update_segmenting,
                    added_leaves=int(add.sum()), removed_leaves=len(removed),
                    added_docs=len(new_docs - old_docs), removed_docs=len(old_docs - new_docs))
    if estimate is not None:
        raise LLMDryRun(SUMMARY_STAGE, estimate)
    if client is not None:
        ledger = client.ledger_summary(SUMMARY_STAGE)
        store.record_ledger(ctx.run_id, SUMMARY_STAGE, ledger)
        meta["llm"] = {k: ledger[k] for k in ["llm_calls", "llm_cache_hits", "prompt_tokens", "completion_tokens"]}
    meta.update(n_leaves=len(ids), n_layers=h.n_layers, layers=report.layers.to_dict("records"),
                segments_total=report.segments_total, segments_resummarized=report.resummarised,
                seconds=round(time.perf_counter() - t0, 3))
    log.info("erarag hierarchy (%s, %s summaries): %d layers, %d of %d segments summarised",
             meta["mode"], kind, h.n_layers, report.resummarised, report.segments_total)
    meta_df = pd.DataFrame([{"meta": json.dumps(meta, default=int)}])
    return {"nodes": nodes_table(h, doc_of), "meta": meta_df}, report.resummarised


@stage(HIERARCHY, params=(ExtractiveHierarchyParams, LLMHierarchyParams))
def hierarchy_stage(ctx: RunContext, params: ExtractiveHierarchyParams | LLMHierarchyParams, leaves: ArtifactRef,
                    leaf_embeddings: ArtifactRef, planes: ArtifactRef, llm: LLMParams,
                    incremental: bool = False) -> dict[str, ArtifactRef]:
    """Stage: the EraRAG graph of the current leaves. ``incremental`` (``flows.commands.update``) starts from the
    latest stored graph with the same params. With ``update_segmenting=rebuild`` the result is stored under
    a full build's fingerprint; with ``local`` (Alg. 3) it keeps the base's segments, so its inputs also
    name the base, and a later index or evaluate of the same corpus uses it as it is. ``llm`` is the service
    the LLM summariser calls (what in it changes a summary is in ``params``)."""
    inputs = input_fps(leaves=leaves, embeddings=leaf_embeddings, planes=planes)
    local = params.update_segmenting == "local"
    base = None
    if incremental or local:  # flows.commands.index of a corpus not stored yet is a full build (Alg. 1): no base
        same, found = find_base(ctx.store, ctx.dataset, params, planes.fp, inputs, reuse_updates=local)
        if same is not None:  # this corpus's hierarchy is stored (a build or an earlier update): cached
            inputs = same
        elif incremental:
            base = found
            if base is None:
                log.info("erarag update: no stored hierarchy of %s with this config; building from scratch",
                         ctx.dataset)
            elif local:
                inputs = {**inputs, "base": base.fp}

    def compute() -> tuple[dict[str, pa.Table | pd.DataFrame], int]:
        return _compute_hierarchy(ctx, params, llm, leaves, leaf_embeddings, planes, base)

    return run_stage(ctx, params, inputs, compute)


def read_meta(ref: ArtifactRef | str) -> dict:
    """The ``meta`` row of a hierarchy artifact as a dict."""
    return json.loads(Store.read(ref)["meta"].iloc[0])


# ---------------------------------------------------------------- update report


INDEX_STAGES = ("ingest", "chunk", "erarag_leaves", "embed", "erarag_hyperplanes", HIERARCHY)


def full_build_seconds(store: Store, dataset: str, params: str,
                       n_leaves: int) -> tuple[Optional[float], Optional[str]]:
    """Seconds the catalog recorded for the latest full build (Alg. 1) of this dataset and hierarchy params (JSON,
    as the catalog holds them), summed over its index stages and scaled linearly to ``n_leaves``; (None, None) when
    there is none."""
    ev = store.query("SELECT run_id, stage, fp, status, seconds, created_at FROM stage_events WHERE dataset = ?",
                     [dataset])
    metas = store.query("SELECT fp, path, params FROM stages WHERE stage = ? AND name = 'meta' AND dataset = ?",
                        [HIERARCHY, dataset])
    want = json.loads(params)
    builds = []
    for r in metas.itertuples():
        if json.loads(r.params) == want and Path(r.path).exists():
            m = read_meta(r.path)
            if m["mode"] == "build":
                builds.append((r.fp, m["n_leaves"]))
    hier = ev[(ev["stage"] == HIERARCHY) & (ev["status"] == "computed")]
    hier = hier[hier["fp"].isin([fp for fp, _ in builds])].sort_values("created_at")
    if hier.empty:
        return None, None
    last = hier.iloc[-1]
    run = ev[(ev["run_id"] == last["run_id"]) & (ev["status"] == "computed") & ev["stage"].isin(INDEX_STAGES)]
    n_then = dict(builds)[last["fp"]]
    return float(run["seconds"].sum()) * n_leaves / max(n_then, 1), str(last["run_id"])


def update_summary(store: Store, run_id: str, dataset: str, index: dict[str, ArtifactRef]) -> dict[str, Any]:
    """What an EraRAG update did: documents added / removed, segments re-summarised per layer, LLM tokens."""
    ev = store.events(run_id)
    status = ev.loc[ev["stage"] == HIERARCHY, "status"]
    meta = read_meta(index["meta"])
    computed = not status.empty and (status == "computed").any()
    nodes = Store.read(index["nodes"], ["layer"])["layer"]
    per_layer = pd.DataFrame(meta["layers"])
    if not computed:  # this corpus's graph was already stored: nothing recomputed
        per_layer[["segments_resummarised", "nodes_added", "nodes_removed"]] = 0
    seg_total = int((nodes > 0).sum())
    params = store.query("SELECT params FROM stages WHERE stage = ? AND fp = ? AND name = 'meta'",
                         [HIERARCHY, index["meta"].fp])["params"].iloc[0]
    n_leaves = int((nodes == 0).sum())
    estimate, build_run = full_build_seconds(store, dataset, params, n_leaves)
    llm = meta.get("llm") if computed else None
    return {
        "mode": meta["mode"] if computed else "cached",
        "update_segmenting": meta.get("update_segmenting") if computed else None,  # local (Alg. 3) | rebuild
        "summariser": meta["summariser"],
        "base_fp": meta["base_fp"] if computed else index["nodes"].fp,
        "added_docs": meta["added_docs"] if computed else 0,
        "removed_docs": meta["removed_docs"] if computed else 0,
        "added_leaves": meta["added_leaves"] if computed else 0,
        "removed_leaves": meta["removed_leaves"] if computed else 0,
        "segments_total": seg_total,
        "segments_resummarized": int(per_layer["segments_resummarised"].sum()),
        "layers": int(nodes.max()) + 1 if len(nodes) else 0,
        "per_layer": per_layer.to_dict("records"),
        "hierarchy_seconds": meta["seconds"] if computed else 0.0,
        "full_build_seconds_estimate": None if estimate is None else round(estimate, 3),
        "full_build_run_id": build_run,
        "llm_prompt_tokens": (llm or {}).get("prompt_tokens", 0),
        "llm_completion_tokens": (llm or {}).get("completion_tokens", 0),
        "llm_calls": (llm or {}).get("llm_calls", 0),
        "hyperplanes": index["hyperplanes"].path,
    }
