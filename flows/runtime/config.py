"""Hydra config → typed, frozen params (one dataclass per config group; fields == YAML keys)."""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from omegaconf import OmegaConf

from flows.runtime.command_params import (  # noqa: F401 - the commands' groups, named here with the others
    RANKING_METRICS,
    BenchmarkParams,
    CompareParams,
    DoctorParams,
    EvalParams,
    GrowthParams,
    LoadtestParams,
    PlanParams,
    QueryParams,
    ReportParams,
    ScaleParams,
    ServeParams,
    every_method_when_null,
)
from tasks.core.config_check import ConfigError, check_values  # noqa: F401 - the checker, beside tasks.core.limits
from tasks.data.ingest import DATASET_KINDS
from tasks.core.limits import COUNT, COUNT0, one_of
from tasks.text.embed import EmbedderParams
from tasks.text.ner import NERParams


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
    from tasks.methods.archrag.params import KGParams

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
    "loadtest": _fixed(LoadtestParams, required=False),
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
