"""What the Prefect UI shows of a run, so a person can judge it without a terminal.

- **Artifacts** (published by flow hooks, on completion and on failure, from the catalog's rows of the run):
  ``<command>-metrics-<method>-<dataset>`` (a table of the run's metrics), ``<command>-stages-<method>-<dataset>``
  (Markdown: computed or cached, rows, seconds, peak memory, LLM tokens per stage, headed by a one-line verdict
  such as "all 6 stages cached: nothing computed") and, for a benchmark, ``benchmark-latency-<method>-<dataset>``.
  A key is the same for every run of one (command, method, dataset), so the UI's artifact page shows its
  history across runs.
- **Task-run names**: ``embed[passages]``, ``ner[chunks]``, ``chunk[passages]``: the stage and what it runs
  over, instead of Prefect's ``embed-3f2``. Set here on the task objects, not in the ``@task`` decorators,
  because a stage's code identity hashes its decorated source (``tasks.core.code_identity``): renaming
  runs must not rebuild every cached stage.
- **Flow-run names**: ``evaluate zoomrag/sample-60-s0`` and tags ``method:zoomrag``, ``dataset:sample-60-s0``
  (on the flow run only: its task runs carry none, :func:`untagged_tasks`).

Publishing never fails a run: if the API refuses an artifact, one warning is logged.
"""
from __future__ import annotations

import functools
import json
import logging
import re
from typing import Any, Callable

from tasks.core.store import ArtifactRef, Store

log = logging.getLogger("dagrag")

# what a stage's input table holds, in the words of the method papers
INPUT_WORDS = {"documents": "passages"}
ROW_STAGES = {"chunk", "ner", "embed"}
STAGE_COLUMNS = ["stage", "status", "rows", "rows_computed", "seconds", "peak_rss_mb", "llm_tokens"]


def artifact_key(kind: str, method: str, dataset: str) -> str:
    """``kind-method-dataset`` as a Prefect artifact key: lowercase letters, digits and dashes only."""
    raw = f"{kind}-{method}-{dataset}".lower()
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", raw)).strip("-")


def run_label(cfg: dict[str, Any]) -> tuple[str, str]:
    """(method, dataset label) of a resolved config, as the catalog names them."""
    from tasks.data.ingest import dataset_label

    from flows.runtime.config import load_config

    conf = load_config(cfg)
    return conf.method.name, dataset_label(conf.dataset)


def task_run_name(task_name: str, parameters: dict[str, Any]) -> str:
    """``stage[what it runs over]`` for the per-row stages (``embed[passages]``, ``ner[chunks]``), which run
    once per input table; any other stage runs once per flow and keeps its own name."""
    if task_name not in ROW_STAGES:
        return task_name
    ref = next((v for v in parameters.values() if isinstance(v, ArtifactRef)), None)
    return task_name if ref is None else f"{task_name}[{INPUT_WORDS.get(ref.name, ref.name)}]"


def name_task_runs() -> int:
    """Give every stage task of the project's modules that this process has imported a readable task-run name;
    returns how many were named now. Called before each flow run, after its method's flow module is imported
    (:data:`flows.methods.METHODS` imports a method when it is first read; a flow module imports the stages it
    calls). Modules nothing imported are not imported for this."""
    import sys

    from tasks.core.stage import StageTask

    named = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name.startswith(("tasks.", "flows.")) or name == "__main__"):
            continue
        for obj in vars(module).values():
            if isinstance(obj, StageTask) and obj.task_run_name is None:
                obj.task_run_name = functools.partial(task_run_name, obj.name)
                named += 1
    return named


def stage_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The run's stage events with the LLM tokens each stage spent (prompt + completion)."""
    events = store.events(run_id)
    ledger = store.query("SELECT stage, sum(prompt_tokens + completion_tokens) AS llm_tokens FROM llm_ledger "
                         "WHERE run_id = ? GROUP BY stage", [run_id])
    tokens = dict(zip(ledger["stage"], ledger["llm_tokens"].fillna(0).astype(int)))
    rows = []
    for r in events.to_dict("records"):
        rows.append({"stage": r["stage"], "status": r["status"], "rows": int(r["rows"]),
                     "rows_computed": int(r["rows_computed"]), "seconds": round(float(r["seconds"]), 2),
                     "peak_rss_mb": round(float(r["peak_rss_mb"] or 0.0), 1),
                     "llm_tokens": int(tokens.pop(r["stage"], 0))})
    rows += [{"stage": s, "status": "llm", "rows": 0, "rows_computed": 0, "seconds": 0.0, "peak_rss_mb": 0.0,
              "llm_tokens": int(t)} for s, t in tokens.items() if t]  # query NER, generation: no stage event
    return rows


def verdict(rows: list[dict[str, Any]]) -> str:
    """One line a person reads first: were all stages cached, and how many rows were computed."""
    stages = [r for r in rows if r["status"] in {"computed", "cached"}]
    computed = [r for r in stages if r["status"] == "computed"]
    if not stages:
        return "no index stage ran"
    if not computed:
        return f"all {len(stages)} stages cached: nothing computed"
    new = sum(r["rows_computed"] for r in computed)
    return (f"{len(computed)} of {len(stages)} stages computed ({', '.join(r['stage'] for r in computed)}), "
            f"{new} rows computed")


def stage_markdown(command: str, method: str, dataset: str, rows: list[dict[str, Any]], state: str) -> str:
    """The stage table as Markdown, headed by the run's verdict."""
    head = f"### {command} {method} on {dataset}: {state}\n\n**{verdict(rows)}**\n\n"
    if not rows:
        return head
    lines = ["| " + " | ".join(STAGE_COLUMNS) + " |", "|" + "---|" * len(STAGE_COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in STAGE_COLUMNS) + " |" for r in rows]
    return head + "\n".join(lines) + "\n"


def metrics_table(metrics: dict[str, Any]) -> list[dict[str, str]]:
    """A metrics record as ``metric | value`` rows (nested values as compact JSON)."""
    out = []
    for k, v in metrics.items():
        if k in {"rows", "artifacts"}:
            continue
        if isinstance(v, float):
            v = round(v, 3)
        text = json.dumps(v, default=str) if isinstance(v, (dict, list, tuple)) else str(v)
        out.append({"metric": k, "value": text})
    return out


def publish(command: str, method: str, dataset: str, store: Store, run_id: str, flow_run_id: Any,
            state: str) -> list[str]:
    """Create the run's artifacts on its flow run; returns their keys (none if the API refused them)."""
    from prefect.artifacts import MarkdownArtifact, TableArtifact

    rows = stage_rows(store, run_id)
    record = store.query("SELECT metrics FROM metrics WHERE run_id = ? ORDER BY created_at DESC LIMIT 1", [run_id])
    metrics = json.loads(record["metrics"].iloc[0]) if len(record) else {}
    made = []
    artifacts = [(artifact_key(f"{command}-stages", method, dataset),
                  MarkdownArtifact, {"markdown": stage_markdown(command, method, dataset, rows, state)},
                  f"{command}: index stages of this run")]
    if metrics:
        artifacts.append((artifact_key(f"{command}-metrics", method, dataset), TableArtifact,
                          {"table": metrics_table(metrics)}, f"{command}: metrics of this run"))
    if metrics.get("rows"):  # benchmark: one row per batch size
        artifacts.append((artifact_key(f"{command}-latency", method, dataset), TableArtifact,
                          {"table": metrics["rows"]}, "benchmark: latency per query by batch size"))
    for key, kind, data, description in artifacts:
        try:
            kind(key=key, description=description, flow_run_id=flow_run_id, **data).create()
            made.append(key)
        except Exception as err:  # noqa: BLE001 - the UI is a view; the run's results are in the catalog
            log.warning("could not publish the Prefect artifact %s: %s", key, err)
    return made


def publish_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """A flow's on-completion / on-failure hook: publish the run's artifacts from the catalog."""
    cfg = (flow_run.parameters or {}).get("cfg")
    if not isinstance(cfg, dict) or "artifacts_dir" not in cfg:
        return
    try:
        method, dataset = run_label(cfg)
        publish(flow.name, method, dataset, Store(cfg["artifacts_dir"]), str(flow_run.id), flow_run.id,
                state.name.lower())
    except Exception as err:  # noqa: BLE001 - never turn a finished run into a failed one
        log.warning("could not publish the run's Prefect artifacts: %s", err)


def end_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """A flow's hook on every final state: the catalog's ``runs`` row says how the run ended (a run that failed
    before it recorded itself has no row, and nothing changes)."""
    cfg = (flow_run.parameters or {}).get("cfg")
    if not isinstance(cfg, dict) or "artifacts_dir" not in cfg:
        return
    try:
        Store(cfg["artifacts_dir"]).end_run(str(flow_run.id), str(state.type.value).lower())
    except Exception as err:  # noqa: BLE001 - a hook must not turn the run's own outcome into another error
        log.warning("could not record how run %s ended: %s", flow_run.id, err)


# the hooks of every flow that records a run (``flows.runtime.pipeline.start_run``), so that a run's catalog row says how it
# ended however the flow is called (a command, a compare's evaluate runs, a scheduled run, the Python API)
RUN_END_HOOKS = {"on_completion": [end_hook], "on_failure": [end_hook], "on_crashed": [end_hook],
                 "on_cancellation": [end_hook]}


def observed(flow_fn: Any, cfg: dict[str, Any]) -> Any:
    """The flow with readable run names, tags and the artifact hooks (beside its own, :data:`RUN_END_HOOKS`)."""
    method, dataset = run_label(cfg)  # loads the config, and with it the method's flow module
    name_task_runs()
    return flow_fn.with_options(flow_run_name=f"{flow_fn.name} {method}/{dataset}",  # its own hooks stay
                                on_completion=[publish_hook, *flow_fn.on_completion_hooks],
                                on_failure=[publish_hook, *flow_fn.on_failure_hooks])


def tags_for(cfg: dict[str, Any]) -> list[str]:
    """The flow run's tags: ``method:<name>``, ``dataset:<label>``."""
    method, dataset = run_label(cfg)
    return [f"method:{method}", f"dataset:{dataset}"]


def untagged_tasks(body: Callable[..., Any]) -> Callable[..., Any]:
    """A flow's body whose task runs carry no tags; the flow run keeps its own (:func:`tags_for`).

    Prefect gives a task run the tags in force where it is created, and a tagged task run first asks the API
    for slots of the tags' concurrency limits, even when there is none: about 0.1 s per stage, and 2.3 s
    before the stage that follows a long one (py-spy: ``acquire_concurrency_slots_with_lease``).
    """
    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> Any:
        from prefect.context import TagsContext

        with TagsContext(current_tags=set()):
            return body(*args, **kwargs)

    return run
