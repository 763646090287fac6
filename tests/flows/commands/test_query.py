"""``dagrag query`` from the shell: questions as typed after ``--``, on stdin, in a file (a flow run with
hits.parquet); text and JSON lines; an index that is not built is refused with the command that builds it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from flows.runtime.pipeline import index_flow
from tasks.data.ingest import IngestError, read_user_questions
from flows.serving.index import open_index
from tests.flows.conftest import make_config
from tests.flows.serving_helpers import REPO

SAMPLE = ["method=bm25", "dataset=sample", "dataset.n_passages=60", "dataset.n_questions=12"]
ODD = ["Who founded 'Tithin Works'?", 'k = 3 "Babraivik" = x', "Où est née Zoë, de Foudiby?"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("query")
    index_flow(make_config(root, *SAMPLE))
    return root / "artifacts"


def dagrag(*args: str, stdin: str | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, input=stdin, capture_output=True,
                          text=True, timeout=300, encoding="utf-8", env={"PYTHONIOENCODING": "utf-8",
                                                                          **__import__("os").environ})


def test_questions_after_the_separator_need_no_quoting_tricks(store):
    done = dagrag("query", *SAMPLE, f"artifacts_dir={store}", "query.format=jsonl", "query.k=4", "--", *ODD)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in done.stdout.splitlines()]
    assert [x["question"] for x in lines] == ODD
    offline = open_index(*SAMPLE, f"artifacts_dir={store}").retrieve(ODD, k=4)
    for line, ranked in zip(lines, offline):
        assert [p["doc_id"] for p in line["results"]] == [p.doc_id for p in ranked]
        assert [p["rank"] for p in line["results"]] == list(range(1, len(ranked) + 1))
    assert {"doc_id", "title", "text", "score", "rank"} <= set(lines[0]["results"][0])
    assert not (store / "runs").exists()  # asking writes nothing


def test_stdin_one_question_per_line_human_readable(store):
    done = dagrag("query", *SAMPLE, f"artifacts_dir={store}", "query.k=2", stdin="\n".join(ODD) + "\n\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for i, q in enumerate(ODD, start=1):
        assert f"Q{i}  {q}" in out
    blocks = out.strip().split("\n\n")
    offline = open_index(*SAMPLE, f"artifacts_dir={store}").retrieve(ODD, k=2)
    assert len(blocks) == 3
    for block, ranked in zip(blocks, offline):
        shown = [ln.split(maxsplit=2)[2] for ln in block.splitlines() if ln.strip()[:1].isdigit()]
        assert shown == [p.title for p in ranked] and ranked


def test_index_not_built_exit_2_naming_the_command(store, tmp_path):
    done = dagrag("query", "method=dense", "dataset=sample", "dataset.n_passages=60", f"artifacts_dir={store}",
                  "--", "a question")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert f"dagrag index method=dense dataset=sample dataset.n_passages=60 artifacts_dir={store}" in done.stderr
    empty = dagrag("query", *SAMPLE, f"artifacts_dir={store}", stdin="")
    assert empty.returncode == 2 and empty.stderr.startswith("error: no questions")


def test_questions_file_is_a_flow_run_writing_hits(store, tmp_path):
    questions = tmp_path / "today.jsonl"
    questions.write_text("\n".join(json.dumps({"id": f"t{i}", "question": q}) for i, q in enumerate(ODD)) + "\n")
    done = dagrag("query", *SAMPLE, f"artifacts_dir={store}", f"query.file={questions}", "query.k=3")
    assert done.returncode == 0, done.stderr[-2000:]
    last = json.loads(done.stdout.strip().splitlines()[-1].split("query: ", 1)[1])
    hits = pd.read_parquet(last["hits"])
    assert sorted(hits["qid"].unique()) == ["t0", "t1", "t2"] and set(hits["rank"]) == {1, 2, 3}
    offline = open_index(*SAMPLE, f"artifacts_dir={store}").retrieve(ODD, k=3)
    for i, ranked in enumerate(offline):
        assert hits[hits["qid"] == f"t{i}"].sort_values("rank")["doc_id"].tolist() == [p.doc_id for p in ranked]
    runs = pd.read_parquet(Path(last["hits"]).parent / "questions.parquet")
    assert runs["question"].tolist() == ODD


def test_a_malformed_questions_file_is_refused_before_the_flow(store, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "fine"}\n{"question": ""}\n')
    done = dagrag("query", *SAMPLE, f"artifacts_dir={store}", f"query.file={bad}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"error: {bad}: line 2: expected a non-empty question string in field 'question'"


def test_user_questions_in_every_shape_need_no_gold(tmp_path):
    plain = tmp_path / "q.txt"
    plain.write_text("First question?\n\n  Second = one  \n")
    assert read_user_questions(plain)[["qid", "question"]].values.tolist() == [["q1", "First question?"],
                                                                              ["q2", "Second = one"]]
    hippo = tmp_path / "q.json"
    hippo.write_text(json.dumps([{"_id": "a", "question": "With gold?", "supporting_facts": [["T", 0]]},
                                 {"id": "b", "question": "Without gold?"}, "A bare string?"]))
    assert read_user_questions(hippo)["qid"].tolist() == ["a", "b", "q3"]
    broken = tmp_path / "bad.txt"
    broken.write_bytes("fine\n".encode() + b"caf\xe9\n")
    with pytest.raises(IngestError, match=r"not UTF-8 at line 2 \(byte offset 8\)"):
        read_user_questions(broken)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": 1, "question": "a"}\n{"id": 1, "question": "b"}\n')
    with pytest.raises(IngestError, match="duplicate question id '1'"):
        read_user_questions(dup)
