"""The method registry: ``method.name`` → its index DAG and its online retriever."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from flows import archrag, bm25, dense, erarag, hybrid, linearrag, serag, zoomrag


@dataclass(frozen=True)
class Method:
    """A method = a params schema, an index DAG of cached stages, and a retriever over its index."""

    params: type
    index: Callable  # (ctx, data refs, cfg) -> {name: ArtifactRef}
    retriever: Callable  # (data refs, index refs, cfg) -> tasks.eval.retrieve.Retriever
    # the method's own generation, when it is not "read the top passages" (ArchRAG's adaptive filtering):
    # (client, data refs, index refs, cfg, questions, traces, dry_run) -> (predictions | None, scores)
    answer: Optional[Callable] = None
    # its trace's kept_chunks are its own ranked evidence units (ZoomRAG's ChunkZoom), scored by
    # evidence_recall@k in place of the passage rule (tasks.eval.evidence)
    evidence_units: bool = False


METHODS: dict[str, Method] = {
    "dense": Method(dense.DenseParams, dense.index, dense.retriever),
    "bm25": Method(bm25.BM25Params, bm25.index, bm25.retriever),
    "hybrid": Method(hybrid.HybridParams, hybrid.index, hybrid.retriever),
    "zoomrag": Method(zoomrag.ZoomRAGParams, zoomrag.index, zoomrag.retriever, evidence_units=True),
    "linearrag": Method(linearrag.LinearParams, linearrag.index, linearrag.retriever),
    "erarag": Method(erarag.EraParams, erarag.index, erarag.retriever),
    "serag": Method(serag.SeRAGParams, serag.index, serag.retriever),
    "archrag": Method(archrag.ArchParams, archrag.index, archrag.retriever, archrag.answer),
}
