"""LinearRAG stages (entity texts for the embed stage) and the online retriever.

The algorithms live in :mod:`tasks.methods.linearrag.algorithm` (pure numpy/scipy); this module stores and loads
their inputs. The Tri-Graph's matrices are the shared entity layer's incidence tables
(:func:`tasks.text.entities.entity_graph` over sentence chunks): ``doc_entity`` is the contain
matrix C (mention counts N_{e,p}), ``chunk_entity`` the mention matrix M (binarised on load).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from tasks.core.resources import cpu_threads
from tasks.methods.linearrag import algorithm as lr
from tasks.text.gazetteer import LinkingParams


@dataclass(frozen=True)
class LinearParams(lr.LinearRAGParams, LinkingParams):
    """``method=linearrag``: the retrieval settings of :class:`tasks.methods.linearrag.algorithm.LinearRAGParams`,
    a name, and the entity linking (:class:`tasks.text.gazetteer.LinkingParams`, beyond the paper when not ``ner``).

    ``top_k`` is the authors' ``retrieval_top_k`` (passages handed to a reader); ``search(k)``
    returns k passages, and evaluate asks for max(eval.ks, top_k), so recall@10 sees 10.
    """

    name: str = "linearrag"
    relation_gate_masked: bool = False  # beyond the paper: the gate (if on) reads question and sentence without names

    def __post_init__(self) -> None:
        lr.LinearRAGParams.__post_init__(self)
        LinkingParams.__post_init__(self)
        if self.title_walk and self.graph_linking != "gazetteer":
            raise ValueError("method.title_edge_weight / title_name_weight / idf_edges / lowercase_name_weight "
                             "(the title walk) need method.graph_linking=gazetteer: with spaCy entities a passage's title is no node")
        if self.relation_gate_temperature > 0 and (not self.title_walk or self.ppr_sweeps != "alternating"):
            raise ValueError("method.relation_gate_temperature > 0 gates the title walk's edges: it needs the title "
                             "walk (e.g. experiment=beyond_paper) and method.ppr_sweeps=alternating")

    def retrieval(self) -> lr.LinearRAGParams:
        """The slice :mod:`tasks.methods.linearrag.algorithm` takes."""
        names = {f.name for f in fields(lr.LinearRAGParams)}
        algo = lr.LinearRAGParams(**{f.name: getattr(self, f.name) for f in fields(self) if f.name in names})
        return replace(algo, ppr_threads=algo.ppr_threads or cpu_threads())  # 0: one block of queries per CPU
