"""The method registry: ``method.name`` → its index DAG and its online retriever.

A method's flow module (``flows.<name>``) is imported the first time ``METHODS[name]`` is read, so a command does
not import the other seven's flows. ``name in METHODS`` and ``sorted(METHODS)`` import nothing. The config check
(``flows.config.LIMITS``, keyed by class path) imports only the classes it checks.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class Method:
    """A method = a params schema, an index DAG of cached stages, and a retriever over its index."""

    params: type
    index: Callable  # (ctx, data refs, cfg) -> {name: ArtifactRef}
    retriever: Callable  # (data refs, index refs, cfg) -> tasks.eval.retrieve.Retriever
    # the method's own generation, when it is not "read the top passages" (ArchRAG's adaptive filtering):
    # (client, data refs, index refs, cfg, questions, traces, dry_run) -> (predictions | None, its own figures);
    # flows.evaluate scores the predictions (tasks.eval.answer_metrics.score_predictions)
    answer: Optional[Callable] = None
    # its trace's kept_chunks are its own ranked evidence units (ZoomRAG's ChunkZoom), scored by
    # evidence_recall@k in place of the passage rule (tasks.eval.evidence)
    evidence_units: bool = False


# name -> (its params class in flows.<name>, its own generation function there or None, evidence units)
SPECS: dict[str, tuple[str, Optional[str], bool]] = {
    "dense": ("DenseParams", None, False),
    "bm25": ("BM25Params", None, False),
    "hybrid": ("HybridParams", None, False),
    "zoomrag": ("ZoomRAGParams", None, True),
    "linearrag": ("LinearParams", None, False),
    "erarag": ("EraParams", None, False),
    "serag": ("SeRAGParams", None, False),
    "archrag": ("ArchParams", "answer", False),
}


@functools.cache
def load_method(name: str) -> Method:
    """``flows.<name>`` imported and read into its :class:`Method`."""
    params, answer, evidence_units = SPECS[name]
    module: Any = importlib.import_module(f"flows.{name}")
    return Method(getattr(module, params), module.index, module.retriever,
                  getattr(module, answer) if answer else None, evidence_units)


class _Methods(Mapping):
    """Every method by name; a value is loaded on first read (:func:`load_method`)."""

    def __getitem__(self, name: str) -> Method:
        if name not in SPECS:
            raise KeyError(name)
        return load_method(name)

    def __iter__(self) -> Iterator[str]:
        return iter(SPECS)

    def __len__(self) -> int:
        return len(SPECS)


METHODS: Mapping[str, Method] = _Methods()
