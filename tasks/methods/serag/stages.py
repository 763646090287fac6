"""SeRAG index stages: multi-perspective graph (§3.1), 2-D encoding tree (eq. 1, K = 2), community
vectors (§3.2). The equations live in :mod:`tasks.methods.serag.algorithm`; this module stores them.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.core.code_identity import code_version
from tasks.core.stage import RunContext, input_fps, run_stage
from tasks.core.store import ArtifactRef, Store
from tasks.graph.sparse import coo_matrix, to_coo
from tasks.methods.serag import algorithm as se
from tasks.text.chunk import ChunkParams
from tasks.text.embed import embeddings_to_arrow, load_embeddings

try:  # written on branch serag-tree; the tree stage says so clearly when it is missing
    from tasks.graph.encoding_tree import encoding_tree
except ImportError:  # pragma: no cover - only before serag-tree is merged
    encoding_tree = None


@dataclass(frozen=True)
class SeRAGParams:
    """``method=serag``: every App. A.3 (Table 5) constant, the Table 2 ablations, and our choices."""

    name: str = "serag"
    top_k: int = 10  # passages returned per query (recall@k); the paper's reader budget is k = 3
    # §3.1 / Table 5: graph construction
    lambda_sem: float = 0.45
    lambda_log: float = 0.45  # distance weight 1 − λ1 − λ2 = 0.10
    k_sem: int = 20
    sigma_dist: float = 5.0
    dist_window: int = 10  # App. A.3 "within a window of 10", read as |i − j| <= 10 in one document
    max_entity_chunks: int = 50  # logical-layer cap (our choice; the paper has none)
    # Table 5: indexing
    tree_height: int = 2  # K; only 2 is implemented (one community level, notes §4)
    # §3.3 / Table 5: retrieval
    gamma_c: float = 0.4
    gamma_f: float = 0.6
    k_coarse: int = 10
    tau: float = 0.85
    entity_sim: str = "embedding"  # sim(e, e_q) of eq. 12: embedding cosine of entity names | exact (match = 1)
    # Table 2 ablations
    self_query: bool = True  # needs an LLM (llm=local|openai); without one the retriever says it ran without
    single_layer: bool = False  # no community term (eq. 10 with γ_c = 0, no community filter)
    semantic_only: bool = False  # W = W_sem only
    # engineering
    chunk_unit: str = "passage"  # a benchmark passage is one chunk (short Wikipedia paragraphs, as in §4 setup)
    self_query_max_tokens: int = 256
    batch_size: int = 64

    def __post_init__(self) -> None:
        if self.entity_sim not in {"embedding", "exact"}:
            raise ValueError(f"method.entity_sim must be embedding or exact, got {self.entity_sim!r}")
        if self.tree_height != 2:
            raise ValueError("serag implements the paper's K = 2 encoding tree only (method.tree_height=2)")

    def graph(self) -> se.GraphParams:
        fields = se.GraphParams.__dataclass_fields__
        return se.GraphParams(**{k: v for k, v in asdict(self).items() if k in fields})

    def scoring(self) -> se.ScoreParams:
        fields = se.ScoreParams.__dataclass_fields__
        return se.ScoreParams(**{k: v for k, v in asdict(self).items() if k in fields})

    def chunking(self) -> ChunkParams:
        return ChunkParams(unit=self.chunk_unit)


def _emb_id(params: SeRAGParams) -> str:
    """Id column of the chunk embeddings: whole-passage chunks reuse the passage embeddings (title + text)."""
    return "doc_id" if params.chunk_unit == "passage" else "chunk_id"


def chunk_frame(chunks: ArtifactRef, doc_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(document index, position in document) of every chunk, in chunk-table order."""
    ch = Store.read(chunks, ["doc_id", "position"])
    doc_pos = pd.Series(np.arange(len(doc_ids)), index=pd.Index(doc_ids))
    return doc_pos.loc[ch["doc_id"]].to_numpy(np.int64), ch["position"].to_numpy(np.int64)


@task(name="serag_graph", cache_policy=NO_CACHE)
def serag_graph(ctx: RunContext, documents: ArtifactRef, chunks: ArtifactRef, chunk_embeddings: ArtifactRef,
                chunk_entity: ArtifactRef, entities: ArtifactRef, params: SeRAGParams) -> dict[str, ArtifactRef]:
    """Stage: W = λ1 W_sem + λ2 W_log + (1 − λ1 − λ2) W_dist (eqs. 3–6), a COO table, plus layer sizes."""
    gp = params.graph()

    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        t0 = time.perf_counter()
        _, emb = load_embeddings(chunk_embeddings, _emb_id(params))
        doc, pos = chunk_frame(chunks, Store.read(documents, ["doc_id"])["doc_id"].tolist())
        if emb.shape[0] != len(doc):
            raise RuntimeError("chunk embeddings are not aligned with the chunks table")
        inc = coo_matrix(Store.read(chunk_entity), (len(doc), entities.rows))
        w, layers = se.multi_perspective_graph(emb, inc, doc, pos, gp)
        meta = pd.DataFrame([{"n_chunks": len(doc), "W_nnz": int(w.nnz), **layers,
                              "seconds": time.perf_counter() - t0}])
        return {"W": to_coo(w), "W_meta": meta}, int(w.nnz)

    return run_stage(ctx, "serag_graph", code_version(serag_graph), gp,
                     input_fps(documents=documents, chunks=chunks, chunk_embeddings=chunk_embeddings,
                               chunk_entity=chunk_entity, entities=entities), compute)


@task(name="serag_tree", cache_policy=NO_CACHE)
def serag_tree(ctx: RunContext, W: ArtifactRef, W_meta: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: the 2-D encoding tree minimising H²(G) (eq. 1): community per chunk, and its statistics
    (H¹, H², number of communities, size distribution, seconds) in ``tree_meta``."""
    if encoding_tree is None:
        raise RuntimeError("tasks.graph.encoding_tree is missing: merge branch serag-tree")

    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        n = int(Store.read(W_meta)["n_chunks"].iloc[0])
        t0 = time.perf_counter()
        tree = encoding_tree(coo_matrix(Store.read(W), (n, n)))
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

    return run_stage(ctx, "serag_tree", code_version(serag_tree), {}, input_fps(W=W, W_meta=W_meta), compute)


@task(name="serag_communities", cache_policy=NO_CACHE)
def serag_communities(ctx: RunContext, W: ArtifactRef, community: ArtifactRef, chunk_embeddings: ArtifactRef,
                      params: SeRAGParams) -> dict[str, ArtifactRef]:
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

    return run_stage(ctx, "serag_communities", code_version(serag_communities), {"chunk_unit": params.chunk_unit},
                     input_fps(W=W, community=community, chunk_embeddings=chunk_embeddings), compute)
