"""ArchRAG's params: the method's (``method=archrag``), the KG group's (``kg``) and its own stages'
(:mod:`tasks.methods.archrag.stages`)."""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from tasks.core.stage import StageParams, from_config
from tasks.llm.params import LLMReplyParams
from tasks.llm.summarize import summariser_params
from tasks.methods.archrag import algorithm as alg
from tasks.methods.archrag.chnsw import CHNSWParams
from tasks.text.chunk import CHUNK_UNITS, ChunkParams
from tasks.text.embed import StoredEncoderParams
from tasks.core.limits import COUNT, COUNT0, POSITIVE, PROB, one_of
from tasks.graph.knn import SEARCHES
from tasks.methods.archrag.algorithm import CLUSTERINGS, EDGE_WEIGHTS
from tasks.methods.archrag.kg import BUILDERS


SUMMARISERS = ("auto", "extractive", "llm")
GENERATIONS = ("filter", "direct")
RELATION_SCOPES = ("among", "incident")
SOURCE_UNITS = ("chunk", "passage")  # ArchParams.source_unit: what an item's sources are under source_relevance
PASSAGE_RULES = ("auto", "entity_rank", "similarity_sum", "source_relevance")  # ArchParams.passage_rule (the retriever's module doc)


@dataclass(frozen=True)
class ArchParams:
    """``method=archrag``: every knob of §3 / App. B.2 with the paper's (else the authors' code's) default."""

    name: str = "archrag"
    # passages ranked per query (the harness's recall@k rule, see retriever)
    top_k: int = field(default=10, metadata=COUNT)
    # ArchRAG returns no passages (§3.2.1). entity_rank: the passages of the retrieved entities, in the order of
    # their rank (a principle fixed before it was measured) | similarity_sum: the earlier rule, kept for comparison |
    # source_relevance (beyond the paper, #58): the passages every retrieved item was made from, by cosine to the
    # question | auto: source_relevance where documents are cut into several passages, else entity_rank
    passage_rule: str = field(default="auto", metadata=one_of(PASSAGE_RULES))
    # source_relevance only (beyond the paper, #58): chunk: an item's sources are the passages of the §3.1.1 chunks
    # (window_tokens windows of the source document) its passages lie in | passage: those passages only
    source_unit: str = field(default="chunk", metadata=one_of(SOURCE_UNITS))
    # from the authors' code: passages of a separate dense index added (0 in their query.sh)
    topk_chunk: int = field(default=0, metadata=COUNT0)
    # §3.1.1 chunks (code: GraphRAG's 600-token windows with 100 overlap; whitespace tokens here)
    chunk_unit: str = field(default="window", metadata=one_of(CHUNK_UNITS))
    window_tokens: int = field(default=600, metadata=COUNT)
    overlap_tokens: int = field(default=100, metadata=COUNT0)
    # §3.1.2 Algorithm 1 (ClusterParams)
    augment: bool = True
    k_scale: float = field(default=1.0, metadata=COUNT0)
    percentile: float = field(default=0.8, metadata=PROB)
    edge_weight: str = field(default="cos", metadata=one_of(EDGE_WEIGHTS))
    attribute_weights: bool = True
    clustering: str = field(default="leiden", metadata=one_of(CLUSTERINGS))
    max_cluster_size: int = field(default=15, metadata=COUNT)
    resolution: float = field(default=1.0, metadata=POSITIVE)
    min_clusters: int = field(default=10, metadata=COUNT)
    max_level: int = field(default=6, metadata=COUNT0)
    seed: int = 0
    # line 3's kNN: exact (paper) | ivf | auto (beyond the paper; exact up to knn_exact_max nodes)
    knn_search: str = field(default="exact", metadata=one_of(SEARCHES))
    knn_exact_max: int = field(default=50_000, metadata=COUNT)
    ivf_nlist: int = field(default=0, metadata=COUNT0)  # knn_search=ivf: k-means cells (0: sqrt(n))
    ivf_nprobe: int = field(default=8, metadata=COUNT)  # knn_search=ivf: cells searched per node
    # community summaries (Alg. 1 line 7)
    # auto: llm when an LLM is configured, else extractive (recorded, never silent)
    summariser: str = field(default="auto", metadata=one_of(SUMMARISERS))
    summary_tokens: int = field(default=100, metadata=COUNT)  # extractive: whitespace tokens of a summary
    # code: members + relations packed to 4,000 tokens per report
    report_input_tokens: int = field(default=4000, metadata=COUNT)
    report_max_tokens: int = field(default=1500, metadata=COUNT)  # completion budget of one JSON report
    # §3.1.3 C-HNSW (App. B.3: M 32, ef 100/100)
    hnsw_m: int = field(default=32, metadata=COUNT)
    ef_construction: int = field(default=100, metadata=COUNT)
    ef_search: int = field(default=100, metadata=COUNT)
    exact_search: bool = False  # brute force per layer instead of the graphs (tests, checks)
    # §3.2.1 hierarchical search (§4.1: k = 5 per layer; every layer searched)
    # one k for all layers, or one per layer (0 = entities first)
    k_per_layer: tuple[int, ...] = field(default=(5,), metadata=COUNT0)
    entity_only: bool = False  # Table 4 "Entity-Only": search and use entities only
    # §3.2.1: relations among the retrieved entities | incident: touching one
    relation_scope: str = field(default="among", metadata=one_of(RELATION_SCOPES))
    max_relations: int = field(default=10, metadata=COUNT0)  # code's topk_e: relations given with layer 0
    # §3.2.2 adaptive filtering-based generation (eqs. 3–4)
    generation: str = field(default="filter", metadata=one_of(GENERATIONS))  # filter | direct (Table 4 "Direct Prompt")
    filter_budget_tokens: int = field(default=4000, metadata=COUNT)
    merge_budget_tokens: int = field(default=4000, metadata=COUNT)
    filter_max_tokens: int = field(default=1000, metadata=COUNT)
    answer_max_tokens: int = field(default=512, metadata=COUNT)

    def __post_init__(self) -> None:
        # summariser, generation, relation_scope and passage_rule: their one_of metadata (the config check)
        if isinstance(self.k_per_layer, int):
            object.__setattr__(self, "k_per_layer", (self.k_per_layer,))
        if not self.k_per_layer or min(self.k_per_layer) < 0:
            raise ValueError("method.k_per_layer must be one or more non-negative ints")
        self.clustering_params()  # validates Algorithm 1's knobs
        ChunkParams(unit=self.chunk_unit, window_tokens=self.window_tokens, overlap_tokens=self.overlap_tokens)

    def clustering_params(self) -> alg.ClusterParams:
        names = {f.name for f in fields(alg.ClusterParams)}
        return alg.ClusterParams(**{k: v for k, v in asdict(self).items() if k in names})

    def k_of_layer(self, layer: int) -> int:
        """k of one layer: the last given k repeats upwards."""
        return self.k_per_layer[min(layer, len(self.k_per_layer) - 1)]


@dataclass(frozen=True)
class EntityAttributeTextsParams(StageParams):
    """None: an entity's attribute text is its name and description."""


@dataclass(frozen=True)
class HierarchyParams(StoredEncoderParams):
    """Algorithm 1 (:class:`tasks.methods.archrag.algorithm.ClusterParams`), what a summary is made from (line 7)
    and the encoder of the community attributes (the entities' own); its two variants add their summariser's
    settings."""

    SOURCES = ("method",)
    augment: bool
    k_scale: float
    percentile: float
    edge_weight: str
    attribute_weights: bool
    clustering: str
    max_cluster_size: int
    resolution: float
    min_clusters: int
    max_level: int
    seed: int
    knn_search: str
    knn_exact_max: int
    ivf_nlist: int
    ivf_nprobe: int
    report_input_tokens: int
    summary_tokens: int  # the extractive summary (with an LLM: of a report that stays invalid)

    def clustering_params(self) -> alg.ClusterParams:
        """The knobs :func:`tasks.methods.archrag.algorithm.hierarchical_clustering` takes."""
        return alg.ClusterParams(**{f.name: getattr(self, f.name) for f in fields(alg.ClusterParams)})


@dataclass(frozen=True)
class ExtractiveHierarchyParams(HierarchyParams):
    """``archrag_hierarchy`` with extractive summaries: no LLM setting is read."""

    kind: ClassVar[str] = "extractive"


@dataclass(frozen=True)
class LLMHierarchyParams(HierarchyParams, LLMReplyParams):
    """``archrag_hierarchy`` with the LLM's community reports: their budget, and what in the ``llm`` group changes
    a report (never the endpoint or key)."""

    kind: ClassVar[str] = "llm"
    report_max_tokens: int = from_config("report_max_tokens")


def hierarchy_params(cfg: Any) -> ExtractiveHierarchyParams | LLMHierarchyParams:
    """The hierarchy stage's params of the summariser ``method.summariser`` resolves to."""
    return summariser_params(cfg, ExtractiveHierarchyParams, LLMHierarchyParams)


@dataclass(frozen=True)
class CHNSWBuildParams(StageParams):
    """The C-HNSW index (App. B.3: M 32, ef 100/100): ``ef_search`` and ``exact`` are stored in it and the
    retriever searches with them, so they are its params too (``exact`` also builds flat layers)."""

    SOURCES = ("method",)
    M: int = from_config("hnsw_m")
    ef_construction: int = 100
    ef_search: int = 100
    exact: bool = from_config("exact_search", False)

    def chnsw(self) -> CHNSWParams:
        return CHNSWParams(M=self.M, ef_construction=self.ef_construction, ef_search=self.ef_search, exact=self.exact)


@dataclass(frozen=True)
class KGParams:
    """ArchRAG KG settings. ``builder``: ``cooccur`` (spaCy co-occurrence, LLM-free, not the paper's) or
    ``llm`` (the paper's §3.1.1 extraction). ``description_tokens`` caps cooccur descriptions;
    ``max_empty_fraction``, ``describe_max_tokens`` and ``extract_max_tokens`` (completion budget of
    one chunk's JSON, which the llm group's default 512 would often truncate) are llm's."""

    builder: str = field(default="cooccur", metadata=one_of(BUILDERS))
    description_tokens: int = field(default=100, metadata=COUNT)
    max_empty_fraction: float = field(default=0.5, metadata=PROB)
    describe_max_tokens: int = field(default=300, metadata=COUNT)
    extract_max_tokens: int = field(default=1500, metadata=COUNT)

    def __post_init__(self) -> None:
        if self.description_tokens < 1 or self.describe_max_tokens < 1 or self.extract_max_tokens < 1:
            raise ValueError("description_tokens, describe_max_tokens and extract_max_tokens must be >= 1")


@dataclass(frozen=True)
class CooccurKGParams(StageParams):
    """``archrag_kg_cooccur``: the builder's name and the cap on an entity's description."""

    SOURCES = ("kg",)
    builder: str
    description_tokens: int


@dataclass(frozen=True)
class LLMKGParams(LLMReplyParams):
    """``archrag_kg_llm``: the completion budgets, the empty-reply limit, and what in the ``llm`` group changes a
    reply (never the endpoint or key)."""

    SOURCES = ("kg",)
    builder: str
    extract_max_tokens: int
    describe_max_tokens: int
    max_empty_fraction: float


@dataclass(frozen=True)
class ExtractParams(LLMReplyParams):
    """``archrag_extract``, the per-chunk extraction inside ``archrag_kg_llm`` (:meth:`of_kg` from its params)."""

    SOURCES = ("kg",)
    builder: str
    extract_max_tokens: int
    max_empty_fraction: float

    @classmethod
    def of_kg(cls, params: LLMKGParams) -> "ExtractParams":
        return cls(**{f.name: getattr(params, f.name) for f in dataclasses.fields(cls)})


def kg_params(config: Any) -> "CooccurKGParams | LLMKGParams":
    """The KG stage's params for ``config.kg.builder``: the projection a flow hands :func:`archrag_kg`."""
    return (CooccurKGParams if config.kg.builder == "cooccur" else LLMKGParams).of(config)
