"""Hydra config → typed, frozen params (one dataclass per config group; fields == YAML keys)."""
from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping, Union

from omegaconf import OmegaConf

from flows.methods import NAMES as METHOD_NAMES
from tasks.core.ingest import DATASET_KINDS
from tasks.core.limits import COUNT, COUNT0, POSITIVE, in_interval, limits_of, one_of, within
from tasks.text.embed import EmbedderParams
from tasks.text.ner import NERParams


class ConfigError(ValueError):
    """A config group does not match its schema; the message names the group and the keys."""


@dataclass(frozen=True)
class RunnerParams:
    """``runner/``: where independent stages and per-row partitions run (:mod:`flows.runtime.runners`).

    ``thread``: stages in threads, partitions in the flow process. ``dask``: stages still in the flow process
    (one catalog writer), the partitions of chunk / NER / embed / LLM extraction on Dask workers: a local
    cluster of ``n_workers`` processes, or the scheduler at ``address`` (``tcp://host:8786``).
    """

    kind: str = field(default="thread", metadata=one_of(("thread", "dask")))
    max_workers: int = field(default=2, metadata=COUNT)
    # rows per partition of a per-row stage (0: one partition)
    partition_rows: int = field(default=4096, metadata=COUNT0)
    address: str | None = None      # dask: an existing scheduler; None starts a local cluster
    n_workers: int = field(default=2, metadata=COUNT)              # dask local cluster: worker processes
    threads_per_worker: int = field(default=1, metadata=COUNT)     # dask local cluster: threads per worker

    def task_runner(self):  # -> flows.runtime.runners.PartitionedThreadRunner
        """The Prefect task runner for independent stages and per-row partitions."""
        from flows.runtime.runners import DaskPartitionRunner, PartitionedThreadRunner

        if self.kind == "dask":
            return DaskPartitionRunner(self.max_workers, self.partition_rows, self.address, self.n_workers,
                                       self.threads_per_worker)
        return PartitionedThreadRunner(self.max_workers, self.partition_rows)


def with_runner(flow_fn, cfg: Mapping[str, Any]):
    """The flow with the task runner chosen by ``runner/``."""
    return flow_fn.with_options(task_runner=build(RunnerParams, "runner", cfg["runner"]).task_runner())


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
    types and their limits (field metadata, :mod:`tasks.core.limits`); every problem is named (``method.alpha='abc' is not a float in [0, 1]``)."""
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
        from tasks.text.linking import LinkingParams

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
class Group:
    """A config group of ``conf/config.yaml``: which params class its values build, and every class it may build."""

    choose: Callable[[Mapping[str, Any]], type]   # the group's values -> its params class
    classes: Callable[[], tuple[type, ...]]       # every class it may build (for tests and docs)
    required: bool = True                         # a composed config must hold it (else: the class's defaults)


def _fixed(cls: type, required: bool = True) -> Group:
    return Group(lambda values: cls, lambda: (cls,), required)


def _dataset(values: Mapping[str, Any]) -> type:
    kind = values.get("kind")
    if kind not in DATASET_KINDS:
        raise ConfigError(f"dataset.kind must be one of {sorted(DATASET_KINDS)}, got {kind!r}")
    return DATASET_KINDS[kind]


def _method(values: Mapping[str, Any]) -> type:
    from flows.methods import METHODS

    name = values.get("name")
    if name not in METHODS:
        raise ConfigError(f"method.name must be one of {sorted(METHODS)}, got {name!r}")
    return METHODS[name].params


def _all_methods() -> tuple[type, ...]:
    from flows.methods import METHODS

    return tuple(METHODS[n].params for n in METHODS)


def _kg() -> type:
    from tasks.methods.archrag.kg_stages import KGParams

    return KGParams


def _llm() -> type:
    from tasks.llm.params import LLMParams

    return LLMParams


# conf/config.yaml's groups, in its order: the one list of them; Config, TOP_LEVEL_KEYS, params_classes and
# load_config are derived from it
GROUPS: dict[str, Group] = {
    "dataset": Group(_dataset, lambda: tuple(DATASET_KINDS.values())),
    "method": Group(_method, _all_methods),
    "embedder": _fixed(EmbedderParams),
    "ner": _fixed(NERParams),
    "kg": Group(lambda values: _kg(), lambda: (_kg(),), required=False),  # read by method=archrag only
    "llm": Group(lambda values: _llm(), lambda: (_llm(),)),
    "runner": _fixed(RunnerParams),
    "eval": _fixed(EvalParams),
    "benchmark": _fixed(BenchmarkParams, required=False),
    "report": _fixed(ReportParams, required=False),
    "compare": _fixed(CompareParams, required=False),
    "scale": _fixed(ScaleParams, required=False),
    "growth": _fixed(GrowthParams, required=False),
    "query": _fixed(QueryParams, required=False),
    "serve": _fixed(ServeParams, required=False),
    "doctor": _fixed(DoctorParams, required=False),
    "plan": _fixed(PlanParams, required=False),
}
SCALARS = ("data_dir", "artifacts_dir", "verbose")  # conf/config.yaml's own values (verbose: read before loading)

# The whole run configuration, typed: one field per group (its params), the two folders, and the raw dict.
Config = dataclasses.make_dataclass(
    "Config", [(g, Any) for g in GROUPS] + [("data_dir", str), ("artifacts_dir", str), ("raw", dict)],
    frozen=True)
Config.__module__ = __name__  # pickled by name, as a class written here would be
Config.__doc__ = "The whole run configuration, typed: one field per config group (:data:`GROUPS`)."


ONE_METHOD_COMMANDS = frozenset({"evaluate", "index", "update", "benchmark", "query", "serve", "plan"})


def run_folder_label(command: str, method: str, dataset: str) -> str:
    """What a run folder is named after its time (``hydra.run.dir``): ``zoomrag-hotpotqa-100`` for a command that
    runs one method, ``compare-hotpotqa-100`` (``growth-…``, ``scale-…``) for one that runs several, ``report``
    and ``doctor`` for those, which run none."""
    if command in ONE_METHOD_COMMANDS:
        return f"{method}-{dataset}"
    return command if command in ("report", "doctor") else f"{command}-{dataset}"


OmegaConf.register_new_resolver("run_label", run_folder_label, replace=True)

# conf/config.yaml's keys: its groups, then its own values
TOP_LEVEL_KEYS = frozenset(GROUPS) | frozenset(SCALARS)


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


def params_classes() -> dict[str, tuple[type, ...]]:
    """Every params class a config group builds, by group (imports every method: for tests and docs, not commands)."""
    return {group: spec.classes() for group, spec in GROUPS.items()}


def load_config(cfg: Mapping[str, Any]) -> Config:
    """A resolved Hydra config (plain dict) → :class:`Config`, one :data:`GROUPS` entry at a time."""
    from flows.methods import METHODS

    check_top_level_keys(cfg)  # `+artifact_dir=…` passes Hydra (the `+` adds a key) but would configure nothing
    for group, spec in GROUPS.items():
        if spec.required and group not in cfg:
            raise ConfigError(f"the config has no {group!r} group: compose it from conf/ (conf/config.yaml)")
    _dataset(cfg["dataset"]), _method(cfg["method"])  # the kind and the method named first, before any value
    if cfg["ner"].get("backend") == "llm" and cfg["llm"].get("provider") == "none":
        raise ConfigError("ner=llm extracts entities with the chat model: add llm=local llm.base_url=... "
                          "or llm=openai, or use ner=spacy")
    groups = {group: build(spec.choose(cfg.get(group) or {}), group, cfg.get(group) or {})
              for group, spec in GROUPS.items()}
    conf = Config(**groups, data_dir=str(cfg["data_dir"]), artifacts_dir=str(cfg["artifacts_dir"]), raw=dict(cfg))
    name = cfg["method"]["name"]
    method = METHODS[name]
    if method.check is not None:
        try:
            method.check(conf)  # a setting this method cannot run with (ArchRAG's kg=llm without an LLM)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    return conf
