"""SeRAG's params: the method's (``method=serag``) and its own stages' (:mod:`tasks.methods.serag.stages`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tasks.core.stage import StageParams
from tasks.graph.encoding_tree import MERGE_ENGINES
from tasks.methods.serag import algorithm as se
from tasks.text.chunk import CHUNK_UNITS
from tasks.text.linking import LinkingParams
from tasks.core.limits import COUNT, COUNT0, POSITIVE, PROB, one_of, within
from tasks.graph.knn import SEARCHES
from tasks.methods.serag.algorithm import BONUS_NORMS, BONUS_SCOPES, COMMUNITY_FILTERS


NER_INPUTS = ("embedded", "text")  # SeRAGParams.ner_input
DIST_SCOPES = ("document", "passage")  # SeRAGParams.dist_scope


@dataclass(frozen=True)
class SeRAGParams(LinkingParams):
    """``method=serag``: every App. A.3 (Table 5) constant, the Table 2 ablations, and our choices; the
    entity linking (:class:`tasks.text.linking.LinkingParams`, beyond the paper when not ``ner``)."""

    name: str = "serag"
    # passages returned per query (recall@k); the paper's reader budget is k = 3
    top_k: int = field(default=10, metadata=COUNT)
    # §3.1 / Table 5: graph construction
    lambda_sem: float = field(default=0.45, metadata=PROB)
    lambda_log: float = field(default=0.45, metadata=PROB)  # distance weight 1 − λ1 − λ2 = 0.10
    k_sem: int = field(default=20, metadata=COUNT)
    sigma_dist: float = field(default=5.0, metadata=POSITIVE)
    # App. A.3 "within a window of 10", read as |i − j| <= 10 in one document
    dist_window: int = field(default=10, metadata=COUNT0)
    # what "the same document" of eq. 5 is: document (§3.1: the source document a passage was cut from, chunks in
    # reading order; a benchmark passage is its own document, so none of its chunks changes) | passage (each
    # passage its own document, as before passages had a source document)
    dist_scope: str = field(default="document", metadata=one_of(DIST_SCOPES))
    max_entity_chunks: int = field(default=50, metadata=COUNT)  # logical-layer cap (our choice; the paper has none)
    # beyond the paper: the semantic layer's kNN, exact | ivf | auto (exact up to knn_exact_max)
    knn_search: str = field(default="auto", metadata=one_of(SEARCHES))
    knn_exact_max: int = field(default=50_000, metadata=COUNT)
    ivf_nlist: int = field(default=0, metadata=COUNT0)  # knn_search=ivf: k-means cells (0: sqrt(n))
    ivf_nprobe: int = field(default=8, metadata=COUNT)  # knn_search=ivf: cells searched per chunk
    # Table 5: indexing
    tree_height: int = 2  # K; only 2 is implemented (one community level, notes §4)
    tree_engine: str = "compiled"  # the greedy merge as numba machine code | python (the same merge, interpreted)
    # §3.3 / Table 5: retrieval
    gamma_c: float = field(default=0.4, metadata=PROB)
    gamma_f: float = field(default=0.6, metadata=PROB)
    k_coarse: int = field(default=10, metadata=COUNT)
    # cosine gate of eq. 12; a value above 1 gates every entity out (no entity bonus)
    tau: float = field(default=0.85, metadata=within("[-1, inf)"))
    # sim(e, e_q) of eq. 12: embedding cosine of entity names | exact (match = 1)
    entity_sim: str = field(default="embedding", metadata=one_of(('embedding', 'exact')))
    # e_q of eq. 12 are "the target entities identified in the query" (§3.3): the question's NER names alone (0).
    # Beyond the paper: > 0 adds every question n-gram of up to this many words found in the entity vocabulary
    query_ngram_max_words: int = field(default=0, metadata=COUNT0)
    # beyond the paper: hard (App. A.3: only chunks of the top-k_coarse communities are ranked) | soft (every
    # chunk is ranked, eq. 10's γ_c community term kept)
    community_filter: str = field(default="hard", metadata=one_of(COMMUNITY_FILTERS))
    # beyond the paper: none (eq. 13 as printed: a sum over the chunk's gated entities) | query_entities (B divided
    # by the number of vocabulary entities gated in for the query, so many matched names do not add up)
    bonus_norm: str = field(default="none", metadata=one_of(BONUS_NORMS))
    # beyond the paper, for documents cut into several passages: document (a passage of such a document earns the
    # largest eq. 13 bonus among its document's passages, so entity matches rank documents and the passage's own
    # cosine and community term rank the passages inside one) | passage (eq. 13 as printed: the chunk's own
    # entities). A passage that is its own document (every benchmark passage) gets eq. 13's own bonus either way
    bonus_scope: str = field(default="document", metadata=one_of(BONUS_SCOPES))
    # what NER reads: embedded (§3.1 extracts each chunk's entity set; the chunk is what is embedded, with
    # chunk_unit=passage title + "\n" + text) | text (the passage text without its title; the earlier reading, kept for comparison)
    ner_input: str = field(default="embedded", metadata=one_of(NER_INPUTS))
    # Table 2 ablations
    self_query: bool = True  # needs an LLM (llm=local|openai); without one the retriever says it ran without
    single_layer: bool = False  # no community term (eq. 10 with γ_c = 0, no community filter)
    semantic_only: bool = False  # W = W_sem only
    # engineering
    # a benchmark passage is one chunk (short Wikipedia paragraphs, as in §4 setup)
    chunk_unit: str = field(default="passage", metadata=one_of(CHUNK_UNITS))
    self_query_max_tokens: int = field(default=256, metadata=COUNT)
    batch_size: int = field(default=64, metadata=COUNT)
    # beyond the paper (it describes no update): index and evaluate use the graph flows.commands.update grew for exactly
    # this corpus (it keeps old-old semantic edges that a build recomputes); false: always a build's graph
    reuse_updates: bool = True

    def __post_init__(self) -> None:
        LinkingParams.__post_init__(self)
        if self.tree_height != 2:
            raise ValueError("serag implements the paper's K = 2 encoding tree only (method.tree_height=2)")
        if self.tree_engine not in MERGE_ENGINES:
            raise ValueError(f"method.tree_engine must be one of {MERGE_ENGINES}, got {self.tree_engine!r}")

    def scoring(self) -> se.ScoreParams:
        fields = se.ScoreParams.__dataclass_fields__
        return se.ScoreParams(**{k: v for k, v in asdict(self).items() if k in fields})


@dataclass(frozen=True)
class SeRAGGraphParams(StageParams):
    """The multi-perspective graph (§3.1, Table 5; :class:`tasks.methods.serag.algorithm.GraphParams`) and the
    chunk unit (whole-passage chunks reuse the passage embeddings): what a stored graph must share to be the base
    of an update."""

    SOURCES = ("method",)
    lambda_sem: float
    lambda_log: float
    k_sem: int
    sigma_dist: float
    dist_window: int
    dist_scope: str
    max_entity_chunks: int
    semantic_only: bool
    knn_search: str
    knn_exact_max: int
    ivf_nlist: int
    ivf_nprobe: int
    chunk_unit: str

    def graph(self) -> se.GraphParams:
        """The settings :mod:`tasks.methods.serag.algorithm` takes."""
        return se.GraphParams(**{f: getattr(self, f) for f in se.GraphParams.__dataclass_fields__})


@dataclass(frozen=True)
class TreeParams(StageParams):
    """How the encoding tree's greedy merge runs (both engines make the same merges)."""

    SOURCES = ("method",)
    tree_engine: str


@dataclass(frozen=True)
class CommunitiesParams(StageParams):
    """The chunk unit (the id column of the chunk embeddings)."""

    SOURCES = ("method",)
    chunk_unit: str
