"""``python -m flows.commands.schedule [--config-name schedule] [overrides]``: serve index / evaluate on cron schedules.

The schedule is Hydra config (``conf/schedule.yaml``): one entry per dataset × method, each with its command,
its cron string and its overrides of ``conf/config.yaml``. This process registers one Prefect deployment per
entry with the Prefect server named by ``PREFECT_API_URL`` (a long-lived ``prefect server start``) and runs
every flow run the server schedules, each in a fresh subprocess, until it is stopped (Ctrl-C, SIGTERM).
A deployment can also be started by hand from the UI or with ``prefect deployment run index/NAME``.

A run is the same flow ``dagrag index|evaluate`` runs, with the same task runner, run name, tags and
artifacts: on an unchanged corpus every stage is cached and the stage artifact says "all N stages cached:
nothing computed"; after the corpus grew, only the new rows of the per-document stages are computed.
Configs are composed once, when the process starts: restart it after editing ``conf/``. The dataset's files
are read when each run starts, so a grown corpus needs no restart.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from prefect import flow

# the serving process and the runs it starts (each a subprocess with Prefect's logging, not Hydra's): keep the
# console to dagrag's and Prefect's lines, as conf/config.yaml's job_logging does for a command
for _name in ("httpx", "httpx2", "httpcore", "faiss.loader"):
    logging.getLogger(_name).setLevel(logging.WARNING)

from flows.runtime.config import ConfigError, load_config, with_runner  # noqa: E402 - after the levels: faiss logs on import
from flows.commands.evaluate import evaluate_flow  # noqa: E402
from flows.runtime.pipeline import index_flow  # noqa: E402
from flows.runtime.observe import RUN_END_HOOKS, name_task_runs, observed, run_label, stage_rows, tags_for, verdict  # noqa: E402
from tasks.core.store import Store  # noqa: E402

log = logging.getLogger("dagrag")

CONF = Path(__file__).resolve().parents[2] / "conf"
COMMANDS = ("index", "evaluate", "query")


@dataclass(frozen=True)
class ScheduleEntry:
    """One scheduled build: a deployment named ``name`` running ``command`` with ``overrides`` at ``cron``."""

    name: str
    command: str
    cron: str
    overrides: tuple[str, ...] = ()
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if self.command not in COMMANDS:
            raise ConfigError(f"schedule entry {self.name!r}: command must be one of {list(COMMANDS)}, "
                              f"got {self.command!r}")
        from prefect.client.schemas.schedules import CronSchedule

        try:
            CronSchedule(cron=self.cron, timezone=self.timezone)
        except ValueError:
            raise ConfigError(f"schedule entry {self.name!r}: {self.cron!r} is not a valid cron string "
                              f"(minute hour day-of-month month day-of-week) in timezone {self.timezone!r}") from None


@dataclass(frozen=True)
class Schedule:
    """``conf/schedule.yaml``: the entries, and overrides every entry gets before its own."""

    name: str = "dagrag"
    overrides: tuple[str, ...] = ()
    entries: tuple[ScheduleEntry, ...] = field(default_factory=tuple)


def load_schedule(raw: dict[str, Any]) -> Schedule:
    """The resolved schedule config → :class:`Schedule` (unknown keys and duplicate names fail)."""
    raw = {k: v for k, v in raw.items() if k != "hydra"}
    unknown = sorted(set(raw) - {"name", "overrides", "entries"})
    if unknown:
        raise ConfigError(f"schedule: unknown key(s) {unknown}")
    entries = []
    for item in raw.get("entries") or []:
        extra = sorted(set(item) - {"name", "command", "cron", "overrides", "timezone"})
        if extra:
            raise ConfigError(f"schedule entry {item.get('name')!r}: unknown key(s) {extra}")
        entries.append(ScheduleEntry(**{**item, "overrides": tuple(item.get("overrides") or ())}))
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ConfigError(f"schedule: entry names must be unique, got {names}")
    return Schedule(raw.get("name", "dagrag"), tuple(raw.get("overrides") or ()), tuple(entries))


def compose_entry(schedule: Schedule, entry: ScheduleEntry) -> dict[str, Any]:
    """The resolved run config of one entry (``conf/config.yaml`` + the schedule's and the entry's overrides),
    checked like any command's."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = [*schedule.overrides, *entry.overrides]
    if GlobalHydra.instance().is_initialized():  # inside main(): its search path starts at conf/
        cfg = compose("config", overrides=overrides)
    else:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain["artifacts_dir"] = str(Path(plain["artifacts_dir"]).resolve())  # the runs start elsewhere
    plain["data_dir"] = str(Path(plain["data_dir"]).resolve())
    load_config(plain)
    return plain


def _checked(cfg: dict[str, Any], command: str) -> None:
    """What ``dagrag COMMAND`` checks before a run (:mod:`flows.runtime.preflight`); a failure fails the flow run."""
    from flows.runtime.preflight import preflight

    from flows.runtime.dag import plan_run

    conf = load_config(cfg)  # imports the method's flow module
    name_task_runs()  # this run's process imported the tasks afresh
    preflight(conf, command)
    log.info("%s", plan_run(conf).text())  # what its index phase will reuse and compute (dagrag plan)


def _summarise(cfg: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    rows = stage_rows(Store(cfg["artifacts_dir"]), result["run_id"])
    result = {**result, "stages": verdict(rows)}
    log.info("%s", result["stages"])
    return result


@flow(name="index", **RUN_END_HOOKS)
def scheduled_index(cfg: dict) -> dict[str, Any]:
    """``dagrag index`` as a scheduled run: checks, then the index flow's body."""
    _checked(cfg, "index")
    return _summarise(cfg, index_flow.fn(cfg))


@flow(name="evaluate", **RUN_END_HOOKS)
def scheduled_evaluate(cfg: dict) -> dict[str, Any]:
    """``dagrag evaluate`` as a scheduled run; its run folder is ``<artifacts_dir>/runs/<date>/<time>-…``."""
    _checked(cfg, "evaluate")
    method, dataset = run_label(cfg)
    run_dir = Path(cfg["artifacts_dir"]) / "runs" / datetime.now().strftime("%Y-%m-%d/%H-%M-%S") / \
        f"scheduled-{method}-{dataset}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return _summarise(cfg, evaluate_flow.fn(cfg, str(run_dir)))


@flow(name="query", **RUN_END_HOOKS)
def scheduled_query(cfg: dict) -> dict[str, Any]:
    """``dagrag query query.file=…`` as a scheduled run ("answer today's questions"): hits.parquet in its run
    folder, ``<artifacts_dir>/runs/<date>/<time>-scheduled-query-…``. The file is read when the run starts."""
    from flows.commands.query import query_flow

    if not cfg.get("query", {}).get("file"):
        raise ConfigError("a scheduled query needs query.file=PATH in its overrides")
    _checked(cfg, "query")
    from flows.serving.checks import check_serving

    check_serving(load_config(cfg), "query", [])
    method, dataset = run_label(cfg)
    run_dir = Path(cfg["artifacts_dir"]) / "runs" / datetime.now().strftime("%Y-%m-%d/%H-%M-%S") / \
        f"scheduled-query-{method}-{dataset}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return query_flow.fn(cfg, str(run_dir))


SCHEDULED = {"index": scheduled_index, "evaluate": scheduled_evaluate, "query": scheduled_query}


def planned_runs(schedule: Schedule) -> list[tuple[ScheduleEntry, dict[str, Any], Any]]:
    """(entry, its resolved config, the flow it runs) per entry: the flow carries the configured task runner,
    the run name and the artifact hooks, exactly as ``dagrag index|evaluate`` runs it."""
    out = []
    for entry in schedule.entries:
        cfg = compose_entry(schedule, entry)
        out.append((entry, cfg, observed(with_runner(SCHEDULED[entry.command], cfg), cfg)))
    return out


def serve(schedule: Schedule) -> None:
    """Register one deployment per entry (``index/<name>`` or ``evaluate/<name>``) with its cron schedule, and
    run the flow runs the server schedules until stopped, one at a time (they share the machine and the
    artifacts directory)."""
    import asyncio

    from prefect.runner import Runner
    from prefect.schedules import Cron
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise ConfigError("a schedule needs a long-lived Prefect server: start `.venv/bin/prefect server start` "
                          "and export PREFECT_API_URL=http://127.0.0.1:4200/api in this shell")
    if not schedule.entries:
        raise ConfigError("the schedule has no entries")
    from flows.runtime.dag import plan_run

    runs = planned_runs(schedule)
    # Runner.add_flow, not prefect.serve(deployments): only a flow added this way is run as the object built
    # here (task runner, hooks, run name); a deployment alone is re-imported from its module, bare
    runner = Runner(name=schedule.name, limit=1)

    async def start() -> None:
        for entry, cfg, flow_fn in runs:
            await runner.aadd_flow(flow_fn, name=entry.name, schedule=Cron(entry.cron, timezone=entry.timezone),
                                   parameters={"cfg": cfg}, tags=tags_for(cfg),
                                   description=f"dagrag {entry.command} {' '.join(entry.overrides)}")
            log.info("serving %s/%s at %r (%s): %s; its index now: %s", entry.command, entry.name, entry.cron,
                     entry.timezone, " ".join(entry.overrides), plan_run(load_config(cfg)).summary())
        await runner.start()

    try:
        asyncio.run(start())
    except BaseException as err:  # Ctrl-C reaches the runner's task group too: a group of interrupts
        if not interrupted_only(err):
            raise
        log.info("stopped")


def interrupted_only(err: BaseException) -> bool:
    """Whether ``err`` is Ctrl-C, alone or as an exception group of interrupts and the cancellations they caused."""
    import asyncio

    stops = (KeyboardInterrupt, asyncio.CancelledError)
    if isinstance(err, BaseExceptionGroup):
        return err.subgroup(lambda e: not isinstance(e, stops + (BaseExceptionGroup,))) is None
    return isinstance(err, KeyboardInterrupt)


@hydra.main(version_base="1.3", config_path="../../conf", config_name="schedule")
def main(cfg: DictConfig) -> None:
    """Hydra entry point."""
    from flows.runtime.exits import fail

    try:
        schedule = load_schedule(OmegaConf.to_container(cfg, resolve=True))
        for entry in schedule.entries:
            compose_entry(schedule, entry)  # every entry's config builds before anything is served
        serve(schedule)
    except Exception as err:  # noqa: BLE001 - Hydra's and the config's errors: one line, status 2
        fail(err, os.environ.get("HYDRA_FULL_ERROR") == "1")


if __name__ == "__main__":
    sys.exit(main())
