"""ZoomRAG's params: the method's (``method=zoomrag``) and its own stages' (:mod:`tasks.methods.zoomrag.stages`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from tasks.core.resources import cpu_threads
from tasks.core.stage import StageParams, run_setting
from tasks.graph.title_walk import check_title_walk
from tasks.methods.zoomrag import algorithm as zoom
from tasks.text.chunk import CHUNK_UNITS
from tasks.text.linking import LinkingParams
from tasks.core.limits import COUNT, COUNT0, PROB, one_of


@dataclass(frozen=True)
class ZoomRAGParams(zoom.ZoomParams, LinkingParams):
    """``method=zoomrag``: the paper's walk settings, how documents are cut into chunks, and the
    entity linking (:class:`tasks.text.linking.LinkingParams`, beyond the paper when not ``ner``)."""

    name: str = "zoomrag"
    top_k: int = field(default=10, metadata=COUNT)
    # §3.2: chunks are sentence-level units, ordered within their document
    chunk_unit: str = field(default="sentence", metadata=one_of(CHUNK_UNITS))
    # chunk_unit=window only: whitespace tokens a window, shared with the next (docs/methods/zoomrag.md, long documents)
    window_tokens: int = field(default=160, metadata=COUNT)
    overlap_tokens: int = field(default=24, metadata=COUNT0)
    max_entity_words: int = field(default=6, metadata=COUNT)
    doc_block_rows: int = field(default=1024, metadata=COUNT)
    # ChunkZoom local problems solved together (similar sizes grouped)
    chunk_group_size: int = field(default=32, metadata=COUNT)
    # beyond the paper (#58, #59): a query's local graph holds at most this many nodes (chunks + entities); above,
    # the chunks the local walk's first step reaches most are kept (zoom.bound_local_chunks)
    chunk_local_max_nodes: int = field(default=1024, metadata=COUNT)
    # beyond the paper: a ChunkZoom batch holds at most this many padded cells (queries x nodes²; ~35 bytes each)
    chunk_zoom_max_cells: int = field(default=8_000_000, metadata=COUNT)
    relation_gate_masked: bool = False  # beyond the paper: the gate (if on) reads question and sentence without names
    # beyond the paper (#58): where documents are cut into several passages (dataset.split), DocZoom walks with
    # split_alpha / split_steps (App. C: the paper's restart and T) in place of alpha / steps; false: alpha / steps
    split_walk: bool = False
    split_alpha: float = field(default=0.8, metadata=PROB)
    split_steps: int = field(default=5, metadata=COUNT)

    def __post_init__(self) -> None:
        LinkingParams.__post_init__(self)
        check_title_walk(self.title_walk, self.graph_linking == self.query_linking == "gazetteer",
                         "method.graph_linking=gazetteer and method.query_linking=gazetteer",
                         self.relation_gate_temperature, not self.coupled, "the decoupled walk (method.coupled=false)")

    def walk(self, split: bool = False) -> zoom.ZoomParams:
        """The settings :mod:`tasks.methods.zoomrag.algorithm` takes; ``split``: on a corpus whose documents are cut
        into several passages, where ``split_walk`` gives DocZoom ``split_alpha`` and ``split_steps``."""
        fields = zoom.ZoomParams.__dataclass_fields__
        walk = zoom.ZoomParams(**{k: v for k, v in asdict(self).items() if k in fields})
        if split and self.split_walk:
            walk = replace(walk, alpha=self.split_alpha, steps=self.split_steps)
        return replace(walk, walk_threads=walk.walk_threads or cpu_threads())  # 0: one batch of queries per CPU


@dataclass(frozen=True)
class DocDocParams(StageParams):
    """The doc-doc block A_doc→doc (eq. 2): the paper's row rule and the per-row cap beyond it."""

    SOURCES = ("method",)
    k_std: float
    doc_doc_max_neighbors: int
    doc_doc_stats_sample: int
    doc_doc_search: str
    doc_doc_exact_max: int
    ivf_nlist: int
    ivf_nprobe: int
    doc_block_rows: int = run_setting()

    def unused(self) -> frozenset[str]:
        """What :func:`tasks.methods.zoomrag.algorithm.doc_doc_block` never reads with these values: the paper's rule
        (no cap, eq. 2) reads none of the cap's search settings; an exact search reads no inverted-file setting."""
        if self.doc_doc_max_neighbors == 0:
            return frozenset({"doc_doc_stats_sample", "doc_doc_search", "doc_doc_exact_max", "ivf_nlist", "ivf_nprobe"})
        if self.doc_doc_search == "exact":
            return frozenset({"doc_doc_exact_max", "ivf_nlist", "ivf_nprobe"})
        return frozenset({"doc_doc_exact_max"}) if self.doc_doc_search == "ivf" else frozenset()


@dataclass(frozen=True)
class GlobalBlockParams(StageParams):
    """Which blocks the shared matrix M holds, and how they are rescaled (§3.2)."""

    SOURCES = ("method",)
    use_entities: bool
    use_doc_doc: bool
    rescale: str
