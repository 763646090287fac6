"""ZoomRAG stages (shared global block ``M``) and the online retriever (DocZoom → ChunkZoom).

The algorithms live in :mod:`tasks.methods.zoomrag.algorithm`; this module stores and loads their inputs.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.core.code_identity import code_version
from tasks.core.resources import cpu_threads
from tasks.core.stage import RunContext, input_fps, run_stage
from tasks.core.store import ArtifactRef, Store
from tasks.graph.knn import search_for
from tasks.graph.sparse import coo_matrix, to_coo
from tasks.graph.title_walk import check_title_walk
from tasks.methods.zoomrag import algorithm as zoom
from tasks.text.chunk import CHUNK_UNITS, ChunkParams
from tasks.text.embed import load_embeddings
from tasks.text.gazetteer import LinkingParams
from tasks.core.limits import COUNT, one_of


@dataclass(frozen=True)
class ZoomRAGParams(zoom.ZoomParams, LinkingParams):
    """``method=zoomrag``: the paper's walk settings, how documents are cut into chunks, and the
    entity linking (:class:`tasks.text.gazetteer.LinkingParams`, beyond the paper when not ``ner``)."""

    name: str = "zoomrag"
    top_k: int = field(default=10, metadata=COUNT)
    # §3.2: chunks are sentence-level units, ordered within their document
    chunk_unit: str = field(default="sentence", metadata=one_of(CHUNK_UNITS))
    max_entity_words: int = field(default=6, metadata=COUNT)
    doc_block_rows: int = field(default=1024, metadata=COUNT)
    # ChunkZoom local problems solved together (similar sizes grouped)
    chunk_group_size: int = field(default=32, metadata=COUNT)
    relation_gate_masked: bool = False  # beyond the paper: the gate (if on) reads question and sentence without names

    def __post_init__(self) -> None:
        LinkingParams.__post_init__(self)
        check_title_walk(self.title_walk, self.graph_linking == self.query_linking == "gazetteer",
                         "method.graph_linking=gazetteer and method.query_linking=gazetteer",
                         self.relation_gate_temperature, not self.coupled, "the decoupled walk (method.coupled=false)")

    def walk(self) -> zoom.ZoomParams:
        """The slice :mod:`tasks.methods.zoomrag.algorithm` takes."""
        fields = zoom.ZoomParams.__dataclass_fields__
        walk = zoom.ZoomParams(**{k: v for k, v in asdict(self).items() if k in fields})
        return replace(walk, walk_threads=walk.walk_threads or cpu_threads())  # 0: one batch of queries per CPU

    def chunking(self) -> ChunkParams:
        """How documents are cut into chunks for ChunkZoom."""
        return ChunkParams(unit=self.chunk_unit)


@task(name="doc_doc_graph", cache_policy=NO_CACHE)
def doc_doc_graph(ctx: RunContext, doc_embeddings: ArtifactRef, params: ZoomRAGParams) -> dict[str, ArtifactRef]:
    """Stage: A_doc→doc = exp(cos), row-sparsified at mean + k·std (eq. 2), built in row blocks."""
    slice_ = {"k_std": params.k_std}  # the paper's rule; a cap adds what it uses (a paper-rule block keeps its id)
    search = search_for(doc_embeddings.rows, params.doc_doc_search, params.doc_doc_exact_max)
    if params.doc_doc_max_neighbors > 0:  # the search actually used is recorded (auto: exact for a small corpus)
        slice_.update(max_neighbors=params.doc_doc_max_neighbors, stats_sample=params.doc_doc_stats_sample,
                      search=search)
        if search == "ivf":
            slice_.update(ivf_nlist=params.ivf_nlist, ivf_nprobe=params.ivf_nprobe)

    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        _, emb = load_embeddings(doc_embeddings, "doc_id")
        block = zoom.doc_doc_block(emb, params.k_std, params.doc_block_rows, params.doc_doc_max_neighbors,
                                   params.doc_doc_stats_sample, search, params.ivf_nlist, params.ivf_nprobe)
        return {"doc_doc": to_coo(block)}, block.nnz

    return run_stage(ctx, "doc_doc_graph", code_version(doc_doc_graph), slice_,
                     input_fps(doc_embeddings=doc_embeddings), compute)


@task(name="global_block", cache_policy=NO_CACHE)
def global_block(ctx: RunContext, doc_doc: ArtifactRef, doc_entity: ArtifactRef, entities: ArtifactRef,
                 n_docs: int, params: ZoomRAGParams) -> dict[str, ArtifactRef]:
    """Stage: the shared matrix M over documents + entities (eqs. 1, 2, 6), blocks rescaled (§3.2)."""
    slice_ = {"use_entities": params.use_entities, "use_doc_doc": params.use_doc_doc, "rescale": params.rescale}

    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        m = entities.rows
        M, scales = zoom.global_block(coo_matrix(Store.read(doc_doc), (n_docs, n_docs)),
                                      coo_matrix(Store.read(doc_entity), (n_docs, m)),
                                      use_entities=params.use_entities, use_doc_doc=params.use_doc_doc,
                                      rescale=params.rescale)
        meta = pd.DataFrame([{"n_docs": n_docs, "n_entities": m, "scales": json.dumps(scales)}])
        return {"M": to_coo(M), "M_meta": meta}, M.nnz

    return run_stage(ctx, "global_block", code_version(global_block), slice_,
                     input_fps(doc_doc=doc_doc, doc_entity=doc_entity, entities=entities), compute)
