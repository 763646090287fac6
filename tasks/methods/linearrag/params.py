"""LinearRAG's params (``method=linearrag``)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from tasks.core.resources import cpu_threads
from tasks.graph.title_walk import check_title_walk
from tasks.graph.second_hop import SecondHopParams
from tasks.methods.linearrag import algorithm as lr
from tasks.text.linking import LinkingParams


@dataclass(frozen=True)
class LinearParams(lr.LinearRAGParams, LinkingParams, SecondHopParams):
    """``method=linearrag``: the retrieval settings of :class:`tasks.methods.linearrag.algorithm.LinearRAGParams`,
    a name, and the entity linking (:class:`tasks.text.linking.LinkingParams`, beyond the paper when not ``ner``).

    ``top_k`` is the authors' ``retrieval_top_k`` (passages handed to a reader); ``search(k)``
    returns k passages, and evaluate asks for max(eval.ks, top_k), so recall@10 sees 10.
    """

    name: str = "linearrag"
    relation_gate_masked: bool = False  # beyond the paper: the gate (if on) reads question and sentence without names

    def __post_init__(self) -> None:
        LinkingParams.__post_init__(self)
        SecondHopParams.__post_init__(self)
        if self.second_hop and self.graph_linking != "gazetteer":
            raise ValueError("method.second_hop_weight > 0 follows title links: it needs method.graph_linking=gazetteer "
                             "(e.g. experiment=beyond_paper)")
        check_title_walk(self.title_walk, self.graph_linking == "gazetteer", "method.graph_linking=gazetteer",
                         self.relation_gate_temperature, self.ppr_sweeps == "alternating", "method.ppr_sweeps=alternating")

    def retrieval(self) -> lr.LinearRAGParams:
        """The settings :mod:`tasks.methods.linearrag.algorithm` takes."""
        names = {f.name for f in fields(lr.LinearRAGParams)}
        algo = lr.LinearRAGParams(**{f.name: getattr(self, f.name) for f in fields(self) if f.name in names})
        return replace(algo, ppr_threads=algo.ppr_threads or cpu_threads())  # 0: one block of queries per CPU
