"""``dagrag query`` as a user meets it, in a subprocess: a damaged index is one line naming the file and the command
that rebuilds it; passages with control characters and huge titles print safely in the human format and exactly
in JSONL; a question with nothing to match says so."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.faults.conftest import SMALL, truncate
from tests.faults.test_command_faults import dagrag, one_line


def build(*overrides: str) -> None:
    """The index ``dagrag index <overrides>`` builds, built in this process (the same flow; what is under test
    here is ``dagrag query`` on it, run as the user runs it)."""
    from flows.runtime.pipeline import index_flow
    from tests.flows.conftest import make_config

    at = next(o for o in overrides if o.startswith("artifacts_dir="))
    index_flow(make_config(Path(at.split("=", 1)[1]).parent, *overrides))


@pytest.fixture(scope="module")
def bm25_store(tmp_path_factory):
    artifacts = tmp_path_factory.mktemp("bm25") / "artifacts"
    build("method=bm25", *SMALL, f"artifacts_dir={artifacts}")
    return artifacts


def query(artifacts, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(dagrag_argv("query", "method=bm25", *SMALL, f"artifacts_dir={artifacts}", *args),
                          input=stdin, capture_output=True, text=True, timeout=300,
                          cwd=_repo(), env=_env())


def dagrag_argv(*args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "flows.cli", *args]


def _repo():
    from tests.faults.test_command_faults import REPO

    return REPO


def _env():
    from tests.faults.test_command_faults import env

    return env()


def test_a_damaged_index_is_one_line_naming_the_file_and_the_rebuild(bm25_store, tmp_path):
    import shutil

    artifacts = tmp_path / "artifacts"
    shutil.copytree(bm25_store, artifacts)
    (tar,) = artifacts.glob("*/bm25_index/bm25-*.tar")
    truncate(tar)
    out = query(artifacts, "--", "Who founded the city?")
    assert out.returncode == 2, out.stderr[-3000:]
    line = one_line(out)
    assert str(tar) in line and "damaged" in line and "dagrag index" in line, line
    assert "computed again" not in out.stderr and "not built" not in out.stderr, out.stderr
    rebuild = line.split("rebuild it with: ", 1)[1].split()
    assert rebuild[:2] == ["dagrag", "index"]
    assert dagrag(*rebuild[1:]).returncode == 0
    again = query(artifacts, "--", "Who founded the city?")
    assert again.returncode == 0 and "Q1" in again.stdout, again.stderr[-3000:]


HOSTILE_TEXT = "Paris is red \x1b[31mRED\x1b[0m here\x07 and \x00 there."
LONG_TITLE = "Paris " + "x" * 20_000


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    """A BM25 index over passages holding terminal escapes, BEL, NUL and a 20,000-character title."""
    root = tmp_path_factory.mktemp("hostile")
    corpus = root / "corpus.jsonl"
    records = [{"title": LONG_TITLE, "text": HOSTILE_TEXT}] + [
        {"title": f"Town {i}", "text": f"Town {i} lies on a river with {i} bridges."} for i in range(8)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = ("method=bm25", "dataset=jsonl", f"dataset.path={corpus}", f"artifacts_dir={root / 'artifacts'}")
    build(*args)
    return args


def ask(args, *questions: str, fmt: str = "text") -> subprocess.CompletedProcess:
    out = subprocess.run(dagrag_argv("query", *args, f"query.format={fmt}", "--", *questions), capture_output=True,
                         text=True, timeout=300, cwd=_repo(), env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_control_characters_are_visible_and_long_titles_cut_in_the_human_format(hostile_store):
    out = ask(hostile_store, "Which city is red?").stdout
    assert not any(c in out for c in "\x1b\x07\x00"), repr(out)
    assert "\\x1b[31mRED\\x1b[0m" in out and "\\x07" in out and "\\x00" in out
    assert max(len(line) for line in out.splitlines()) < 300
    (title_line,) = [ln for ln in out.splitlines() if "Paris xxx" in ln]
    assert title_line.endswith("…")


def test_jsonl_keeps_the_passage_exact(hostile_store):
    out = ask(hostile_store, "Which city is red?", fmt="jsonl").stdout
    top = json.loads(out.splitlines()[0])["results"][0]
    assert top["text"] == HOSTILE_TEXT and top["title"] == LONG_TITLE


def test_a_question_of_punctuation_or_stopwords_says_why_it_has_no_results(hostile_store):
    out = ask(hostile_store, "?!? ...", "the of and", "Which city is red?")
    blocks = out.stdout.split("\nQ")
    assert "no results: the question has no letters or digits" in blocks[0]
    assert "no results: the question has only stopwords" in blocks[1]
    assert "no results" not in blocks[2]
    jsonl = ask(hostile_store, "?!? ...", fmt="jsonl")
    assert json.loads(jsonl.stdout)["results"] == []
    notes = [ln for ln in jsonl.stderr.splitlines() if ln.startswith("note: ")]
    assert notes == ["note: question 1 has no results: the question has no letters or digits (only punctuation), "
                     "so there is nothing to match"], jsonl.stderr[-2000:]


def test_zoomrag_on_one_document_gives_it_a_meaningful_score(tmp_path):
    """Eq. 2 keeps no document of a one-document corpus (nothing lies 3 std above the mean); the question links to
    its best document instead, so the walk starts there and its score is not 0."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"title": "Paris", "text": "Paris is the capital of France. It lies on the Seine."})
                      + "\n")
    args = ("method=zoomrag", "dataset=jsonl", f"dataset.path={corpus}", f"artifacts_dir={tmp_path / 'artifacts'}")
    build(*args)
    out = ask(args, "What is the capital of France?", fmt="jsonl").stdout
    (hit,) = json.loads(out)["results"]
    assert hit["title"] == "Paris" and hit["score"] > 0, hit
