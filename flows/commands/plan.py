"""``dagrag plan [overrides]``: what a run with these overrides would reuse and what it would compute, before it
runs (beyond the papers: an engineering aid, like ``dvc status`` or ``terraform plan``).

Each stage of the method's index DAG (``plan.command=update``: its update DAG) is shown with its fingerprint and
its state: *cached* (its catalog row: rows, size, when), *computes* and why (never built here, changed params,
new inputs, new code identity, a damaged file), or *computes N new rows* for a per-row stage; then an estimate of
time and disk from the catalog's past runs (:mod:`tasks.core.plan`). Nothing is computed or written: the
method's own flow code runs with every stage planned (:func:`flows.runtime.pipeline.plan_run`), no Prefect run, no
server. ``plan.format=json`` prints the plan as JSON, ``plan.format=mermaid`` the stage DAG as a mermaid diagram
(the one on the method's docs page).
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from flows.runtime.config import Config, load_config

DIAGRAM = "stages of method={method}"  # the diagram's first comment, which tests/test_docs.py reads


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: print the plan of the run these overrides describe."""
    from flows.runtime.exits import USER_ERRORS, discard_job_folder, fail_before_flow
    from flows.runtime.dag import plan_run

    plain = OmegaConf.to_container(cfg, resolve=True)
    try:
        conf = load_config(plain)
        plan = plan_run(conf, conf.plan.command)
    except USER_ERRORS as err:
        fail_before_flow(err, cfg, plain.get("artifacts_dir"))
    discard_job_folder(plain.get("artifacts_dir"))  # a plan leaves no run folder behind
    print(plan.mermaid(DIAGRAM.format(method=conf.method.name)) if conf.plan.format == "mermaid"
          else plan.render(conf.plan.format), flush=True)


def diagram(conf: Config) -> str:
    """The stage DAG of ``conf``'s index as mermaid: what ``plan.format=mermaid`` prints (the method pages' drawing)."""
    from flows.runtime.dag import plan_run

    return plan_run(conf, conf.plan.command).mermaid(DIAGRAM.format(method=conf.method.name))


if __name__ == "__main__":
    sys.exit(main())
