"""What every command shares: a run context and manifest, the index phase of a method, and the body of a Hydra
entry point (:func:`run_command`)."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from prefect import flow

from flows.methods import METHODS
from flows.runtime.config import Config, load_config
from flows.runtime.dag import build_index as index_phase
from flows.runtime.dag import plan_run, spacy_without_torch  # noqa: F401 - re-exported
from flows.runtime.observe import RUN_END_HOOKS, untagged_tasks
from flows.runtime.output import print_last_line, write_json
from flows.runtime.provenance import git_sha, job_overrides, run_id, versions
from flows.runtime.tables import stage_counts, stage_split, stage_table
from tasks.data.ingest import dataset_identity, dataset_label
from tasks.core.memory import release_arrow_memory
from tasks.core.progress import timed
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef, Store
from tasks.llm.params import LLMDryRun

if TYPE_CHECKING:
    pass

log = logging.getLogger("dagrag")


def start_run(conf: Config, command: str) -> tuple[RunContext, dict[str, Any]]:
    """Create the run context and record the run manifest (with the job's overrides) in the catalog."""
    ctx = RunContext(str(Path(conf.artifacts_dir).resolve()), dataset_label(conf.dataset), run_id(),
                     llm_dry_run=conf.eval.llm_dry_run)
    manifest = {
        "command": command, "run_id": ctx.run_id, "git_sha": git_sha(), "dataset": ctx.dataset,
        "overrides": job_overrides(),
        "dataset_content_hash": dataset_identity(conf.dataset, conf.data_dir, ctx.run_id),
        "embedder": conf.embedder.model, "ner": conf.ner.model, "llm": conf.llm.model or conf.llm.provider,
        "seeds": {"shuffle_seed": conf.dataset.shuffle_seed, "sample_seed": getattr(conf.dataset, "seed", None)},
        "versions": versions(), "config": conf.raw,
    }
    ctx.store.record_run(ctx.run_id, command, manifest)
    return ctx, manifest


def build_index(ctx: RunContext, conf: Config) -> tuple[dict[str, ArtifactRef], dict[str, ArtifactRef], float]:
    """A command run's index phase (:func:`flows.runtime.dag.build_index`: ingest + the method's index stages →
    data refs, index refs, wall seconds), then the files ingest skipped reported (:func:`report_skipped`)."""
    data, index, seconds = index_phase(ctx, conf)
    report_skipped(data)
    return data, index, seconds


def run_folder() -> Path | None:
    """This Hydra job's output folder (its run folder), None outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None


def report_skipped(data: dict[str, ArtifactRef], folder: Path | None = None) -> list[dict[str, str]]:
    """The files ingest skipped (``dataset.on_error=skip``), each with its reason: written to
    ``skipped_files.json`` in the run folder and a Prefect markdown artifact, and returned (none: nothing)."""
    if "skipped" not in data:
        return []
    skipped = [{"source": str(s), "reason": str(r)} for s, r in Store.read(data["skipped"]).itertuples(index=False)]
    if not skipped:
        return []
    folder = folder or run_folder()
    if folder is not None:
        write_json(folder / "skipped_files.json", {"skipped": skipped})
    from prefect.artifacts import create_markdown_artifact

    rows = "\n".join(f"| {s['source']} | {s['reason']} |".replace("\n", " ") for s in skipped)
    create_markdown_artifact(key="skipped-files", description="files ingest skipped (dataset.on_error=skip)",
                             markdown=f"# {len(skipped)} skipped file(s)\n\n| file | reason |\n|---|---|\n{rows}\n")
    log.warning("%d file(s) skipped, listed in %s", len(skipped),
                folder / "skipped_files.json" if folder else "the Prefect artifact skipped-files")
    return skipped


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


def run_command(flow_fn: Any, cfg: Any, prefix: str, *args: Any,
                check: Callable[[Config], None] | None = None) -> dict[str, Any]:
    """A Hydra entry point's body: resolve and check the config, preflight (:mod:`flows.runtime.preflight`), run
    the flow with the configured task runner, print the machine-readable last line (:mod:`flows.runtime.exits` says how
    a user error ends it).

    A user error (bad config value, malformed dataset, missing questions, model or LLM endpoint) ends the
    process with one line on stderr and exit status 2. Caught before the flow starts, it leaves nothing
    behind: no Prefect server, no catalog, and Hydra's job folder is removed again.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from flows.runtime.api_server import ensure_api, flow_run_settings
    from flows.runtime.config import load_config, with_runner
    from flows.runtime.exits import USER_ERRORS, fail, fail_before_flow, interrupted, quiet_user_error_tracebacks, verbose
    from flows.runtime.preflight import preflight

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

    from flows.runtime.observe import observed, tags_for

    try:
        # run names, tags and the UI's artifacts (flows.runtime.observe); no heartbeats on a temporary server (flows.runtime.api_server)
        with tags(*tags_for(plain)), flow_run_settings():
            result = observed(with_runner(flow_fn, plain), plain)(plain, *args)
    except USER_ERRORS as err:  # found while running (e.g. the LLM endpoint went away): the run is recorded
        fail(err, verbose(cfg))
    except KeyboardInterrupt:  # Ctrl-C: Prefect has marked the run crashed; no traceback
        interrupted()
    print_last_line(prefix, result)
    return result


@flow(name="index", **RUN_END_HOOKS)
@untagged_tasks
def index_flow(cfg: dict) -> dict[str, Any]:
    """Ingest + the method's index stages."""
    conf = load_config(cfg)
    ctx, manifest = start_run(conf, "index")
    try:
        data, index, seconds = build_index(ctx, conf)
    except LLMDryRun as stop:
        return dry_run_stop(ctx, conf, stop)
    split = stage_split(ctx.store, ctx.run_id)
    print(stage_table(split), flush=True)
    summary = {"method": conf.method.name, "dataset": ctx.dataset, "n_documents": data["documents"].rows,
               "index_seconds": round(seconds, 3), **stage_counts(split),
               "artifacts": {k: v.path for k, v in index.items()}, "run_id": ctx.run_id}
    ctx.store.record_metrics(ctx.run_id, "index", conf.method.name, ctx.dataset, summary, manifest["overrides"])
    return summary
