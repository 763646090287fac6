"""``python -m flows.commands.errors RUN [AGAINST] [--k K]``: why a method's run misses gold passages that another run finds.

Both arguments are run folders of ``dagrag evaluate`` (they hold ``hits.parquet`` and ``manifest.json``)
on the same dataset. Prints, per question type, the reasons of :mod:`tasks.eval.errors` for the gold
passages RUN misses in its top ``--k`` on the questions where AGAINST finds more of them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from tasks.data.ingest import load_dataset
from tasks.eval.errors import losses_against, miss_reasons, missed_gold


def _dataset(run: Path):
    """The dataset and data_dir of a run: its recorded overrides composed and checked as the run's were."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from flows.runtime.config import load_config
    from flows.commands.schedule import CONF

    over = json.loads((run / "manifest.json").read_text())["overrides"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"{k}={v}" for k, v in over.items()])
    conf = load_config(OmegaConf.to_container(cfg, resolve=True))
    return conf.dataset, conf.data_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.commands.errors", description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the method's evaluate run folder")
    ap.add_argument("against", type=Path, nargs="?", default=None,
                    help="the run it is compared with (e.g. method=hybrid); without it, every miss of RUN")
    ap.add_argument("--k", type=int, default=5, help="the cut-off (default 5)")
    args = ap.parse_args(argv)
    for run in [r for r in (args.run, args.against) if r is not None]:
        if not (run / "hits.parquet").exists() or not (run / "manifest.json").exists():
            print(f"error: {run} is not an evaluate run folder (no hits.parquet / manifest.json)", file=sys.stderr)
            return 2
    params, data_dir = _dataset(args.run)
    if args.against is not None and _dataset(args.against)[0] != params:
        print("error: the two runs are on different datasets", file=sys.stderr)
        return 2
    docs, questions, gold, _ = load_dataset(params, data_dir)
    hits = pd.read_parquet(args.run / "hits.parquet")
    if args.k < 1:
        print(f"error: --k {args.k}: the cut-off must be 1 or more", file=sys.stderr)
        return 2
    depth = int(hits["rank"].max()) if len(hits) else 0
    if args.k > depth:  # the run kept fewer: its top k is the whole of what it returned
        print(f"note: {args.run / 'hits.parquet'} holds at most {depth} passages per question, so its top "
              f"{args.k} is what it returned (the run's eval.ks and method.top_k set that depth)", file=sys.stderr)
    if args.against is None:
        qids = sorted(set(hits["qid"]))
        out = miss_reasons(missed_gold(hits, gold, args.k, qids), hits, gold, questions, docs, args.k)
        print(f"{out['qid'].nunique()} of {len(qids)} questions miss a gold passage in the top {args.k}; "
              f"{len(out)} missed passages, by question type and reason:")
    else:
        other = pd.read_parquet(args.against / "hits.parquet")
        qids = sorted(set(hits["qid"]) & set(other["qid"]))
        out = losses_against(hits, other, gold, questions, docs, args.k, qids)
        print(f"{out['qid'].nunique()} of {len(qids)} questions where {args.against.name} finds more gold "
              f"passages in its top {args.k}; {len(out)} missed passages, by question type and reason:")
    if len(out):
        print(pd.crosstab(out["qtype"], out["reason"], margins=True).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
