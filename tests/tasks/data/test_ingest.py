"""Tests for ``tasks.data.ingest``: the three HippoRAG question shapes, user corpora, errors, shuffle, caching."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tasks.data.ingest import (
    LINEAGE_COLUMNS,
    HippoRAGParams,
    IngestError,
    UserCorpusParams,
    doc_id,
    ingest,
    load_dataset,
    parse_questions,
    shuffle_documents,
)
from tasks.core.stage import RunContext
from tasks.core.store import Store

# A small corpus with one exact duplicate and one title ("Paris") shared by two different passages.
CORPUS = [
    {"title": "Alpha Town", "text": "Alpha Town is a town. It has a river."},
    {"title": "Beta River", "text": "Beta River flows north."},
    {"title": "Gamma", "text": "Gamma is a cat."},
    {"title": "Alpha Town", "text": "Alpha Town is a town. It has a river."},  # exact duplicate
    {"title": "Paris", "text": "Paris is the capital of France."},
    {"title": "Paris", "text": "Paris is a town in Texas."},
]
ALPHA, BETA, GAMMA = (doc_id(CORPUS[i]["title"], CORPUS[i]["text"]) for i in range(3))
PARIS_FR, PARIS_TX = doc_id("Paris", CORPUS[4]["text"]), doc_id("Paris", CORPUS[5]["text"])

HOTPOT = [
    {"_id": "h1", "question": "Which way does the river of Alpha Town flow?", "answer": "north",
     "supporting_facts": [["Alpha Town", 1], ["Beta River", 0], ["Alpha Town", 0]],
     "context": [["Alpha Town", ["Alpha Town is a town.", " It has a river."]],
                 ["Beta River", ["Beta River flows north."]],
                 ["Gamma", ["Gamma is a cat."]]],
     "type": "bridge", "level": "easy"},
    {"_id": "h2", "question": "Which Paris is in Texas?", "answer": "Paris",
     "supporting_facts": [["Paris", 0]],
     "context": [["Paris", ["Paris is a town in Texas."]]],
     "type": "bridge", "level": "medium"},
    {"_id": "h3", "question": "Where is Nowhere?", "answer": "nowhere",
     "supporting_facts": [["Nowhere", 0], ["Gamma", 0]],
     "context": [["Nowhere", ["Nowhere is missing."]], ["Gamma", ["Gamma is a cat."]]],
     "type": "comparison", "level": "hard"},
]

TWOWIKI = [
    {"_id": "w1", "question": "When was the French Paris founded?", "answer": "1900",
     "answer_aliases": ["nineteen hundred", "1900"],
     "supporting_facts": [["Paris", 0], ["Gamma", 0]],
     "context": [["Paris", ["Paris is the capital of France."]], ["Gamma", ["Gamma is a cat."]]],
     "evidences": [["Paris", "founded", "1900"]], "type": "compositional"},
    {"_id": "w2", "question": "Which Paris?", "answer": 1912, "answer_aliases": [],
     "supporting_facts": [["Paris", 0]], "context": [],  # no context: the title alone is ambiguous
     "evidences": [], "type": "inference"},
]

MUSIQUE = [
    {"id": "m1", "question": "What flows north near Alpha Town?", "answer": "Beta River",
     "answer_aliases": ["the Beta"],
     "paragraphs": [
         {"idx": 0, "title": "Alpha Town", "paragraph_text": "Alpha Town is a town. It has a river.",
          "is_supporting": True},
         {"idx": 1, "title": "Paris", "paragraph_text": "Paris is a town in Texas.", "is_supporting": True},
         {"idx": 2, "title": "Gamma", "paragraph_text": "Gamma is a cat.", "is_supporting": False},
         {"idx": 3, "title": "Lost", "paragraph_text": "Not in the corpus.", "is_supporting": True}],
     "question_decomposition": [{"id": 1, "question": "river of Alpha Town", "answer": "Beta River"}],
     "answerable": True},
]


def _write_json(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def _write_jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    return path


def _hipporag(tmp_path: Path, questions: list | None, corpus: list = CORPUS, name: str = "bench") -> str:
    data_dir = tmp_path / "data"
    _write_json(data_dir / name / "corpus.json", corpus)
    if questions is not None:
        _write_json(data_dir / name / "questions.json", questions)
    return str(data_dir)


def _gold(gold: pd.DataFrame) -> dict[str, set[str]]:
    return {q: set(g["doc_id"]) for q, g in gold.groupby("qid")}


def _parquets(root: str) -> list[Path]:
    return sorted(Path(root).rglob("*.parquet"))


# ----------------------------------------------------------------------------- canonical documents

def test_doc_id_is_a_stable_content_hash():
    a = doc_id("T", "some text")
    assert a == doc_id("T", "some text") and a.startswith("doc-")
    assert len({a, doc_id("T", "other text"), doc_id("U", "some text"), doc_id("Ts", "ome text")}) == 4


def test_documents_dedup_and_duplicate_titles(tmp_path):
    data_dir = _hipporag(tmp_path, None)
    docs, questions, gold, report = load_dataset(HippoRAGParams(name="bench", shuffle_seed=None), data_dir)
    assert list(docs.columns) == LINEAGE_COLUMNS  # passages and their lineage (unsplit: each its own document)
    assert (docs["document"] == docs["doc_id"]).all() and docs["source"].isna().all()
    assert (docs["char_start"] == 0).all() and (docs["char_end"] == docs["text"].str.len()).all()
    assert docs["doc_id"].tolist() == [ALPHA, BETA, GAMMA, PARIS_FR, PARIS_TX]  # file order, duplicate dropped
    assert docs["doc_id"].is_unique
    assert docs["title"].tolist().count("Paris") == 2  # same title, different texts: two documents
    assert report.n_records == 6 and report.n_duplicate_records == 1
    assert report.summary()["duplicate_records"] == 1
    assert questions.empty and list(questions.columns) == ["qid", "question", "answers", "qtype"]
    assert gold.empty and list(gold.columns) == ["qid", "doc_id"]


def test_doc_ids_do_not_depend_on_file_or_order(tmp_path):
    a = _hipporag(tmp_path / "a", None)
    b = _hipporag(tmp_path / "b", None, corpus=list(reversed(CORPUS)))
    docs_a = load_dataset(HippoRAGParams(name="bench", shuffle_seed=None), a)[0]
    docs_b = load_dataset(HippoRAGParams(name="bench", shuffle_seed=None), b)[0]
    assert set(docs_a["doc_id"]) == set(docs_b["doc_id"])
    assert docs_b["doc_id"].tolist() == [PARIS_TX, PARIS_FR, ALPHA, GAMMA, BETA]


# ----------------------------------------------------------------------------- the three question shapes

def test_hotpotqa_shape(tmp_path):
    data_dir = _hipporag(tmp_path, HOTPOT)
    _, questions, gold, report = load_dataset(HippoRAGParams(name="bench", shuffle_seed=None), data_dir)
    assert questions["qid"].tolist() == ["h1", "h2", "h3"]
    assert questions["question"].tolist()[1] == "Which Paris is in Texas?"
    assert [list(a) for a in questions["answers"]] == [["north"], ["Paris"], ["nowhere"]]
    assert _gold(gold) == {"h1": {ALPHA, BETA},         # a title cited twice counts once
                           "h2": {PARIS_TX},            # duplicated title resolved by the context text
                           "h3": {GAMMA}}               # the unmatched title does not drop the question
    assert not gold.duplicated().any()
    s = report.summary()
    assert s["unmatched_gold"] == 1 and ("h3", "Nowhere") in [tuple(e) for e in s["unmatched_examples"]]
    assert s["ambiguous_gold"] == 0


def test_2wikimultihopqa_shape(tmp_path):
    data_dir = _hipporag(tmp_path, TWOWIKI)
    _, questions, gold, report = load_dataset(HippoRAGParams(name="bench", shuffle_seed=None), data_dir)
    answers = dict(zip(questions["qid"], (list(a) for a in questions["answers"])))
    assert answers == {"w1": ["1900", "nineteen hundred"], "w2": ["1912"]}  # aliases, de-duplicated, as str
    got = _gold(gold)
    assert got["w1"] == {PARIS_FR, GAMMA}
    # no context to disambiguate: both 'Paris' passages are kept and the ambiguity is reported
    assert got["w2"] == {PARIS_FR, PARIS_TX}
    s = report.summary()
    assert s["ambiguous_gold"] == 1 and [tuple(e) for e in s["ambiguous_examples"]] == [("w2", "Paris")]
    assert s["unmatched_gold"] == 0


def test_musique_shape(tmp_path):
    data_dir = _hipporag(tmp_path, MUSIQUE)
    _, questions, gold, report = load_dataset(HippoRAGParams(name="bench", shuffle_seed=None), data_dir)
    assert questions["qid"].tolist() == ["m1"]
    assert list(questions["answers"].iloc[0]) == ["Beta River", "the Beta"]
    assert _gold(gold) == {"m1": {ALPHA, PARIS_TX}}  # only is_supporting; Paris resolved by paragraph text
    s = report.summary()
    assert s["unmatched_gold"] == 1 and [tuple(e) for e in s["unmatched_examples"]] == [("m1", "Lost")]


def test_unmatched_examples_are_capped_but_counted(tmp_path):
    questions = [{"_id": f"q{i}", "question": "?", "answer": "a", "supporting_facts": [[f"Missing {i}", 0]],
                  "context": []} for i in range(8)]
    data_dir = _hipporag(tmp_path, questions)
    _, _, gold, report = load_dataset(HippoRAGParams(name="bench", shuffle_seed=None), data_dir)
    s = report.summary()
    assert gold.empty
    assert s["unmatched_gold"] == 8 and 0 < len(s["unmatched_examples"]) <= 8
    assert all(tuple(e) in {(f"q{i}", f"Missing {i}") for i in range(8)} for e in s["unmatched_examples"])


# ----------------------------------------------------------------------------- user corpora

def test_jsonl_corpus_without_questions(tmp_path):
    path = _write_jsonl(tmp_path / "c.jsonl", CORPUS)
    docs, questions, gold, report = load_dataset(
        UserCorpusParams(kind="jsonl", path=str(path), shuffle_seed=None), str(tmp_path))
    assert docs["doc_id"].tolist() == [ALPHA, BETA, GAMMA, PARIS_FR, PARIS_TX]
    assert report.n_duplicate_records == 1
    assert questions.empty and gold.empty


def test_jsonl_corpus_with_jsonl_questions(tmp_path):
    path = _write_jsonl(tmp_path / "c.jsonl", CORPUS)
    qpath = _write_jsonl(tmp_path / "q.jsonl", MUSIQUE)
    _, questions, gold, _ = load_dataset(
        UserCorpusParams(kind="jsonl", path=str(path), questions=str(qpath), shuffle_seed=None), str(tmp_path))
    assert questions["qid"].tolist() == ["m1"]
    assert _gold(gold) == {"m1": {ALPHA, PARIS_TX}}


def test_folder_corpus(tmp_path):
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "alpha.txt").write_text("  Alpha is first.\n", encoding="utf-8")
    (folder / "sub" / "beta.md").write_text("# Beta\nBeta is second.", encoding="utf-8")
    (folder / "ignored.csv").write_text("x,y", encoding="utf-8")
    params = UserCorpusParams(kind="folder", path=str(folder), shuffle_seed=None)
    docs, questions, gold, _ = load_dataset(params, str(tmp_path))
    assert sorted(zip(docs["title"], docs["text"])) == [("alpha", "Alpha is first."),
                                                      ("beta", "# Beta\nBeta is second.")]
    assert docs["doc_id"].tolist() == [doc_id(t, x) for t, x in zip(docs["title"], docs["text"])]
    assert questions.empty and gold.empty

    qpath = _write_json(tmp_path / "q.json", [{"_id": "f1", "question": "Who is second?", "answer": "Beta",
                                               "supporting_facts": [["beta", 0]], "context": []}])
    params = UserCorpusParams(kind="folder", path=str(folder), questions=str(qpath), shuffle_seed=None)
    docs, questions, gold, _ = load_dataset(params, str(tmp_path))
    assert _gold(gold) == {"f1": {doc_id("beta", "# Beta\nBeta is second.")}}


# ----------------------------------------------------------------------------- bad input

def _bad_cases(tmp_path: Path):
    """(params, data_dir, substrings the message must contain) for each kind of malformed input."""
    d = tmp_path / "data"

    def hippo(name, corpus_text=None, corpus=None, questions=None):
        root = d / name
        root.mkdir(parents=True)
        if corpus_text is not None:
            (root / "corpus.json").write_text(corpus_text, encoding="utf-8")
        else:
            _write_json(root / "corpus.json", corpus)
        if questions is not None:
            _write_json(root / "questions.json", questions)
        return HippoRAGParams(name=name)

    good = [{"title": "a", "text": "x"}]
    good_q = {"_id": "q0", "question": "?", "answer": "a", "supporting_facts": [["a", 0]], "context": []}
    (d / "u").mkdir(parents=True)
    (d / "u" / "bad.jsonl").write_text('{"title": "a", "text": "x"}\n{"title": "b", "text": \n', encoding="utf-8")
    (d / "u" / "c.jsonl").write_text('{"title": "a", "text": "x"}\n', encoding="utf-8")
    (d / "u" / "empty").mkdir()
    (d / "u" / "latin1.jsonl").write_bytes(b'{"title": "a", "text": "x"}\n{"title": "b", "text": "caf\xe9"}\n')
    (d / "u" / "latin1").mkdir()
    (d / "u" / "latin1" / "note.txt").write_bytes(b"line one\nline tw\xf6")
    (d / "u" / "long.jsonl").write_text('{"title": "a", "text": "x"}\n{"title": "b", "text": "' + "y" * 50 + '"}\n')
    latin_corpus = hippo("l1", corpus=good)
    (d / "l1" / "corpus.json").write_bytes(b'[{"title": "a",\n "text": "na\xefve"}]')
    return {
        "utf8_jsonl": (UserCorpusParams(kind="jsonl", path=str(d / "u" / "latin1.jsonl")),
                       ["latin1.jsonl", "invalid UTF-8 at byte offset 55", "line 2, record 1", "iconv"]),
        "utf8_folder": (UserCorpusParams(kind="folder", path=str(d / "u" / "latin1")),
                        ["note.txt", "invalid UTF-8 at byte offset 16", "line 2"]),
        "utf8_json": (latin_corpus, ["corpus.json", "invalid UTF-8 at byte offset 28", "line 2"]),
        "max_text_chars": (UserCorpusParams(kind="jsonl", path=str(d / "u" / "long.jsonl"), max_text_chars=20),
                           ["long.jsonl", "record 1", "50 characters", "max_text_chars=20"]),
        "not_json": (hippo("nj", corpus_text="[{not json"), ["corpus.json", "not valid JSON"]),
        "not_a_list": (hippo("nl", corpus={"title": "a", "text": "x"}), ["corpus.json", "list"]),
        "missing_field": (hippo("mf", corpus=good + [{"title": "b"}]), ["corpus.json", "record 1", "'text'"]),
        "wrong_type": (hippo("wt", corpus=good * 2 + [{"title": 3, "text": "z"}]),
                       ["corpus.json", "record 2", "'title'", "int"]),
        "record_not_object": (hippo("ro", corpus=good + ["just a string"]), ["corpus.json", "record 1"]),
        "blank_record": (hippo("br", corpus=good + [{"title": " ", "text": ""}]), ["corpus.json", "record 1"]),
        "empty_corpus": (hippo("ec", corpus=[]), ["corpus.json", "empty"]),
        "question_missing": (hippo("qm", corpus=good, questions=[good_q, {"_id": "q1", "answer": "a"}]),
                             ["questions.json", "record 1", "'question'"]),
        "question_wrong_type": (hippo("qw", corpus=good, questions=[{**good_q, "supporting_facts": "a"}]),
                                ["questions.json", "record 0", "'supporting_facts'"]),
        "question_no_id": (hippo("qi", corpus=good, questions=[{"question": "?", "answer": "a"}]),
                           ["questions.json", "record 0", "'_id'"]),
        "duplicate_qid": (hippo("dq", corpus=good, questions=[good_q, good_q]),
                          ["questions.json", "record 1", "duplicate"]),
        "bad_paragraphs": (hippo("bp", corpus=good, questions=[{"id": "m", "question": "?", "answer": "a",
                                                                "paragraphs": [{"title": "a"}]}]),
                           ["questions.json", "record 0", "'paragraphs'"]),
        "jsonl_bad_line": (UserCorpusParams(kind="jsonl", path=str(d / "u" / "bad.jsonl")),
                           ["bad.jsonl", "record 1", "line 2"]),
        "jsonl_missing_file": (UserCorpusParams(kind="jsonl", path=str(d / "u" / "nope.jsonl")),
                               ["nope.jsonl", "not found"]),
        "questions_missing_file": (UserCorpusParams(kind="jsonl", path=str(d / "u" / "c.jsonl"),
                                                    questions=str(d / "u" / "q.json")), ["q.json", "not found"]),
        "empty_folder": (UserCorpusParams(kind="folder", path=str(d / "u" / "empty")), ["empty", "empty"]),
        "no_path": (UserCorpusParams(kind="jsonl", path=""), ["dataset.path"]),
        "hipporag_missing": (HippoRAGParams(name="absent"), ["absent", "corpus.json", "not found"]),
    }, str(d)


BAD = ["not_json", "not_a_list", "missing_field", "wrong_type", "record_not_object", "blank_record",
       "empty_corpus", "question_missing", "question_wrong_type", "question_no_id", "duplicate_qid",
       "bad_paragraphs", "jsonl_bad_line", "jsonl_missing_file", "questions_missing_file", "empty_folder",
       "no_path", "hipporag_missing", "utf8_jsonl", "utf8_folder", "utf8_json", "max_text_chars"]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_raises_and_writes_nothing(tmp_path, case):
    cases, data_dir = _bad_cases(tmp_path)
    params, needles = cases[case]
    with pytest.raises(IngestError) as err:
        load_dataset(params, data_dir)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))

    ctx = RunContext(str(tmp_path / "artifacts"), "ds", "run1")
    with pytest.raises(IngestError) as err2:
        ingest(ctx, params, data_dir)
    assert str(err2.value) == str(err.value)
    # a user corpus's read stage keeps the rows it read (whole parts; a bad file's row holds its reason), so the
    # next run reads no file twice; no table of the ingest stage, nor any other stage, is written
    read = {Path(ctx.artifacts_dir) / "_rows" / "read", Path(ctx.artifacts_dir) / "ds" / "read"}
    assert [p for p in _parquets(ctx.artifacts_dir) if not read & set(p.parents)] == []
    if (Path(ctx.artifacts_dir) / "catalog.duckdb").exists():
        assert set(ctx.store.query("SELECT stage FROM stages")["stage"]) <= {"read"}
        assert set(ctx.store.query("SELECT stage FROM stage_events")["stage"]) <= {"read"}


# ----------------------------------------------------------------------------- shuffle

def _docs(n: int) -> pd.DataFrame:
    return pd.DataFrame({"doc_id": [f"d{i:02d}" for i in range(n)], "title": [f"t{i}" for i in range(n)],
                         "text": [f"x{i}" for i in range(n)]})


def test_shuffle_is_seeded_permutation():
    docs = _docs(30)
    a, b = shuffle_documents(docs, 7), shuffle_documents(docs, 7)
    pd.testing.assert_frame_equal(a, b)
    assert a["doc_id"].tolist() != docs["doc_id"].tolist()
    assert sorted(a["doc_id"]) == docs["doc_id"].tolist()
    assert list(a.index) == list(range(30))
    # rows move whole: each doc keeps its own title and text
    assert (a["title"].str[1:] == a["doc_id"].str[1:].astype(int).astype(str)).all()
    assert shuffle_documents(docs, 8)["doc_id"].tolist() != a["doc_id"].tolist()


def test_shuffle_keeps_old_documents_in_order_when_the_corpus_grows():
    """A grown corpus places its new documents among the old ones without reordering those: the base corpus's
    shuffled order is the grown corpus's shuffled order with the new documents left out (any file order)."""
    full = _docs(200)
    base = full.sample(frac=0.95, random_state=1).reset_index(drop=True)  # other file order, 10 documents fewer
    old_ids = set(base["doc_id"])
    for seed in (0, 7):
        grown, kept = shuffle_documents(full, seed), shuffle_documents(base, seed)
        is_old = grown["doc_id"].isin(old_ids).to_numpy()
        assert grown["doc_id"][is_old].tolist() == kept["doc_id"].tolist()
        new_at = np.flatnonzero(~is_old)
        assert len(new_at) == 10 and new_at.max() - new_at.min() > 20  # placed among the old, not appended

    # the control: the previous shuffle, a permutation of positions, reorders the old documents
    def by_position(d: pd.DataFrame) -> list[str]:
        return d.iloc[np.random.default_rng(0).permutation(len(d))]["doc_id"].tolist()

    assert [x for x in by_position(full) if x in old_ids] != by_position(base)


def test_shuffle_none_keeps_order(tmp_path):
    docs = _docs(10)
    pd.testing.assert_frame_equal(shuffle_documents(docs, None), docs)
    data_dir = _hipporag(tmp_path, HOTPOT)
    plain = load_dataset(HippoRAGParams(name="bench", shuffle_seed=None), data_dir)
    shuffled = load_dataset(HippoRAGParams(name="bench", shuffle_seed=3), data_dir)
    assert plain[0]["doc_id"].tolist() == [ALPHA, BETA, GAMMA, PARIS_FR, PARIS_TX]
    assert sorted(shuffled[0]["doc_id"]) == sorted(plain[0]["doc_id"])
    pd.testing.assert_frame_equal(shuffled[2], plain[2])  # gold does not depend on corpus order


# ----------------------------------------------------------------------------- the stage

def test_ingest_stage_writes_tables_and_caches(tmp_path, ctx):
    data_dir = _hipporag(tmp_path, HOTPOT)
    params = HippoRAGParams(name="bench", shuffle_seed=None)
    refs = ingest(ctx, params, data_dir)
    assert set(refs) == {"documents", "questions", "gold", "ingest_report", "sources", "skipped"}
    docs = Store.read(refs["documents"])
    assert docs["doc_id"].tolist() == [ALPHA, BETA, GAMMA, PARIS_FR, PARIS_TX] and refs["documents"].rows == 5
    questions = Store.read(refs["questions"])
    assert [list(a) for a in questions["answers"]] == [["north"], ["Paris"], ["nowhere"]]
    assert _gold(Store.read(refs["gold"])) == {"h1": {ALPHA, BETA}, "h2": {PARIS_TX}, "h3": {GAMMA}}
    summary = json.loads(Store.read(refs["ingest_report"])["report"].iloc[0])
    assert summary["unmatched_gold"] == 1 and summary["duplicate_records"] == 1

    again = ingest(RunContext(ctx.artifacts_dir, ctx.dataset, "run2"), params, data_dir)
    assert again == refs
    events = ctx.store.query("SELECT run_id, status FROM stage_events WHERE stage = 'ingest' ORDER BY created_at")
    assert events.values.tolist() == [["run1", "computed"], ["run2", "cached"]]

    # a changed raw file is a new fingerprint, computed afresh
    _write_json(Path(data_dir) / "bench" / "corpus.json", CORPUS[:3])
    changed = ingest(RunContext(ctx.artifacts_dir, ctx.dataset, "run3"), params, data_dir)
    assert changed["documents"].fp != refs["documents"].fp and changed["documents"].rows == 3
    assert ctx.store.events("run3")["status"].tolist() == ["computed"]


def test_question_types_from_each_shape():
    recs = [{"_id": "h", "question": "q?", "answer": "a", "supporting_facts": [], "type": "bridge"},
            {"id": "3hop1__12_34", "question": "q?", "answer": "a", "paragraphs": []},
            {"_id": "x", "question": "q?", "answer": "a", "supporting_facts": []}]
    questions, _ = parse_questions(recs, "q.json")
    assert questions["qtype"].tolist() == ["bridge", "3hop1", "unknown"]


def test_a_folder_is_scanned_once_a_run(tmp_path, monkeypatch):
    """The run manifest's dataset identity, ``ingest`` and ``evidence`` share one scan a run (the folder's bytes are
    hashed once, not once for the manifest and again for the scan); the identity follows the content, and the
    next run scans again."""
    from tasks.data import ingest as ingest_module
    from tasks.data.ingest import dataset_identity, read_corpus

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nAlpha text.\n", encoding="utf-8")
    (folder / "b.txt").write_text("Beta text.\n", encoding="utf-8")
    scans: list[str] = []
    real = ingest_module.scan
    monkeypatch.setattr(ingest_module, "scan", lambda kind, path: scans.append(path) or real(kind, path))
    params = UserCorpusParams(kind="folder", path=str(folder), shuffle_seed=None)
    first = dataset_identity(params, "", "run-1")
    assert read_corpus(params, "run-1") == read_corpus(params, "run-1") and len(scans) == 1
    assert dataset_identity(params, "", "run-2") == first and len(scans) == 2  # a new run scans again
    (folder / "b.txt").write_text("Beta text, edited.\n", encoding="utf-8")
    assert dataset_identity(params, "", "run-2") == first  # one scan a run: the run sees one listing
    assert dataset_identity(params, "", "run-3") != first
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([{"id": "q1", "question": "Which?", "answer": ["Beta"]}]), encoding="utf-8")
    with_questions = UserCorpusParams(kind="folder", path=str(folder), questions=str(questions), shuffle_seed=None)
    assert dataset_identity(with_questions, "", "run-3") != dataset_identity(params, "", "run-3")
