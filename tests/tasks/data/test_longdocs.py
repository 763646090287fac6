"""The long-document development set (tasks/data/longdocs.py): spans located at build time, never assumed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.data import longdocs
from tasks.data.longdocs import Question, build_questions, locate_span, read_questions

ROOT = Path(__file__).resolve().parents[3]


def test_locate_span_finds_the_answer_inside_its_unique_anchor():
    text = "alpha beta. The flag is -f here. gamma -f"
    start, end = locate_span(text, "The flag is -f here", "-f")
    assert text[start:end] == "-f" and start == text.index("The flag") + len("The flag is ")


@pytest.mark.parametrize("anchor, answer, reason", [
    ("not there", "there", "anchor not found"),
    ("beta", "beta", "more than once"),
    ("alpha", "omega", "not inside its anchor"),
])
def test_locate_span_says_why_a_span_is_lost(anchor, answer, reason):
    assert reason in locate_span("alpha beta beta", anchor, answer)


def test_build_questions_reports_lost_questions_and_keeps_located_ones():
    docs = {"doc a": "intro text. the answer is 42 units. outro"}
    qs = [Question("q1", "how many?", "42 units", "doc a", "the answer is 42 units"),
          Question("q2", "gone?", "x", "doc b", "x"),
          Question("q3", "drifted?", "43 units", "doc a", "the answer is 43 units")]
    located, lost = build_questions(qs, docs)
    assert [r["_id"] for r in located] == ["q1"]
    span = located[0]["answer_span"]
    assert docs[span["document"]][span["start"]:span["end"]] == "42 units"
    assert located[0]["supporting_facts"] == [["doc a", 0]]
    assert {q["qid"]: q["reason"] for q in lost} == {"q2": "gold document not in the corpus",
                                                     "q3": "anchor not found in the document"}


def test_shipped_questions_are_sixty_or_more_with_unique_ids():
    qs = read_questions()
    assert len(qs) >= 60
    assert len({q.qid for q in qs}) == len(qs)
    assert all(q.answer in q.anchor for q in qs)


def test_the_script_builds_from_the_installed_packages(tmp_path):
    """The pip-only build (what CI has): every located span is the answer text at its offset in the corpus,
    and every question is either located or reported with its reason."""
    out = subprocess.run([sys.executable, "-m", "tasks.data.longdocs", "--out", str(tmp_path), "--no-pdf"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    corpus = {r["title"]: r["text"] for r in map(json.loads, (tmp_path / "corpus.jsonl").read_text().splitlines())}
    questions = json.loads((tmp_path / "questions.json").read_text())
    report = json.loads((tmp_path / "build_report.json").read_text())
    assert len(corpus) == report["documents"] and report["pdf_documents"] == 0
    assert all(len(t) >= longdocs.MIN_CHARS for t in corpus.values())
    for q in questions:
        span = q["answer_span"]
        assert corpus[span["document"]][span["start"]:span["end"]] == q["answer"]
    assert len(questions) + len(report["lost_questions"]) == len(read_questions())
    for lost in report["lost_questions"]:
        assert f"lost question {lost['qid']}" in out.stdout
    assert f"{len(questions)} questions located" in out.stdout


def test_ingest_keeps_the_answer_span_and_refuses_a_bad_one():
    from tasks.data.ingest import IngestError, parse_questions

    docs = {"doc a": "intro text. the answer is 42 units. outro"}
    located, _ = build_questions([Question("q1", "how many?", "42 units", "doc a", "the answer is 42 units")], docs)
    questions, gold_keys = parse_questions(located, "questions.json")
    assert questions[["span_start", "span_end"]].values.tolist() == [[26, 34]]
    assert gold_keys == [("q1", [("doc a", None)])]
    plain, _ = parse_questions([{**located[0], "answer_span": None}], "questions.json")
    assert list(plain.columns) == ["qid", "question", "answers", "qtype"]  # the benchmarks' table is unchanged
    with pytest.raises(IngestError, match="answer_span"):
        parse_questions([{**located[0], "answer_span": {"start": 9, "end": 2}}], "questions.json")


def test_documents_option_keeps_named_documents_and_refuses_unknown_titles(tmp_path):
    report = longdocs.build(tmp_path, with_pdfs=False, only=["pytz"]) if "pytz" in {
        d.title for d in longdocs.package_documents()} else pytest.skip("pytz's description is not installed")
    titles = {json.loads(line)["title"] for line in (tmp_path / "corpus.jsonl").read_text().splitlines()}
    assert titles == {"pytz"} and report["documents"] == 1
    asked = {q["answer_span"]["document"] for q in json.loads((tmp_path / "questions.json").read_text())}
    assert asked <= {"pytz"}
    with pytest.raises(ValueError, match="no document titled"):
        longdocs.build(tmp_path, with_pdfs=False, only=["no such package"])
