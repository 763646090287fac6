"""Hydra config → typed, frozen params (one dataclass per config group; fields == YAML keys)."""
from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Union

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


@dataclass(frozen=True)
class BenchmarkParams:
    """``benchmark/``: batch sizes and how many questions each batch size is timed on."""

    batch_sizes: tuple[int, ...] = (1, 4, 16, 64, 256)
    n_questions: int = 256
    questions_from: str | None = None
    repeat: int = 1
    min_batches: int = 5  # each batch size is timed on at least this many batches (passes over the questions repeat)


CHUNK_UNITS = ("passage", "sentence", "window")  # tasks.text.chunk.ChunkParams.unit


@functools.cache
def field_limits() -> dict[type, dict[str, str | tuple]]:
    """What a field allows beyond its annotated type: an interval (``"[0, 1]"``, ``"(0, inf)"``,
    ``"[1, inf)"``; a round bracket excludes its end; a tuple field's elements each) or a tuple of choices.

    Keyed by params class; a subclass inherits its bases' limits. Kept here rather than on the
    dataclasses: a stage's code identity hashes every class its code names, whole
    (``tasks.core.code_identity``), so metadata added there would rebuild cached stages. Checks
    that tie fields together (``segment_min <= segment_avg``) stay in the classes' ``__post_init__``.
    """
    from tasks.core.ingest import HippoRAGParams, SampleParams, UserCorpusParams
    from tasks.graph.knn import SEARCHES
    from tasks.llm.params import PROVIDERS, LLMParams
    from tasks.methods.archrag import algorithm as arch_alg
    from tasks.methods.archrag import kg as arch_kg
    from tasks.methods.archrag import stages as arch
    from tasks.methods.archrag.kg_stages import KGParams
    from tasks.methods.bm25 import BM25Params
    from tasks.methods.dense import DenseParams
    from tasks.methods.erarag import stages as era
    from tasks.methods.hybrid.retriever import HybridParams
    from tasks.methods.erarag.algorithm import UPDATE_SEGMENTING, EraRAGParams
    from tasks.methods.linearrag.algorithm import PASSAGE_RESETS, LinearRAGParams
    from tasks.methods.serag.stages import SeRAGParams
    from tasks.methods.zoomrag.algorithm import ZoomParams
    from tasks.methods.zoomrag.stages import ZoomRAGParams
    from tasks.text.embed import DOC_RUNTIMES, PRECISIONS, QUERY_RUNTIMES
    from tasks.text.onnx_encoder import INT8_KINDS
    from tasks.text.gazetteer import LINKINGS, LinkingParams
    from tasks.text.ner import BACKENDS

    count, count0, prob, pos = "[1, inf)", "[0, inf)", "[0, 1]", "(0, inf)"
    seed = {"shuffle_seed": count0}  # numpy's default_rng takes seeds >= 0
    return {
        SampleParams: {"n_passages": "[20, inf)", "n_questions": count0, **seed},  # tasks.core.sample: >= 20
        HippoRAGParams: seed,
        UserCorpusParams: {"kind": ("jsonl", "folder"), **seed},
        EmbedderParams: {"batch_size": count, "max_seq_length": count, "query_batch_size": count,
                         "query_runtime": QUERY_RUNTIMES, "doc_runtime": DOC_RUNTIMES, "precision": PRECISIONS,
                         "int8_keep_fp32": tuple(INT8_KINDS), "bf16_min_tokens": count0},
        NERParams: {"backend": BACKENDS, "batch_size": count, "n_process": count, "min_chars": count0,
                    "max_empty_fraction": prob},
        KGParams: {"builder": arch_kg.BUILDERS, "description_tokens": count, "max_empty_fraction": prob,
                   "describe_max_tokens": count, "extract_max_tokens": count},
        LLMParams: {"provider": PROVIDERS, "temperature": "[0, 2]", "max_tokens": count, "timeout_s": pos,
                    "max_retries": count0, "backoff_base_s": count0, "backoff_max_s": count0, "concurrency": count},
        RunnerParams: {"kind": ("thread", "dask"), "max_workers": count, "partition_rows": count0,
                       "n_workers": count, "threads_per_worker": count},
        CompareParams: {"methods": METHOD_NAMES},
        ScaleParams: {"sizes": "[20, inf)", "methods": METHOD_NAMES,
                      "batch_sizes": count, "n_questions": count, "timeout_s": count0},
        GrowthParams: {"fraction": "(0, 1)", "methods": METHOD_NAMES,
                       "repeats": count, "timeout_s": count0, "seed": count0},
        ReportParams: {"metric": ("recall@2", "recall@5", "recall@10", "evidence_recall@2", "evidence_recall@5",
                                  "evidence_recall@10", "context_recall", "em", "f1")},
        EvalParams: {"dev_fraction": "[0, 1)", "split_seed": count0, "objective": (
                         "recall@2", "recall@5", "recall@10", "evidence_recall@2", "evidence_recall@5",
                         "evidence_recall@10", "context_recall"),
                     "ks": count, "batch_size": count, "max_questions": count, "context_passages": count0,
                     "max_context_tokens": count},
        BenchmarkParams: {"batch_sizes": count, "n_questions": count, "repeat": count, "min_batches": count},
        DenseParams: {"top_k": count, "batch_size": count},
        BM25Params: {"k1": count0, "b": prob, "top_k": count, "batch_size": count},
        HybridParams: {"k": pos, "dense_depth": count, "bm25_depth": count, "dense_weight": count0,
                       "bm25_weight": count0, "k1": count0, "b": prob, "top_k": count, "batch_size": count},
        ZoomParams: {"alpha": prob, "steps": count, "beta": prob, "top_k_docs": count, "sigma": pos,
                     "omega": prob, "keep_ratio": "(0, 1]", "batch_size": count,
                     "walk_dtype": ("float32", "float64"), "walk_node_order": ("locality", "stored"), "walk_sparse_max": prob,
                     "chunk_iterations": count,
                     "doc_doc_max_neighbors": count0, "doc_doc_stats_sample": count,
                     "doc_doc_search": SEARCHES, "doc_doc_exact_max": count, "ivf_nlist": count0, "ivf_nprobe": count,
                     "title_edge_weight": count0, "title_name_weight": count0, "query_entity_weight": count0,
                     "lowercase_name_weight": count0,
                     "relation_gate_temperature": count0},
        ZoomRAGParams: {"top_k": count, "chunk_unit": CHUNK_UNITS, "max_entity_words": count,
                        "doc_block_rows": count, "chunk_group_size": count},
        LinearRAGParams: {"max_iterations": count, "top_k_sentence": count, "passage_ratio": count0,
                          "passage_node_weight": count0, "damping": prob,
                          "edge_weighting": ("share", "count", "indicator"), "top_k": count,
                          "min_similarity": "[-1, 1]", "ppr_tol": pos, "ppr_max_iter": count,
                          "ppr_dtype": ("float32", "float64"), "ppr_threads": count0,
                          "ppr_sweeps": ("power", "alternating"), "title_edge_weight": count0,
                          "title_name_weight": count0, "lowercase_name_weight": count0, "relation_gate_temperature": count0,
                          "passage_reset": PASSAGE_RESETS,
                          "passage_reset_depth": count, "passage_reset_weight": count0},
        LinkingParams: {"graph_linking": LINKINGS, "query_linking": LINKINGS, "gazetteer_min_chars": count,
                        "query_lowercase_weight": count0, "cover_named_min_seed": count0},
        EraRAGParams: {"n_hyperplanes": "[1, 64]", "segment_min": "[2, inf)", "segment_avg": "[2, inf)",
                       "segment_max": "[2, inf)", "max_layers": count0, "stop_nodes": count,
                       "summary_tokens": count, "top_k": count, "token_budget": count, "detail_proportion": prob,
                       "update_segmenting": UPDATE_SEGMENTING},
        era.EraParams: {"window_tokens": count, "overlap_tokens": count0,
                        "summariser": era.SUMMARISERS, "extractive_rank": ("lead", "centroid"),
                        "recall_view": era.VIEWS},
        SeRAGParams: {"top_k": count, "lambda_sem": prob, "lambda_log": prob, "k_sem": count, "sigma_dist": pos,
                      "dist_window": count0, "max_entity_chunks": count, "gamma_c": prob, "gamma_f": prob,
                      "k_coarse": count, "tau": "[-1, inf)", "entity_sim": ("embedding", "exact"),
                      "chunk_unit": CHUNK_UNITS, "self_query_max_tokens": count, "batch_size": count,
                      "knn_search": SEARCHES, "knn_exact_max": count, "ivf_nlist": count0, "ivf_nprobe": count},
        arch.ArchParams: {
            "top_k": count, "chunk_unit": CHUNK_UNITS, "window_tokens": count, "overlap_tokens": count0,
            "k_scale": count0, "percentile": prob, "edge_weight": arch_alg.EDGE_WEIGHTS,
            "clustering": arch_alg.CLUSTERINGS, "max_cluster_size": count, "resolution": pos,
            "min_clusters": count, "max_level": count0, "summariser": arch.SUMMARISERS,
            "knn_search": SEARCHES, "knn_exact_max": count, "ivf_nlist": count0, "ivf_nprobe": count,
            "summary_tokens": count, "report_input_tokens": count, "report_max_tokens": count, "hnsw_m": count,
            "ef_construction": count, "ef_search": count, "k_per_layer": count0,
            "relation_scope": arch.RELATION_SCOPES, "max_relations": count0,
            "generation": arch.GENERATIONS, "filter_budget_tokens": count,
            "merge_budget_tokens": count, "filter_max_tokens": count, "answer_max_tokens": count},
    }


def limits_of(cls: type) -> dict[str, str | tuple]:
    """The limits of ``cls``'s fields, its bases' included."""
    table = field_limits()
    out: dict[str, str | tuple] = {}
    for base in reversed(cls.__mro__):
        out.update(table.get(base, {}))
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
            raise ConfigError(f"method={values.get('name', '?')} has no title-aware linking: {unknown} (set by "
                              "experiment=beyond_paper) apply to method=zoomrag, linearrag and serag only; "
                              "drop experiment=beyond_paper or pick one of those methods")
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


def load_config(cfg: Mapping[str, Any]) -> Config:
    """A resolved Hydra config (plain dict) → :class:`Config`."""
    from flows.methods import METHODS
    from tasks.llm.params import LLMParams
    from tasks.methods.archrag.kg_stages import KGParams

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
    )
