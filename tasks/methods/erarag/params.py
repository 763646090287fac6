"""EraRAG's params: the method's (``method=erarag``) and its own stages' (:mod:`tasks.methods.erarag.stages`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from tasks.core.stage import (
    StageParams,
    from_config,
    run_setting,
)
from tasks.llm.summarize import summariser_params
from tasks.methods.erarag import algorithm as erarag
from tasks.core.limits import COUNT, COUNT0, one_of
from tasks.text.embed import StoredEncoderParams


VIEWS = ("leaves", "expanded")


SUMMARISERS = ("auto", "extractive", "llm")


@dataclass(frozen=True)
class EraParams(erarag.EraRAGParams):
    """``method=erarag``: the algorithm's settings plus chunking, summariser choice and recall view."""

    name: str = "erarag"
    window_tokens: int = field(default=1200, metadata=COUNT)  # official chunk size (whitespace tokens here)
    overlap_tokens: int = field(default=100, metadata=COUNT0)
    # auto = llm when llm.provider != none, else extractive
    summariser: str = field(default="auto", metadata=one_of(SUMMARISERS))
    # lead: leads first (no sentence encoding) | centroid: nearest the centroid
    extractive_rank: str = field(default="lead", metadata=one_of(('lead', 'centroid')))
    # leaves | expanded: how a retrieved summary node maps to documents
    recall_view: str = field(default="leaves", metadata=one_of(VIEWS))

    def __post_init__(self) -> None:
        super().__post_init__()  # recall_view, summariser, extractive_rank: their one_of metadata (the config check)


@dataclass(frozen=True)
class LeavesParams(StageParams):
    """None: a leaf is its chunk with its document's title."""


@dataclass(frozen=True)
class HyperplanesParams(StageParams):
    """How many hyperplanes, from which seed (Alg. 1 line 3)."""

    SOURCES = ("method",)
    n_hyperplanes: int
    seed: int


@dataclass(frozen=True)
class HierarchyParams(StoredEncoderParams):
    """The EraRAG graph (Alg. 1, Alg. 3): its structure, the summariser and the encoder of its summaries, and what
    a stored graph must share to be the base of an update (the leaves' chunking and how they were rendered)."""

    SOURCES = ("method",)
    n_hyperplanes: int
    seed: int
    segment_min: int
    segment_avg: int
    segment_max: int
    max_layers: int
    stop_nodes: Optional[int]
    summary_tokens: int
    window_tokens: int
    overlap_tokens: int
    doc_template: str = from_config("embedder.doc_template")
    # local (Alg. 3) keeps a base's segments, and the result names its base among its inputs; a build is the same
    # either way: it decides how an update runs, which the inputs already tell
    update_segmenting: str = run_setting()

    def structure(self) -> erarag.EraRAGParams:
        """The settings :mod:`tasks.methods.erarag.algorithm` builds and updates with."""
        return erarag.EraRAGParams(n_hyperplanes=self.n_hyperplanes, seed=self.seed, segment_min=self.segment_min,
                                   segment_avg=self.segment_avg, segment_max=self.segment_max,
                                   max_layers=self.max_layers, stop_nodes=self.stop_nodes,
                                   summary_tokens=self.summary_tokens, update_segmenting=self.update_segmenting)


@dataclass(frozen=True)
class ExtractiveHierarchyParams(HierarchyParams):
    """``erarag_hierarchy`` with extractive summaries: how sentences are ranked; no LLM setting is read."""

    kind: ClassVar[str] = "extractive"
    extractive_rank: str = from_config("extractive_rank")


@dataclass(frozen=True)
class LLMHierarchyParams(HierarchyParams):
    """``erarag_hierarchy`` with the LLM's summaries: what in the ``llm`` group changes a summary (not base_url,
    concurrency or timeouts)."""

    kind: ClassVar[str] = "llm"
    extractive_rank: str = from_config("extractive_rank")  # the dry run's stand-in summaries
    llm_provider: str = from_config("llm.provider")
    llm_model: str = from_config("llm.model")
    llm_temperature: float = from_config("llm.temperature")
    llm_seed: int = from_config("llm.seed")


def hierarchy_params(cfg: Any) -> ExtractiveHierarchyParams | LLMHierarchyParams:
    """The hierarchy stage's params of the summariser ``method.summariser`` resolves to."""
    return summariser_params(cfg, ExtractiveHierarchyParams, LLMHierarchyParams)
