"""ZoomRAG stages (shared global block ``M``) and the online retriever (DocZoom → ChunkZoom).

The algorithms live in :mod:`tasks.methods.zoomrag.algorithm`; this module stores and loads their inputs.
"""
from __future__ import annotations

import json

import pandas as pd

from tasks.core.stage import RunContext, input_fps, run_stage, stage
from tasks.core.store import ArtifactRef, Store
from tasks.graph.sparse import coo_matrix, to_coo
from tasks.methods.zoomrag import algorithm as zoom
from tasks.text.embed import load_embeddings
from tasks.methods.zoomrag.params import DocDocParams, GlobalBlockParams


@stage("doc_doc_graph", params=DocDocParams)
def doc_doc_graph(ctx: RunContext, params: DocDocParams, doc_embeddings: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: A_doc→doc = exp(cos), row-sparsified at mean + k·std (eq. 2), built in row blocks."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        _, emb = load_embeddings(doc_embeddings, "doc_id")
        block = zoom.doc_doc_block(emb, params.k_std, params.doc_block_rows, params.doc_doc_max_neighbors,
                                   params.doc_doc_stats_sample, params.doc_doc_search, params.ivf_nlist,
                                   params.ivf_nprobe, params.doc_doc_exact_max)
        return {"doc_doc": to_coo(block)}, block.nnz

    return run_stage(ctx, params, input_fps(doc_embeddings=doc_embeddings), compute)


@stage("global_block", params=GlobalBlockParams)
def global_block(ctx: RunContext, params: GlobalBlockParams, doc_doc: ArtifactRef, doc_entity: ArtifactRef,
                 entities: ArtifactRef, n_docs: int) -> dict[str, ArtifactRef]:
    """Stage: the shared matrix M over documents + entities (eqs. 1, 2, 6), blocks rescaled (§3.2)."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        m = entities.rows
        M, scales = zoom.global_block(coo_matrix(Store.read(doc_doc), (n_docs, n_docs)),
                                      coo_matrix(Store.read(doc_entity), (n_docs, m)),
                                      use_entities=params.use_entities, use_doc_doc=params.use_doc_doc,
                                      rescale=params.rescale)
        meta = pd.DataFrame([{"n_docs": n_docs, "n_entities": m, "scales": json.dumps(scales)}])
        return {"M": to_coo(M), "M_meta": meta}, M.nnz

    return run_stage(ctx, params, input_fps(doc_doc=doc_doc, doc_entity=doc_entity, entities=entities), compute)
