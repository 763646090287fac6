"""The streamed ``read`` and ``ingest`` stages (issue #58, item 1: memory bounded on a long corpus) give the same
tables as reading the whole corpus at once (:func:`tasks.data.ingest.load_dataset`, which keeps every document in
memory and writes nothing): passages, ids, lineage, order, sources, gold and the skipped report, on a corpus cut
into many batches, row groups and spill buckets."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import tasks.data.corpus as corpus
import tasks.data.ingest as ingest_module
from tasks.core.spill import SpillSort
from tasks.core.stage import RunContext
from tasks.core.store import Store
from tasks.data.corpus import SplitParams
from tasks.data.ingest import DOCUMENTS_SCHEMA, UserCorpusParams, ingest, load_dataset

PARAGRAPH = ("The {name} valve regulates the flow of coolant through loop {i}. Operators check its seal every "
             "{i} days and log the pressure. ")


def _corpus(tmp_path: Path) -> tuple[Path, Path]:
    """40 records of 1 to 40 paragraphs (most cut into several passages), an exact duplicate, two records sharing
    a title, a record that is not an object and one without text (skipped with ``on_error=skip``)."""
    records = [{"title": f"Manual {i}", "text": "".join(PARAGRAPH.format(name=f"N{i}-{j}", i=j) + "\n\n"
                                                         for j in range(1 + i % 40)), "year": 2000 + i}
               for i in range(40)]
    records += [records[3], {"title": "Manual 5", "text": "A second manual of that name, short."}]
    lines = [json.dumps(r) for r in records]
    lines.insert(7, "[1, 2]")
    lines.insert(20, json.dumps({"title": "no text"}))
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    questions = [{"_id": f"q{i}", "question": f"Which valve is in loop {i}?", "answer": f"N{i}",
                  "supporting_facts": [[f"Manual {i}", 0]], "context": []} for i in (2, 5, 17, 39, 99)]
    qpath = tmp_path / "questions.json"
    qpath.write_text(json.dumps(questions), encoding="utf-8")
    return path, qpath


@pytest.fixture
def small_batches(monkeypatch):
    """Every bound far below the corpus: read partitions of 5 documents, batches of 3, row groups of 2 rows, spill
    buckets of 4 KB."""
    monkeypatch.setattr(corpus, "READ_PARTITION_DOCUMENTS", 5)
    monkeypatch.setattr(ingest_module, "INGEST_BATCH_DOCUMENTS", 3)
    monkeypatch.setattr(ingest_module, "SPILL_BUCKET_BYTES", 4096)
    monkeypatch.setattr(corpus, "READ_ROW_GROUP_ROWS", 2)


@pytest.mark.parametrize("seed", [0, None], ids=["shuffled", "corpus-order"])
def test_streamed_ingest_equals_the_whole_corpus_read_at_once(tmp_path, small_batches, seed):
    path, qpath = _corpus(tmp_path)
    params = UserCorpusParams(kind="jsonl", path=str(path), questions=str(qpath), on_error="skip", shuffle_seed=seed,
                              split=SplitParams(max_tokens=48, overlap=8))
    docs, questions, gold, report = load_dataset(params, "")
    refs = ingest(RunContext(str(tmp_path / "a"), "ds", "run1"), params, "")

    streamed = Store.read(refs["documents"])
    assert len(docs) > 200 and docs["document"].nunique() < len(docs)  # several passages a document
    assert pq.ParquetFile(refs["documents"].path).num_row_groups > 1
    pd.testing.assert_frame_equal(streamed, docs)
    assert pq.read_schema(refs["documents"].path).remove_metadata() == DOCUMENTS_SCHEMA.remove_metadata()
    pd.testing.assert_frame_equal(Store.read(refs["gold"]), gold)
    pd.testing.assert_frame_equal(Store.read(refs["questions"]), questions)
    summary = json.loads(Store.read(refs["ingest_report"])["report"].iloc[0])
    assert summary["duplicate_records"] == report.n_duplicate_records > 0
    assert summary["records"] == report.n_records == 42 and summary["skipped"] == 2
    skipped = Store.read(refs["skipped"])
    assert skipped["source"].tolist() == ["corpus.jsonl#7", "corpus.jsonl#20"]
    assert skipped["reason"].str.contains("expected a JSON object|field 'text'").all()
    # the read stage's own table holds every document once, streamed from its row cache in small row groups
    read = Store.read(ctx_read(tmp_path))
    assert len(read) == 43 and read["key"].is_unique
    assert len(list((tmp_path / "a" / "_rows" / "read").rglob("part-*.parquet"))) == 9  # 43 documents by 5


def ctx_read(tmp_path: Path) -> Path:
    found = list((tmp_path / "a" / "ds" / "read").glob("read-*.parquet"))
    assert len(found) == 1
    return found[0]


def test_a_bad_document_with_on_error_fail_is_named_as_before(tmp_path, small_batches):
    """The first unreadable document is named and the rest counted, though it lies in a later batch than a
    passage over ``max_text_chars``: the same error as the whole corpus read at once."""
    path, qpath = _corpus(tmp_path)
    params = UserCorpusParams(kind="jsonl", path=str(path), on_error="fail", max_text_chars=100,
                              split=SplitParams(max_tokens=48, overlap=8))
    with pytest.raises(ValueError) as whole:
        load_dataset(params, "")
    with pytest.raises(ValueError) as streamed:
        ingest(RunContext(str(tmp_path / "a"), "ds", "run1"), params, "")
    assert str(streamed.value) == str(whole.value) and "record 7" in str(whole.value)
    assert "1 more file(s)" in str(whole.value)


def test_spill_sort_returns_rows_in_rank_order_and_leaves_no_file(tmp_path):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    rank = rng.permutation(1000)
    schema = pa.schema([("x", pa.int64())])
    spill = SpillSort(1000, 7, schema)
    for a in range(0, 1000, 64):
        spill.add(pa.table({"x": rank[a:a + 64] * 10}), rank[a:a + 64])
    folder = Path(spill._dir.name)
    out = pa.concat_tables(list(spill.sorted()))
    assert out.column("x").to_pylist() == list(range(0, 10000, 10)) and not folder.exists()


def test_a_stream_that_fails_midway_leaves_no_file(tmp_path):
    """A streamed output is written atomically: a batch that fails (a killed read, a damaged part) leaves neither the
    file nor its temp file."""
    import pyarrow as pa

    from tasks.core.files import TableStream, write_parquet_stream

    schema = pa.schema([("x", pa.int64())])

    def batches():
        yield pa.table({"x": [1, 2]})
        raise OSError("the row cache part vanished")

    target = tmp_path / "out" / "t.parquet"
    with pytest.raises(OSError, match="vanished"):
        write_parquet_stream(TableStream(schema, batches), target)
    assert list(tmp_path.rglob("*")) == [tmp_path / "out"]
    assert write_parquet_stream(TableStream(schema, lambda: [pa.table({"x": [3]})] * 3), target) == 3
    assert pq.read_table(target).column("x").to_pylist() == [3, 3, 3]
