"""Hydra config → typed, frozen params (one dataclass per config group; fields == YAML keys)."""
from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Union

from omegaconf import OmegaConf

from tasks.core.ingest import DATASET_KINDS, DatasetParams
from tasks.text.embed import EmbedderParams
from tasks.text.ner import NERParams


class ConfigError(ValueError):
    """A config group does not match its schema; the message names the group and the keys."""


@dataclass(frozen=True)
class RunnerParams:
    """``runner/``: where independent stages and per-row partitions run (:mod:`flows.runners`).

    ``thread``: stages in threads, partitions in the flow process. ``dask``: stages still in the flow process
    (one catalog writer), the partitions of chunk / NER / embed / LLM extraction on Dask workers: a local
    cluster of ``n_workers`` processes, or the scheduler at ``address`` (``tcp://host:8786``).
    """

    kind: str = "thread"
    max_workers: int = 2
    partition_rows: int = 4096      # rows per partition of a per-row stage (0: one partition)
    address: str | None = None      # dask: an existing scheduler; None starts a local cluster
    n_workers: int = 2              # dask local cluster: worker processes
    threads_per_worker: int = 1     # dask local cluster: threads per worker

    def task_runner(self):  # -> flows.runners.PartitionedThreadRunner
        """The Prefect task runner for independent stages and per-row partitions."""
        from flows.runners import DaskPartitionRunner, PartitionedThreadRunner

        if self.kind == "dask":
            return DaskPartitionRunner(self.max_workers, self.partition_rows, self.address, self.n_workers,
                                       self.threads_per_worker)
        return PartitionedThreadRunner(self.max_workers, self.partition_rows)


def with_runner(flow_fn, cfg: Mapping[str, Any]):
    """The flow with the task runner chosen by ``runner/``."""
    return flow_fn.with_options(task_runner=build(RunnerParams, "runner", cfg["runner"]).task_runner())


@dataclass(frozen=True)
class EvalParams:
    """``eval/``: how questions are run and scored."""

    ks: tuple[int, ...] = (2, 5, 10)
    batch_size: int = 256
    max_questions: int | None = None
    generate: bool = True          # answer with the LLM when one is configured
    context_passages: int = 5      # top passages given to the reader (methods with evidence chunks give those)
    max_context_tokens: int = 2000
    llm_judge: bool = False        # also score answers with the LLM as judge (GPT-Acc style)
    llm_dry_run: bool = False      # only estimate the LLM calls/tokens of the index's LLM stage, else of generation
    dev_fraction: float = 0.5      # share of the questions in the seeded dev split (the rest: test)
    split_seed: int = 0            # seed of the dev/test split
    objective: str = "recall@5"    # the dev-split metric a sweep maximises (the command's return value)
    experiment: str = "paper"      # set by the experiment group (conf/experiment/): the label reports group runs by
    answer_budgets: tuple[int, ...] = (1000, 2000, 4000)  # answer_in_context@B: the reader's context packed to B tokens
    answer_depth: int = 64         # passages ranked per question, so a passage method can fill the largest budget


# every method flows.methods.METHODS runs, in the order compare, scale and growth take them
METHOD_NAMES = ("dense", "bm25", "hybrid", "zoomrag", "linearrag", "erarag", "serag", "archrag")


@dataclass(frozen=True)
class CompareParams:
    """``compare/``: the methods ``flows.compare`` evaluates, one after another, on one dataset."""

    methods: tuple[str, ...] = METHOD_NAMES


@dataclass(frozen=True)
class ScaleParams:
    """``scale/``: the corpus sizes and methods ``flows.scale`` benchmarks, and the batch sizes it times."""

    sizes: tuple[int, ...] = (1000, 10000, 100000)
    methods: tuple[str, ...] = METHOD_NAMES
    batch_sizes: tuple[int, ...] = (1, 256)
    n_questions: int = 256
    timeout_s: int = 0  # a cell's process is stopped after this many seconds (0: no limit)
    name: str = "scale"


@dataclass(frozen=True)
class GrowthParams:
    """``growth/``: what ``flows.growth`` holds out of the dataset, for which methods, and how often it updates."""

    fraction: float = 0.05  # share of the documents held out of the base corpus and added by the update
    seed: int = 17  # which documents: a seeded sample of the sorted document ids (corpus order plays no part)
    methods: tuple[str, ...] = METHOD_NAMES
    repeats: int = 3  # updates per method, each on a fresh copy of the base index; the table gives medians
    timeout_s: int = 0  # a build's or an update's process is stopped after this many seconds (0: no limit)
    name: str = "growth"  # <artifacts_dir>/growth/<name>/ (corpora, base index) and reports/<name>/growth.md


@dataclass(frozen=True)
class ReportParams:
    """``report/``: which runs ``flows.report`` reads from the catalog, and where it writes."""

    runs: tuple[str, ...] = ()     # these run ids; else the trials of ``sweep``; else the latest per method x dataset
    sweep: str | None = None       # a sweep id (``sweep_id`` of its trials' metrics)
    name: str | None = None        # artifacts/reports/<name>/ (default: the sweep id, or "latest")
    metric: str = "recall@5"       # the accuracy axis of the figures
    headline: bool = False         # also write the README's and docs/results.md's headline table (tasks.eval.headline)
    headline_datasets: tuple[str, ...] = ("hotpotqa-100", "2wiki-dev")  # its columns, with paper and beyond_paper
    headline_root: str | None = None  # the checkout holding README.md and docs/ (default: this one)


@dataclass(frozen=True)
class DoctorParams:
    """``doctor/``: what ``flows.doctor`` does besides checking."""

    repair: bool = False  # quarantine damaged files, remove dangling rows, rebuild an unreadable catalog


@dataclass(frozen=True)
class BenchmarkParams:
    """``benchmark/``: batch sizes and how many questions each batch size is timed on."""

    batch_sizes: tuple[int, ...] = (1, 4, 16, 64, 256)
    n_questions: int = 256
    questions_from: str | None = None
    repeat: int = 1
    min_batches: int = 5  # each batch size is timed on at least this many batches (passes over the questions repeat)


@dataclass(frozen=True)
class QueryParams:
    """``query/``: ``dagrag query``'s questions, output and depth (:mod:`flows.query`)."""

    text: str | None = None
    file: str | None = None
    k: int | None = None
    format: str = "text"
    answer: bool = False
    build: bool = False
    batch_size: int = 64
    snippet_chars: int = 160


@dataclass(frozen=True)
class ServeParams:
    """``serve/``: ``dagrag serve``'s address, micro-batching, limits and reloads (:mod:`flows.serve`)."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 64
    max_wait_ms: float = 5.0
    max_queue: int = 1024
    max_k: int = 100
    max_question_chars: int = 2000
    max_questions: int = 256
    max_body_bytes: int = 1048576
    watch: bool = False
    watch_s: float = 10.0
    drain_s: float = 10.0


CHUNK_UNITS = ("passage", "sentence", "window")  # tasks.text.chunk.ChunkParams.unit


@dataclass(frozen=True)
class Choices:
    """A tuple of allowed values that lives in another module (``"tasks.graph.knn:SEARCHES"``), imported
    only when a params class that names it is checked."""

    path: str

    def resolve(self) -> tuple:
        module, name = self.path.split(":")
        return tuple(getattr(importlib.import_module(module), name))


_COUNT, _COUNT0, _PROB, _POS = "[1, inf)", "[0, inf)", "[0, 1]", "(0, inf)"
_SEED = {"shuffle_seed": _COUNT0}  # numpy's default_rng takes seeds >= 0
_DATASET = {**_SEED, "max_text_chars": _COUNT}
_SEARCHES = Choices("tasks.graph.knn:SEARCHES")

# What a field allows beyond its annotated type: an interval ("[0, 1]", "(0, inf)", "[1, inf)"; a round
# bracket excludes its end; a tuple field's elements each), a tuple of choices, or Choices defined elsewhere.
# Keyed by the params class's "module:qualname", so a command imports no method it does not run (the table
# names every method's classes). Kept here rather than on the dataclasses: a stage's code identity hashes
# every class its code names, whole (tasks.core.code_identity), so metadata added there would rebuild cached
# stages. Checks that tie fields together (segment_min <= segment_avg) stay in the classes' __post_init__.
LIMITS: dict[str, dict[str, str | tuple | Choices]] = {
    "tasks.core.ingest:SampleParams": {"n_passages": "[20, inf)", "n_questions": _COUNT0, **_DATASET},  # >= 20
    "tasks.core.ingest:HippoRAGParams": _DATASET,
    "tasks.core.ingest:UserCorpusParams": {"kind": ("jsonl", "folder"), **_DATASET},
    "tasks.text.embed:EmbedderParams": {
        "batch_size": _COUNT, "max_seq_length": _COUNT, "query_batch_size": _COUNT,
        "query_runtime": Choices("tasks.text.embed:QUERY_RUNTIMES"),
        "doc_runtime": Choices("tasks.text.embed:DOC_RUNTIMES"), "precision": Choices("tasks.text.embed:PRECISIONS"),
        "int8_keep_fp32": Choices("tasks.text.onnx_encoder:INT8_KINDS"), "bf16_min_tokens": _COUNT0},
    "tasks.text.ner:NERParams": {"backend": Choices("tasks.text.ner:BACKENDS"), "batch_size": _COUNT,
                                 "n_process": _COUNT, "min_chars": _COUNT0, "max_empty_fraction": _PROB,
                                 "matmul": Choices("tasks.text.ner:MATMULS")},
    "tasks.methods.archrag.kg_stages:KGParams": {
        "builder": Choices("tasks.methods.archrag.kg:BUILDERS"), "description_tokens": _COUNT,
        "max_empty_fraction": _PROB, "describe_max_tokens": _COUNT, "extract_max_tokens": _COUNT},
    "tasks.llm.params:LLMParams": {
        "provider": Choices("tasks.llm.params:PROVIDERS"), "temperature": "[0, 2]", "max_tokens": _COUNT,
        "timeout_s": _POS, "max_retries": _COUNT0, "backoff_base_s": _COUNT0, "backoff_max_s": _COUNT0,
        "concurrency": _COUNT},
    "flows.config:RunnerParams": {"kind": ("thread", "dask"), "max_workers": _COUNT, "partition_rows": _COUNT0,
                                  "n_workers": _COUNT, "threads_per_worker": _COUNT},
    "flows.config:CompareParams": {"methods": METHOD_NAMES},
    "flows.config:ScaleParams": {"sizes": "[20, inf)", "methods": METHOD_NAMES, "batch_sizes": _COUNT,
                                 "n_questions": _COUNT, "timeout_s": _COUNT0},
    "flows.config:GrowthParams": {"fraction": "(0, 1)", "methods": METHOD_NAMES, "repeats": _COUNT,
                                  "timeout_s": _COUNT0, "seed": _COUNT0},
    "flows.config:ReportParams": {"metric": ("recall@2", "recall@5", "recall@10", "evidence_recall@2",
                                             "evidence_recall@5", "evidence_recall@10", "context_recall", "em", "f1")},
    "flows.config:EvalParams": {
        "dev_fraction": "[0, 1)", "split_seed": _COUNT0,
        "objective": ("recall@2", "recall@5", "recall@10", "evidence_recall@2", "evidence_recall@5",
                      "evidence_recall@10", "context_recall"),
        "ks": _COUNT, "batch_size": _COUNT, "max_questions": _COUNT, "context_passages": _COUNT0,
        "max_context_tokens": _COUNT, "answer_budgets": _COUNT, "answer_depth": _COUNT,
        "experiment": ("paper", "beyond_paper")},
    "flows.config:QueryParams": {"k": _COUNT, "format": ("text", "jsonl"), "batch_size": _COUNT,
                                 "snippet_chars": _COUNT0},
    "flows.config:ServeParams": {"port": "[0, 65535]", "max_batch": _COUNT, "max_wait_ms": _COUNT0, "max_queue": _COUNT,
                                 "max_k": _COUNT, "max_question_chars": _COUNT, "max_questions": _COUNT,
                                 "max_body_bytes": _COUNT, "watch_s": _POS, "drain_s": _COUNT0},
    "flows.config:BenchmarkParams": {"batch_sizes": _COUNT, "n_questions": _COUNT, "repeat": _COUNT,
                                     "min_batches": _COUNT},
    "tasks.methods.dense:DenseParams": {"top_k": _COUNT, "batch_size": _COUNT},
    "tasks.methods.bm25:BM25Params": {"k1": _COUNT0, "b": _PROB, "top_k": _COUNT, "batch_size": _COUNT},
    "tasks.methods.hybrid.retriever:HybridParams": {
        "k": _POS, "dense_depth": _COUNT, "bm25_depth": _COUNT, "dense_weight": _COUNT0, "bm25_weight": _COUNT0,
        "k1": _COUNT0, "b": _PROB, "top_k": _COUNT, "batch_size": _COUNT},
    "tasks.methods.zoomrag.algorithm:ZoomParams": {
        "alpha": _PROB, "steps": _COUNT, "beta": _PROB, "top_k_docs": _COUNT, "sigma": _POS, "omega": _PROB,
        "keep_ratio": "(0, 1]", "batch_size": _COUNT, "walk_dtype": ("float32", "float64"),
        "walk_node_order": ("locality", "stored"), "walk_sparse_max": _PROB, "chunk_iterations": _COUNT,
        "doc_doc_max_neighbors": _COUNT0, "doc_doc_stats_sample": _COUNT, "doc_doc_search": _SEARCHES,
        "doc_doc_exact_max": _COUNT, "ivf_nlist": _COUNT0, "ivf_nprobe": _COUNT, "title_edge_weight": _COUNT0,
        "title_name_weight": _COUNT0, "query_entity_weight": _COUNT0, "lowercase_name_weight": _COUNT0,
        "relation_gate_temperature": _COUNT0},
    "tasks.methods.zoomrag.stages:ZoomRAGParams": {
        "top_k": _COUNT, "chunk_unit": CHUNK_UNITS, "max_entity_words": _COUNT, "doc_block_rows": _COUNT,
        "chunk_group_size": _COUNT},
    "tasks.methods.linearrag.algorithm:LinearRAGParams": {
        "max_iterations": _COUNT, "top_k_sentence": _COUNT, "passage_ratio": _COUNT0,
        "passage_node_weight": _COUNT0, "damping": _PROB, "edge_weighting": ("share", "count", "indicator"),
        "top_k": _COUNT, "min_similarity": "[-1, 1]", "ppr_tol": _POS, "ppr_max_iter": _COUNT,
        "ppr_dtype": ("float32", "float64"), "ppr_threads": _COUNT0, "ppr_sweeps": ("power", "alternating"),
        "title_edge_weight": _COUNT0, "title_name_weight": _COUNT0, "lowercase_name_weight": _COUNT0,
        "relation_gate_temperature": _COUNT0, "passage_reset": Choices("tasks.methods.linearrag.algorithm:PASSAGE_RESETS"),
        "passage_reset_depth": _COUNT, "passage_reset_weight": _COUNT0},
    "tasks.text.gazetteer:LinkingParams": {
        "graph_linking": Choices("tasks.text.gazetteer:LINKINGS"), "query_linking": Choices("tasks.text.gazetteer:LINKINGS"),
        "gazetteer_min_chars": _COUNT, "query_lowercase_weight": _COUNT0, "cover_named_min_seed": _COUNT0},
    "tasks.methods.erarag.algorithm:EraRAGParams": {
        "n_hyperplanes": "[1, 64]", "segment_min": "[2, inf)", "segment_avg": "[2, inf)", "segment_max": "[2, inf)",
        "max_layers": _COUNT0, "stop_nodes": _COUNT, "summary_tokens": _COUNT, "top_k": _COUNT,
        "token_budget": _COUNT, "detail_proportion": _PROB,
        "update_segmenting": Choices("tasks.methods.erarag.algorithm:UPDATE_SEGMENTING")},
    "tasks.methods.erarag.stages:EraParams": {
        "window_tokens": _COUNT, "overlap_tokens": _COUNT0, "summariser": Choices("tasks.methods.erarag.stages:SUMMARISERS"),
        "extractive_rank": ("lead", "centroid"), "recall_view": Choices("tasks.methods.erarag.stages:VIEWS")},
    "tasks.methods.serag.stages:SeRAGParams": {
        "top_k": _COUNT, "lambda_sem": _PROB, "lambda_log": _PROB, "k_sem": _COUNT, "sigma_dist": _POS,
        "dist_window": _COUNT0, "max_entity_chunks": _COUNT, "gamma_c": _PROB, "gamma_f": _PROB, "k_coarse": _COUNT,
        "tau": "[-1, inf)", "entity_sim": ("embedding", "exact"), "chunk_unit": CHUNK_UNITS,
        "self_query_max_tokens": _COUNT, "batch_size": _COUNT, "knn_search": _SEARCHES, "knn_exact_max": _COUNT,
        "ivf_nlist": _COUNT0, "ivf_nprobe": _COUNT, "query_ngram_max_words": _COUNT0,
        "community_filter": Choices("tasks.methods.serag.algorithm:COMMUNITY_FILTERS"),
        "bonus_norm": Choices("tasks.methods.serag.algorithm:BONUS_NORMS"),
        "ner_input": Choices("tasks.methods.serag.stages:NER_INPUTS")},
    "tasks.methods.archrag.stages:ArchParams": {
        "top_k": _COUNT, "topk_chunk": _COUNT0, "chunk_unit": CHUNK_UNITS, "window_tokens": _COUNT, "overlap_tokens": _COUNT0,
        "k_scale": _COUNT0, "percentile": _PROB, "edge_weight": Choices("tasks.methods.archrag.algorithm:EDGE_WEIGHTS"),
        "clustering": Choices("tasks.methods.archrag.algorithm:CLUSTERINGS"), "max_cluster_size": _COUNT,
        "resolution": _POS, "min_clusters": _COUNT, "max_level": _COUNT0,
        "summariser": Choices("tasks.methods.archrag.stages:SUMMARISERS"), "knn_search": _SEARCHES,
        "knn_exact_max": _COUNT, "ivf_nlist": _COUNT0, "ivf_nprobe": _COUNT, "summary_tokens": _COUNT,
        "report_input_tokens": _COUNT, "report_max_tokens": _COUNT, "hnsw_m": _COUNT, "ef_construction": _COUNT,
        "ef_search": _COUNT, "k_per_layer": _COUNT0, "relation_scope": Choices("tasks.methods.archrag.stages:RELATION_SCOPES"),
        "max_relations": _COUNT0, "generation": Choices("tasks.methods.archrag.stages:GENERATIONS"),
        "filter_budget_tokens": _COUNT, "merge_budget_tokens": _COUNT, "filter_max_tokens": _COUNT,
        "answer_max_tokens": _COUNT},
}


def class_path(cls: type) -> str:
    """``module:qualname``, the key of :data:`LIMITS`."""
    return f"{cls.__module__}:{cls.__qualname__}"


@functools.cache
def own_limits(path: str) -> dict[str, str | tuple]:
    """The limits :data:`LIMITS` lists for one class (not its bases'), choices resolved."""
    return {k: v.resolve() if isinstance(v, Choices) else v for k, v in LIMITS.get(path, {}).items()}


def field_limits() -> dict[type, dict[str, str | tuple]]:
    """Every class of :data:`LIMITS` with its limits (imports every method: for tests and docs, not commands)."""
    out = {}
    for path in LIMITS:
        module, name = path.split(":")
        out[functools.reduce(getattr, name.split("."), importlib.import_module(module))] = own_limits(path)
    return out


def limits_of(cls: type) -> dict[str, str | tuple]:
    """The limits of ``cls``'s fields, its bases' included; imports only the modules their choices live in."""
    out: dict[str, str | tuple] = {}
    for base in reversed(cls.__mro__):
        out.update(own_limits(class_path(base)))
    return out


_INTERVAL = re.compile(r"^([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])$")


def in_interval(value: float, interval: str) -> bool:
    """``value`` lies in ``interval`` (``"[0, 1]"``, ``"(0, inf)"``, ...); NaN lies in none."""
    m = _INTERVAL.match(interval)
    if m is None:
        raise ValueError(f"not an interval: {interval!r}")
    lo, hi = float(m.group(2)), float(m.group(3))
    if math.isnan(value):
        return False
    above = value > lo if m.group(1) == "(" else value >= lo
    below = value < hi if m.group(4) == ")" else value <= hi
    return above and below


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The fields' annotations, resolved (none when one cannot be: the dataclass alone checks then)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - e.g. a name imported only under TYPE_CHECKING
        return {}


def _optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` → (X, True); anything else → (tp, False)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(tp)):
            return args[0], True
    return tp, False


def _accept(tp: Any, limit: str | tuple | None, value: Any) -> tuple[bool, Any]:
    """Whether ``value`` is a valid ``tp`` within ``limit``, and the value to use (lists become tuples,
    numbers given for a string become that string)."""
    tp, nullable = _optional(tp)
    if value is None:
        return nullable, value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return value in args, value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if not isinstance(value, (list, tuple)):  # one value for a list field: a list of one
            ok, one = _accept(args[0], limit, value)
            return ok, (one,)
        checked = [_accept(args[0], limit, v) for v in value]
        return all(ok for ok, _ in checked), tuple(v for _, v in checked)
    if tp is bool:
        return isinstance(value, bool), value
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # Hydra reads dataset.name=2021 as an int
        return isinstance(value, str) and (not isinstance(limit, tuple) or value in limit), value
    if tp in (int, float):
        numeric = (int,) if tp is int else (int, float)  # Hydra gives 1 for method.alpha=1
        ok = isinstance(value, numeric) and not isinstance(value, bool)
        return ok and (not isinstance(limit, str) or in_interval(value, limit)), value
    return True, tuple(value) if isinstance(value, list) else value  # a type not known here: the dataclass decides


def _describe(tp: Any, limit: str | tuple | None, plural: bool = False) -> str:
    """What a field allows, in words: ``a float in [0, 1]``, ``one of ['a', 'b']``, ``a list of ints``."""
    tp, nullable = _optional(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal or (isinstance(limit, tuple) and tp is str):
        text = f"one of {list(args if origin is Literal else limit)}"
    elif origin is tuple:
        text = "a list of " + _describe(args[0], limit, plural=True)
    else:
        name = {bool: "bool", int: "int", float: "float", str: "string"}.get(tp, getattr(tp, "__name__", str(tp)))
        text = (f"{name}s" if plural else ("an " if name[0] in "aeiou" else "a ") + name) + (
            " (true or false)" if tp is bool else f" in {limit}" if isinstance(limit, str) else "")
    return text + (" or null" if nullable else "")


def _show(value: Any) -> str:
    """A value as the user would type it (YAML words for None and booleans)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def check_values(cls: type, group: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor arguments of ``cls`` from a config group, checked against the fields' annotated
    types and :func:`field_limits`; every problem is named (``method.alpha='abc' is not a float in [0, 1]``)."""
    hints, limits = _hints(cls), limits_of(cls)
    kwargs, problems = {}, []
    for key, value in values.items():
        tp = hints.get(key, Any)
        ok, kwargs[key] = _accept(tp, limits.get(key), value)
        if value == "???":  # OmegaConf's mandatory value, left unset
            problems.append(f"{group}.{key} must be set: add {group}.{key}=...")
        elif not ok:
            problems.append(f"{group}.{key}={_show(value)} is not {_describe(tp, limits.get(key))}")
    if problems:
        raise ConfigError("; ".join(problems))
    return kwargs


def build(cls: type, group: str, values: Mapping[str, Any]) -> Any:
    """Instantiate a params dataclass from a config group, failing on unknown or missing keys and on
    values of the wrong type or out of range (:func:`check_values`)."""
    from tasks.llm.params import LLMConfigError

    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        from tasks.text.gazetteer import LinkingParams

        linking = {f.name for f in dataclasses.fields(LinkingParams)}
        if group == "method" and set(unknown) <= linking:  # the keys experiment=beyond_paper sets
            raise ConfigError(f"method={values.get('name', '?')} has no title-aware linking: {unknown} "
                              "apply to method=zoomrag, linearrag and serag only; drop them or pick one of those "
                              "methods")
        raise ConfigError(f"{group}: unknown key(s) {unknown}; {cls.__name__} accepts {sorted(fields)}")
    kwargs = check_values(cls, group, values)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError, LLMConfigError) as err:
        raise ConfigError(f"{group}: {err}") from None


@dataclass(frozen=True)
class Config:
    """The whole run configuration, typed."""

    dataset: DatasetParams
    method: Any
    embedder: EmbedderParams
    ner: NERParams
    kg: Any  # tasks.methods.archrag.kg_stages.KGParams (read by method=archrag only)
    llm: Any
    runner: RunnerParams
    eval: EvalParams
    benchmark: BenchmarkParams
    data_dir: str
    artifacts_dir: str
    raw: dict
    report: ReportParams = ReportParams()
    compare: CompareParams = CompareParams()
    scale: ScaleParams = ScaleParams()
    growth: GrowthParams = GrowthParams()
    query: QueryParams = QueryParams()
    serve: ServeParams = ServeParams()
    doctor: DoctorParams = DoctorParams()


ONE_METHOD_COMMANDS = frozenset({"evaluate", "index", "update", "benchmark", "query", "serve"})


def run_folder_label(command: str, method: str, dataset: str) -> str:
    """What a run folder is named after its time (``hydra.run.dir``): ``zoomrag-hotpotqa-100`` for a command that
    runs one method, ``compare-hotpotqa-100`` (``growth-…``, ``scale-…``) for one that runs several, ``report``
    and ``doctor`` for those, which run none."""
    if command in ONE_METHOD_COMMANDS:
        return f"{method}-{dataset}"
    return command if command in ("report", "doctor") else f"{command}-{dataset}"


OmegaConf.register_new_resolver("run_label", run_folder_label, replace=True)

# conf/config.yaml's keys: its groups, then its own values
TOP_LEVEL_KEYS = frozenset({"dataset", "method", "embedder", "ner", "kg", "llm", "runner", "eval", "benchmark", "report",
                            "compare", "scale", "growth", "doctor", "query", "serve", "data_dir", "artifacts_dir",
                            "verbose"})


def check_top_level_keys(keys: Iterable[str]) -> None:
    """A :class:`ConfigError` naming the keys that are not conf/config.yaml's, each with its nearest match."""
    unknown = sorted(set(keys) - TOP_LEVEL_KEYS)
    if unknown:
        hints = {k: difflib.get_close_matches(k, sorted(TOP_LEVEL_KEYS), n=1) for k in unknown}
        said = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
        raise ConfigError(f"unknown top-level key(s) {said}; the config has {sorted(TOP_LEVEL_KEYS)}")


# config groups chosen in conf/config.yaml's defaults that leave no key of their own in the composed config
# (experiment=beyond_paper is a diff over the method's keys): a command line may name them
DEFAULTS_ONLY_GROUPS = frozenset({"experiment", "experiment_method"})


def override_keys(args: Iterable[str]) -> list[str]:
    """The top-level keys a command line's overrides set (``method.alpha=0.7`` → ``method``; ``+x=1`` → ``x``),
    Hydra's own (``hydra.…``), the defaults-only groups (``experiment=…``), deletions (``~x``) and flags aside."""
    keys = (a.lstrip("+").split("=", 1)[0].split(".", 1)[0] for a in args if "=" in a and not a.startswith(("~", "-")))
    return [k for k in keys if k != "hydra" and k not in DEFAULTS_ONLY_GROUPS]


def load_config(cfg: Mapping[str, Any]) -> Config:
    """A resolved Hydra config (plain dict) → :class:`Config`."""
    from flows.methods import METHODS
    from tasks.llm.params import LLMParams
    from tasks.methods.archrag.kg_stages import KGParams

    check_top_level_keys(cfg)  # `+artifact_dir=…` passes Hydra (the `+` adds a key) but would configure nothing
    kind = cfg["dataset"].get("kind")
    if kind not in DATASET_KINDS:
        raise ConfigError(f"dataset.kind must be one of {sorted(DATASET_KINDS)}, got {kind!r}")
    name = cfg["method"].get("name")
    if name not in METHODS:
        raise ConfigError(f"method.name must be one of {sorted(METHODS)}, got {name!r}")
    if cfg["ner"].get("backend") == "llm" and cfg["llm"].get("provider") == "none":
        raise ConfigError("ner=llm extracts entities with the chat model: add llm=local llm.base_url=... "
                          "or llm=openai, or use ner=spacy")
    if name == "archrag" and cfg.get("kg", {}).get("builder") == "llm" and cfg["llm"].get("provider") == "none":
        raise ConfigError("kg=llm extracts ArchRAG's knowledge graph with the chat model: add llm=local "
                          "llm.base_url=... or llm=openai, or use kg=cooccur (LLM-free, not the paper's)")
    return Config(
        dataset=build(DATASET_KINDS[kind], "dataset", cfg["dataset"]),
        method=build(METHODS[name].params, "method", cfg["method"]),
        embedder=build(EmbedderParams, "embedder", cfg["embedder"]),
        ner=build(NERParams, "ner", cfg["ner"]),
        kg=build(KGParams, "kg", cfg.get("kg", {})),
        llm=build(LLMParams, "llm", cfg["llm"]),
        runner=build(RunnerParams, "runner", cfg["runner"]),
        eval=build(EvalParams, "eval", cfg["eval"]),
        benchmark=build(BenchmarkParams, "benchmark", cfg.get("benchmark", {})),
        data_dir=str(cfg["data_dir"]),
        artifacts_dir=str(cfg["artifacts_dir"]),
        raw=dict(cfg),
        report=build(ReportParams, "report", cfg.get("report", {})),
        compare=build(CompareParams, "compare", cfg.get("compare", {})),
        scale=build(ScaleParams, "scale", cfg.get("scale", {})),
        growth=build(GrowthParams, "growth", cfg.get("growth", {})),
        query=build(QueryParams, "query", cfg.get("query", {})),
        serve=build(ServeParams, "serve", cfg.get("serve", {})),
        doctor=build(DoctorParams, "doctor", cfg.get("doctor", {})),
    )
