"""``python -m flows.commands.compare [compare.methods=[…]] [overrides]``: every method on one dataset, then the report.

One command: each method in ``compare.methods`` is evaluated in turn (its own ``evaluate`` flow run, so the
catalog keeps one run id per method), all sharing one ``artifacts_dir``, so a stage two methods share (ingest,
passage embeddings, sentence chunks, NER) is computed by the first and found cached by the others. Then
``flows.commands.report`` writes ``artifacts/reports/compare-<dataset>/report.md`` over exactly these runs. The other
overrides apply to every method (``method.*`` ones are refused: they belong to one method). Every config is
checked before the first method starts. The last line printed is ``compare: {json}``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from prefect import flow

from flows.runtime.config import ConfigError, load_config, with_runner
from flows.commands.evaluate import evaluate_flow
from flows.commands.report import report_flow, slug
from tasks.data.ingest import dataset_label


@flow(name="compare")
def compare_flow(configs: dict[str, dict], run_root: str, report_cfg: dict) -> dict[str, Any]:
    """Evaluate each method (one ``evaluate`` flow run each, shared stages cached), then report those runs."""
    results = {}
    for method, cfg in configs.items():
        results[method] = with_runner(evaluate_flow, cfg)(cfg, str(Path(run_root) / method))
    run_ids = [r["run_id"] for r in results.values() if "run_id" in r and "recall@5" in r]
    report = report_flow({**report_cfg, "report": {**report_cfg["report"], "runs": run_ids}})
    keys = ["recall@2", "recall@5", "recall@10", "evidence_recall@5", "context_recall", "stages_computed"]
    return {"report": report["report"], "runs": run_ids,
            "methods": {m: {k: r.get(k) for k in keys} for m, r in results.items()}}


def method_configs(methods: list[str], overrides: list[str]) -> dict[str, dict]:
    """Each method's resolved config: this command's overrides, with ``method=<name>``."""
    from hydra import compose

    if any(o.split("=", 1)[0].lstrip("+~").startswith("method") for o in overrides):
        raise ConfigError("flows.commands.compare runs every method with its own defaults: drop the method overrides "
                          f"({[o for o in overrides if o.lstrip('+~').startswith('method')]}), or use evaluate")
    return {m: OmegaConf.to_container(compose("config", overrides=[*overrides, f"method={m}"]), resolve=True)
            for m in methods}


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: compose one config per method, preflight them all, run, print the last line."""
    from hydra.core.hydra_config import HydraConfig

    from flows.runtime.api_server import ensure_api, flow_run_settings
    from flows.runtime.output import print_last_line
    from flows.runtime.pipeline import spacy_without_torch
    from flows.runtime.exits import USER_ERRORS, fail, fail_before_flow, interrupted, quiet_user_error_tracebacks, verbose
    from flows.runtime.preflight import preflight

    plain = OmegaConf.to_container(cfg, resolve=True)
    hc = HydraConfig.get()
    own = ("compare.", "report.")  # this command's own groups; every other override goes to each method's run
    overrides = [o for o in hc.overrides.task if not o.split("=", 1)[0].lstrip("+~").startswith(own)]
    try:
        methods = list(load_config(plain).compare.methods)
        configs = method_configs(methods, overrides)
        for c in configs.values():
            preflight(load_config(c), "evaluate")
    except USER_ERRORS as err:
        fail_before_flow(err, cfg, plain.get("artifacts_dir"))
    name = plain["report"].get("name") or slug(f"compare-{dataset_label(load_config(plain).dataset)}")
    report_cfg = {**plain, "report": {**plain["report"], "name": name, "sweep": None}}
    ensure_api()
    quiet_user_error_tracebacks(verbose(cfg))
    spacy_without_torch(plain.get("ner") or {})
    try:
        with flow_run_settings():
            result = compare_flow(configs, hc.runtime.output_dir, report_cfg)
    except USER_ERRORS as err:
        fail(err, verbose(cfg))
    except KeyboardInterrupt:
        interrupted()
    print_last_line("compare", result)


if __name__ == "__main__":
    sys.exit(main())
