"""The commands' own config groups (``eval/``, ``benchmark/``, ``report/``, ``compare/``, ``scale/``, ``growth/``,
``query/``, ``plan/``, ``serve/``, ``doctor/``, ``loadtest/``): one frozen dataclass each, fields == YAML keys, limits in their
metadata (:mod:`tasks.core.limits`). :data:`flows.runtime.config.GROUPS` names them with the others."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from flows.methods import NAMES as METHOD_NAMES
from tasks.core.limits import COUNT, COUNT0, POSITIVE, one_of, within


# what a sweep may maximise and a report may plot: the ranking measures of tasks.eval.metrics at the ks reported
RANKING_METRICS = ("recall@2", "recall@5", "recall@10", "evidence_recall@2", "evidence_recall@5", "evidence_recall@10",
                   "context_recall")


@dataclass(frozen=True)
class EvalParams:
    """``eval/``: how questions are run and scored."""

    ks: tuple[int, ...] = field(default=(2, 5, 10), metadata=COUNT)
    batch_size: int = field(default=256, metadata=COUNT)
    max_questions: int | None = field(default=None, metadata=COUNT)
    generate: bool = True          # answer with the LLM when one is configured
    # top passages given to the reader (methods with evidence chunks give those)
    context_passages: int = field(default=5, metadata=COUNT0)
    max_context_tokens: int = field(default=2000, metadata=COUNT)
    llm_judge: bool = False        # also score answers with the LLM as judge (GPT-Acc style)
    llm_dry_run: bool = False      # only estimate the LLM calls/tokens of the index's LLM stage, else of generation
    # share of the questions in the seeded dev split (the rest: test)
    dev_fraction: float = field(default=0.5, metadata=within("[0, 1)"))
    split_seed: int = field(default=0, metadata=COUNT0)            # seed of the dev/test split
    # the dev-split metric a sweep maximises (the command's return value)
    objective: str = field(default="recall@5", metadata=one_of(RANKING_METRICS))
    # set by the experiment group (conf/experiment/): the label reports group runs by
    experiment: str = field(default="paper", metadata=one_of(("paper", "beyond_paper")))
    # answer_in_context@B: the reader's context packed to B tokens
    answer_budgets: tuple[int, ...] = field(default=(1000, 2000, 4000), metadata=COUNT)
    # passages ranked per question, so a passage method can fill the largest budget
    answer_depth: int = field(default=64, metadata=COUNT)


def every_method_when_null(params: Any) -> None:
    """``methods: null`` (the group's default) is every method, in :data:`flows.methods.NAMES` order."""
    if params.methods is None:
        object.__setattr__(params, "methods", METHOD_NAMES)


@dataclass(frozen=True)
class CompareParams:
    """``compare/``: the methods ``flows.commands.compare`` evaluates, one after another, on one dataset."""

    methods: tuple[str, ...] | None = field(default=None, metadata=one_of(METHOD_NAMES))  # null: all, in NAMES order

    def __post_init__(self) -> None:
        every_method_when_null(self)


@dataclass(frozen=True)
class ScaleParams:
    """``scale/``: the corpus sizes and methods ``flows.commands.scale`` benchmarks, and the batch sizes it times."""

    sizes: tuple[int, ...] = field(default=(1000, 10000, 100000), metadata=within("[20, inf)"))
    methods: tuple[str, ...] | None = field(default=None, metadata=one_of(METHOD_NAMES))  # null: all, in NAMES order
    batch_sizes: tuple[int, ...] = field(default=(1, 256), metadata=COUNT)
    n_questions: int = field(default=256, metadata=COUNT)
    # a cell's process is stopped after this many seconds (0: no limit)
    timeout_s: int = field(default=0, metadata=COUNT0)
    name: str = "scale"

    def __post_init__(self) -> None:
        every_method_when_null(self)


@dataclass(frozen=True)
class GrowthParams:
    """``growth/``: what ``flows.commands.growth`` holds out of the dataset, for which methods, and how often it updates."""

    # share of the documents held out of the base corpus and added by the update
    fraction: float = field(default=0.05, metadata=within("(0, 1)"))
    # which documents: a seeded sample of the sorted document ids (corpus order plays no part)
    seed: int = field(default=17, metadata=COUNT0)
    methods: tuple[str, ...] | None = field(default=None, metadata=one_of(METHOD_NAMES))  # null: all, in NAMES order
    # updates per method, each on a fresh copy of the base index; the table gives medians
    repeats: int = field(default=3, metadata=COUNT)
    # a build's or an update's process is stopped after this many seconds (0: no limit)
    timeout_s: int = field(default=0, metadata=COUNT0)
    name: str = "growth"  # <artifacts_dir>/growth/<name>/ (corpora, base index) and reports/<name>/growth.md

    def __post_init__(self) -> None:
        every_method_when_null(self)


@dataclass(frozen=True)
class ReportParams:
    """``report/``: which runs ``flows.commands.report`` reads from the catalog, and where it writes."""

    runs: tuple[str, ...] = ()     # these run ids; else the trials of ``sweep``; else the latest per method x dataset
    sweep: str | None = None       # a sweep id (``sweep_id`` of its trials' metrics)
    name: str | None = None        # artifacts/reports/<name>/ (default: the sweep id, or "latest")
    metric: str = field(default="recall@5", metadata=one_of((*RANKING_METRICS, "em", "f1")))  # the figures' accuracy axis
    headline: bool = False         # also write the README's and docs/results.md's headline table (tasks.eval.headline)
    headline_datasets: tuple[str, ...] = ("hotpotqa-100", "2wiki-dev")  # its columns, with paper and beyond_paper
    headline_root: str | None = None  # the checkout holding README.md and docs/ (default: this one)


@dataclass(frozen=True)
class DoctorParams:
    """``doctor/``: what ``flows.commands.doctor`` does besides checking."""

    repair: bool = False  # quarantine damaged files, remove dangling rows, rebuild an unreadable catalog


@dataclass(frozen=True)
class BenchmarkParams:
    """``benchmark/``: batch sizes and how many questions each batch size is timed on."""

    batch_sizes: tuple[int, ...] = field(default=(1, 4, 16, 64, 256), metadata=COUNT)
    n_questions: int = field(default=256, metadata=COUNT)
    questions_from: str | None = None
    repeat: int = field(default=1, metadata=COUNT)
    # each batch size is timed on at least this many batches (passes over the questions repeat)
    min_batches: int = field(default=5, metadata=COUNT)


@dataclass(frozen=True)
class QueryParams:
    """``query/``: ``dagrag query``'s questions, output and depth (:mod:`flows.commands.query`)."""

    text: str | None = None
    file: str | None = None
    k: int | None = field(default=None, metadata=COUNT)
    format: str = field(default="text", metadata=one_of(("text", "jsonl")))
    answer: bool = False
    build: bool = False
    batch_size: int = field(default=64, metadata=COUNT)
    snippet_chars: int = field(default=160, metadata=COUNT0)
    # passage: ranked passages; document: the same passages grouped by document, best document first
    group: str = field(default="passage", metadata=one_of(("passage", "document")))
    title_chars: int = field(default=100, metadata=COUNT)


@dataclass(frozen=True)
class PlanParams:
    """``plan/``: what ``dagrag plan`` shows (:mod:`flows.commands.plan`)."""

    format: str = field(default="text", metadata=one_of(("text", "json", "mermaid")))
    command: str = field(default="index", metadata=one_of(("index", "update")))  # whose stage DAG is planned


@dataclass(frozen=True)
class ServeParams:
    """``serve/``: ``dagrag serve``'s address, micro-batching, limits and reloads (:mod:`flows.commands.serve`)."""

    host: str = "127.0.0.1"
    port: int = field(default=8000, metadata=within("[0, 65535]"))
    max_batch: int = field(default=64, metadata=COUNT)
    max_wait_ms: float = field(default=5.0, metadata=COUNT0)
    max_queue: int = field(default=1024, metadata=COUNT)
    max_k: int = field(default=100, metadata=COUNT)
    max_question_chars: int = field(default=2000, metadata=COUNT)
    max_questions: int = field(default=256, metadata=COUNT)
    max_body_bytes: int = field(default=1048576, metadata=COUNT)
    watch: bool = False
    watch_s: float = field(default=10.0, metadata=POSITIVE)
    drain_s: float = field(default=10.0, metadata=COUNT0)
    mcp_transport: Literal["stdio", "http"] = "stdio"  # dagrag mcp: stdio, or streamable HTTP at host:port
    mcp_path: str = "/mcp"                                # dagrag mcp over HTTP: the endpoint's path


@dataclass(frozen=True)
class LoadtestParams:
    """``loadtest/``: what ``dagrag loadtest`` serves, how hard it pushes, and for how long
    (:mod:`flows.commands.loadtest`)."""

    # each: a setup's name, then the overrides that built its index (``"zoomrag method=zoomrag experiment=…"``)
    setups: tuple[str, ...] = ("dense method=dense", "zoomrag method=zoomrag experiment=beyond_paper",
                               "linearrag method=linearrag experiment=beyond_paper", "hybrid method=hybrid")
    concurrency: tuple[int, ...] = field(default=(1, 8, 64, 256), metadata=COUNT)
    max_batch: tuple[int, ...] = field(default=(64, 1), metadata=COUNT)
    requests: int = field(default=768, metadata=COUNT)            # at most this many requests per level
    duration_s: float = field(default=15.0, metadata=POSITIVE)    # and at most this many seconds per level
    warmup: int = field(default=32, metadata=COUNT0)              # requests sent before a server is measured
    k: int = field(default=10, metadata=COUNT)
    ceiling_batch: int = field(default=64, metadata=COUNT)        # the in-process batch the ceiling is timed at
    ceiling_repeats: int = field(default=5, metadata=COUNT)

    def __post_init__(self) -> None:
        self.setup_overrides()  # a setup without a name, or two of one name, is refused when the config loads

    def setup_overrides(self) -> dict[str, tuple[str, ...]]:
        """``{setup name: its overrides}``, in ``setups`` order."""
        out: dict[str, tuple[str, ...]] = {}
        for setup in self.setups:
            name, *overrides = setup.split()
            if not overrides or "=" in name or name in out:
                raise ValueError(f"setups entry {setup!r} must be a new name followed by the overrides "
                                 "that built its index, e.g. 'bm25 method=bm25'")
            out[name] = tuple(overrides)
        return out
