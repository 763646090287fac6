"""Hydra config → typed, frozen params (one dataclass per config group; fields == YAML keys)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from tasks.core.ingest import DATASET_KINDS, DatasetParams
from tasks.text.embed import EmbedderParams
from tasks.text.ner import NERParams


class ConfigError(ValueError):
    """A config group does not match its schema; the message names the group and the keys."""


@dataclass(frozen=True)
class RunnerParams:
    """``runner/``: Prefect task runner for independent stages (threads: 2 cores, no process pools)."""

    kind: str = "thread"
    max_workers: int = 2

    def __post_init__(self) -> None:
        if self.kind != "thread":
            raise ConfigError(f"runner.kind must be 'thread' (process/Dask runners start one Prefect server "
                              f"per worker and give no speed-up on 2 cores), got {self.kind!r}")

    def task_runner(self):  # -> prefect.task_runners.ThreadPoolTaskRunner
        """The Prefect task runner for independent stages."""
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=self.max_workers)


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


@dataclass(frozen=True)
class BenchmarkParams:
    """``benchmark/``: batch sizes and how many questions each batch size is timed on."""

    batch_sizes: tuple[int, ...] = (1, 4, 16, 64, 256)
    n_questions: int = 256
    questions_from: str | None = None
    repeat: int = 1


def build(cls: type, group: str, values: Mapping[str, Any]) -> Any:
    """Instantiate a params dataclass from a config group, failing on unknown or missing keys."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(f"{group}: unknown key(s) {unknown}; {cls.__name__} accepts {sorted(fields)}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    try:
        return cls(**kwargs)
    except TypeError as err:
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
    )
