"""LinearRAG stages (entity texts for the embed stage) and the online retriever.

The algorithms live in :mod:`tasks.methods.linearrag.algorithm` (pure numpy/scipy); this module stores and loads
their inputs. The Tri-Graph's matrices are the shared entity layer's incidence tables
(:func:`tasks.text.entities.entity_graph` over sentence chunks): ``doc_entity`` is the contain
matrix C (mention counts N_{e,p}), ``chunk_entity`` the mention matrix M (binarised on load).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.core.code_identity import code_version
from tasks.core.stage import RunContext, input_fps, run_stage
from tasks.core.store import ArtifactRef, Store
from tasks.methods.linearrag import algorithm as lr
from tasks.text.chunk import ChunkParams


@dataclass(frozen=True)
class LinearParams(lr.LinearRAGParams):
    """``method=linearrag``: the retrieval settings of :class:`tasks.methods.linearrag.algorithm.LinearRAGParams` plus a name.

    ``top_k`` is the authors' ``retrieval_top_k`` (passages handed to a reader); ``search(k)``
    returns k passages, and evaluate asks for max(eval.ks, top_k), so recall@10 sees 10.
    """

    name: str = "linearrag"

    def retrieval(self) -> lr.LinearRAGParams:
        """The slice :mod:`tasks.methods.linearrag.algorithm` takes."""
        names = {f.name for f in fields(lr.LinearRAGParams)}
        return lr.LinearRAGParams(**{f.name: getattr(self, f.name) for f in fields(self) if f.name in names})

    def sentences(self) -> ChunkParams:
        """Passages are cut into sentences (section 3.1)."""
        return ChunkParams(unit="sentence")


@task(name="entity_texts", cache_policy=NO_CACHE)
def entity_texts(ctx: RunContext, entities: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: ``entity_texts(entity_id, text)`` in vocabulary order, the embed stage's input.

    An entity node is its normalised string, so the id is the string and so is the text.
    """
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        vocab = Store.read(entities, ["entity_idx", "entity"]).sort_values("entity_idx")
        names = vocab["entity"].astype(str).to_numpy()
        return {"entity_texts": pd.DataFrame({"entity_id": names, "text": names})}, len(names)

    return run_stage(ctx, "entity_texts", code_version(entity_texts), {}, input_fps(entities=entities), compute)
