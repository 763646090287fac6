"""flows/commands/errors.py on two hand-made run folders over the generated sample (no index is built)."""
from __future__ import annotations

import json

from flows.commands.errors import main
from tasks.data.ingest import SampleParams, load_dataset


def _run(path, hits):
    path.mkdir()
    hits.to_parquet(path / "hits.parquet")
    overrides = {"dataset": "sample", "dataset.n_passages": "40", "dataset.n_questions": "8"}
    (path / "manifest.json").write_text(json.dumps({"overrides": overrides}))
    return path


def test_errors_counts_the_misses_of_the_worse_run(tmp_path, capsys):
    _, questions, gold, _ = load_dataset(SampleParams(n_passages=40, n_questions=8), "")
    g = gold.drop_duplicates(["qid", "doc_id"])
    perfect = g.assign(rank=g.groupby("qid").cumcount() + 1)[["qid", "rank", "doc_id"]]
    first_only = perfect[perfect["rank"] == 1]
    worse, better = _run(tmp_path / "worse", first_only), _run(tmp_path / "better", perfect)
    assert main([str(worse), str(better), "--k", "5"]) == 0
    out = capsys.readouterr().out
    missed = len(perfect) - len(first_only)
    assert f"{missed} missed passages" in out and "All" in out
    assert main([str(better), "--k", "5"]) == 0  # the perfect run alone misses nothing
    assert "0 missed passages" in capsys.readouterr().out
    assert main([str(tmp_path / "nowhere"), str(better)]) == 2
    assert main([str(better), "--k", "0"]) == 2 and "must be 1 or more" in capsys.readouterr().err
    assert main([str(better), "--k", "500"]) == 0  # deeper than the run kept: said, and counted on what it has
    assert f"holds at most {int(perfect['rank'].max())} passages per question" in capsys.readouterr().err
