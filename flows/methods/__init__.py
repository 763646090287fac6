"""The method registry: ``method.name`` → its :class:`Method`, the one record that declares it.

Each method's flow module (``flows.methods.<name>``) ends with ``METHOD = Method(...)``: its params class (whose fields
carry their limits, :mod:`tasks.core.limits`), its index DAG and retriever, what it needs (NER, an embedder, an
LLM), its own generation and update where it has them. Everything else that varies by method (the config check,
the preflight checks, ``dagrag update``, the method lists of compare / scale / growth) reads that record.

:data:`NAMES` is the only list of methods, in the order compare, scale and growth take them. A module is
imported the first time ``METHODS[name]`` is read, so a command imports no other method's flow; ``name in
METHODS`` and ``sorted(METHODS)`` import nothing.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

# every method, in the order compare, scale and growth take them
NAMES = ("dense", "bm25", "hybrid", "zoomrag", "linearrag", "erarag", "serag", "archrag")


def never(conf: Any) -> bool:
    """A need the method does not have (its index runs no NER, say)."""
    return False


def always(conf: Any) -> bool:
    """A need the method always has (its index runs NER, say)."""
    return True


def no_llm_uses(conf: Any, command: str) -> list[str]:
    """A method that calls the LLM for none of its own reasons (the shared ones: NER, summaries, answers)."""
    return []


@dataclass(frozen=True)
class Method:
    """A method = a params schema, an index DAG of cached stages, a retriever over its index, and its needs."""

    name: str
    params: type  # its config group's dataclass (conf/method/<name>.yaml); fields carry their limits
    index: Callable  # (ctx, data refs, cfg) -> {name: ArtifactRef}
    retriever: Callable  # (data refs, index refs, cfg) -> tasks.eval.retrieve.Retriever
    # the store its index takes per passage, for the preflight's disk warning: the 100k rows of the scale table
    # ("disk MB"), rounded up
    disk_bytes_per_passage: int
    embeds: bool = True  # its index or its queries use the embedder (bm25: neither)
    runs_ner: Callable[[Any], bool] = never  # (Config) -> whether its index runs NER over the passages
    # (Config, command) -> why this command calls the LLM for the method's own reasons (``kg=llm``), [] for none
    llm_uses: Callable[[Any, str], list[str]] = no_llm_uses
    check: Optional[Callable[[Any], None]] = None  # (Config) -> None, a ValueError for a setting it cannot run
    # the method's own generation, when it is not "read the top passages" (ArchRAG's adaptive filtering):
    # (client, data refs, index refs, cfg, questions, traces, dry_run) -> (predictions | None, its own figures);
    # flows.commands.evaluate scores the predictions (tasks.eval.answer_metrics.score_predictions)
    answer: Optional[Callable] = None
    # its trace's kept_chunks are its own ranked evidence units (ZoomRAG's ChunkZoom), scored by
    # evidence_recall@k in place of the passage rule (tasks.eval.evidence)
    evidence_units: bool = False
    update: Optional[Callable] = None  # its own update DAG (EraRAG's Alg. 3), else ``dagrag update`` reruns index
    # (store, run_id, dataset, index refs) -> what its update did, for the update's summary line and catalog row
    update_summary: Optional[Callable] = None


@functools.cache
def load_method(name: str) -> Method:
    """``flows.methods.<name>`` imported, and its :class:`Method` record."""
    module: Any = importlib.import_module(f"flows.methods.{name}")
    method = module.METHOD
    if method.name != name:
        raise RuntimeError(f"flows.methods.{name}.METHOD is named {method.name!r}")
    return method


class _Methods(Mapping):
    """Every method by name; a value is loaded on first read (:func:`load_method`)."""

    def __getitem__(self, name: str) -> Method:
        if name not in NAMES:
            raise KeyError(name)
        return load_method(name)

    def __iter__(self) -> Iterator[str]:
        return iter(NAMES)

    def __len__(self) -> int:
        return len(NAMES)


METHODS: Mapping[str, Method] = _Methods()
