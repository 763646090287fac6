"""Ingestion: raw corpora and questions → canonical ``documents``, ``questions``, ``gold`` tables.

Accepted inputs:
- HippoRAG format (``corpus.json`` list of ``{title, text}``; optional ``questions.json`` in the
  HotpotQA, 2WikiMultihopQA or MuSiQue shape),
- a JSONL file of ``{title, text, ...}`` records (extra fields kept as metadata),
- a folder of ``.txt``, ``.md``, ``.html`` and ``.pdf`` files (title = file stem),
- the generated sample (``tasks.data.sample``).

The ``documents`` table holds passages, the units every method indexes, with their lineage: ``document`` (the id
of the document they were cut from; their own id when unsplit), ``source``, ``page``, ``headings`` and the span
``char_start:char_end`` in the document's extracted text. ``sources`` holds one row per document. A user corpus is
read by the per-row ``read`` stage (:mod:`tasks.data.corpus`) and split (``dataset.split``); a HippoRAG corpus
and the sample are passages already and are split only when ``dataset.split.enabled`` is set.

Bad input raises :class:`IngestError` naming file, record index and field, before anything is written.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from tasks.data.corpus import (
    CorpusError,
    Entry,
    ReadParams,
    SplitParams,
    doc_id,
    listing_hash,
    model_folder,
    passages_of,
    read_entry,
    read_rows,
    scan,
    unreadable,
    where,
)
from tasks.data.readers import FORMATS, ReadDocument, UnreadableFile
from tasks.data.sample import generate_sample
from tasks.data.split import split_document
from tasks.core.stage import RunContext, StageParams, run_setting, run_stage, stage
from tasks.core.files import TableStream
from tasks.core.spill import SpillSort
from tasks.core.store import ArtifactRef, KeyedParquet
from tasks.core.limits import COUNT, COUNT0, one_of, within

log = logging.getLogger("dagrag.ingest")


class IngestError(ValueError):
    """Malformed input data; the message names the file, the record and the field."""

    def __init__(self, source: str, problem: str, index: int | None = None, field_name: str | None = None):
        where = source + (f", record {index}" if index is not None else "") + (
            f", field '{field_name}'" if field_name else "")
        super().__init__(f"{where}: {problem}")


@dataclass
class IngestReport:
    """What ingestion found besides the tables: duplicates and gold it could not resolve."""

    n_records: int = 0
    n_duplicate_records: int = 0
    unmatched_gold: list[tuple[str, str]] = field(default_factory=list)
    ambiguous_gold: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Counts and first examples, for logs and the run manifest."""
        return {"records": self.n_records, "duplicate_records": self.n_duplicate_records,
                "unmatched_gold": len(self.unmatched_gold), "unmatched_examples": self.unmatched_gold[:5],
                "ambiguous_gold": len(self.ambiguous_gold), "ambiguous_examples": self.ambiguous_gold[:5]}


# ----------------------------------------------------------------------------- reading files

def read_utf8(path: Path) -> str:
    """A file's text. Invalid UTF-8 is an :class:`IngestError` naming the line (and a JSONL file's record) and
    the byte offset of the first bad byte."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        before = data[:err.start].split(b"\n")
        record = sum(1 for line in before[:-1] if line.strip())  # a JSONL record's index (0-based, as elsewhere)
        where = f"line {len(before)}" + (f", record {record}" if path.suffix == ".jsonl" else "")
        raise IngestError(str(path), f"invalid UTF-8 at byte offset {err.start}, {where}: "
                          f"{data[err.start:err.start + 4]!r}; save the file as UTF-8 "
                          f"(e.g. iconv -f latin1 -t utf-8)") from None


def read_json_list(path: Path) -> list[Any]:
    """Parse a JSON file that must hold a list."""
    try:
        data = json.loads(read_utf8(path))
    except FileNotFoundError:
        raise IngestError(str(path), "file not found") from None
    except json.JSONDecodeError as err:
        raise IngestError(str(path), f"not valid JSON ({err})") from None
    if not isinstance(data, list):
        raise IngestError(str(path), f"expected a JSON list of records, got {type(data).__name__}")
    return data


def read_jsonl(path: Path) -> list[Any]:
    """Parse a JSONL file (one JSON object per non-empty line; lines end at ``\\n`` only; a UTF-8 BOM is
    dropped)."""
    if not path.exists():
        raise IngestError(str(path), "file not found")
    records = []
    text = read_utf8(path).removeprefix("\ufeff")
    if text.lstrip().startswith("["):
        raise IngestError(str(path), "a JSON array, not JSONL: use dataset=hipporag for a corpus.json list, or "
                          "write one JSON object per line")
    for i, line in enumerate(text.split("\n")):  # only \n ends a record: U+2028 is valid inside a JSON string
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise IngestError(str(path), f"line {i + 1} is not valid JSON ({err})", index=len(records)) from None
    return records


# ----------------------------------------------------------------------------- canonical tables

def _require(rec: Any, key: str, kind: type | tuple[type, ...], source: str, i: int) -> Any:
    if not isinstance(rec, dict):
        raise IngestError(source, f"expected an object, got {type(rec).__name__}", i)
    if key not in rec:
        raise IngestError(source, "missing", i, key)
    if not isinstance(rec[key], kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise IngestError(source, f"expected {names}, got {type(rec[key]).__name__}", i, key)
    return rec[key]


def canonical_documents(records: list[Any], source: str, report: IngestReport,
                        max_text_chars: int | None = None) -> pd.DataFrame:
    """Validate ``{title, text}`` records → ``documents(doc_id, title, text)``, duplicates removed; a text longer
    than ``max_text_chars`` (None: no limit) is refused."""
    if not records:
        raise IngestError(source, "the corpus is empty")
    rows = []
    for i, rec in enumerate(records):
        title = _require(rec, "title", str, source, i)
        text = _require(rec, "text", str, source, i)
        if not (title.strip() or text.strip()):
            raise IngestError(source, "both title and text are empty", i, "text")
        if max_text_chars is not None and len(text) > max_text_chars:
            raise IngestError(source, f"{len(text):,} characters (title {title[:60]!r}), over dataset.max_text_chars="
                              f"{max_text_chars}: shorten or split the record, or raise the limit", i, "text")
        rows.append((doc_id(title, text), title, text))
    docs = pd.DataFrame(rows, columns=["doc_id", "title", "text"])
    report.n_records = len(docs)
    deduped = docs.drop_duplicates("doc_id", keep="first").reset_index(drop=True)
    report.n_duplicate_records = len(docs) - len(deduped)
    return deduped


def shuffle_documents(docs: pd.DataFrame, seed: int | None) -> pd.DataFrame:
    """Seeded shuffle of corpus order (benchmark files list passages question by question), stable under
    growth: documents are sorted by a seeded hash of their ``doc_id``, so a grown corpus keeps its old
    documents in the same relative order and only places the new ones among them.

    A permutation of positions reordered the whole corpus when it grew, and every stage that reads corpus
    order changed with it: on a 5% growth of hotpotqa-100, 476 of the 629 ArchRAG descriptions that changed
    had only had their sentences reordered.
    """
    if seed is None:
        return docs
    ids = docs["doc_id"].astype(str).to_numpy(dtype=object)
    order = np.lexsort((ids, shuffle_keys(ids, seed)))  # by the hash; a (2^-64) tie by doc_id
    return docs.iloc[order].reset_index(drop=True)


def shuffle_keys(ids: Iterable[str], seed: int) -> np.ndarray:
    """The seeded hash of each ``doc_id`` that :func:`shuffle_documents` sorts by (and the streamed ingest of a user
    corpus, :func:`stream_corpus_tables`)."""
    ids = list(ids)
    salt = str(seed).encode()
    return np.fromiter((int.from_bytes(hashlib.blake2b(d.encode(), digest_size=8, salt=salt[:16]).digest(), "big")
                        for d in ids), dtype=np.uint64, count=len(ids))


def _answers(rec: dict, source: str, i: int) -> list[str]:
    answer = _require(rec, "answer", (str, int, float, bool), source, i)
    aliases = rec.get("answer_aliases") or rec.get("aliases") or []
    if not isinstance(aliases, list):
        raise IngestError(source, "expected a list", i, "answer_aliases")
    out = [str(answer)] + [str(a) for a in aliases]
    return list(dict.fromkeys(out))


def _gold_hotpot(rec: dict, source: str, i: int) -> list[tuple[str, str | None]]:
    """(title, text-or-None) of the gold passages of a HotpotQA / 2Wiki record."""
    facts = _require(rec, "supporting_facts", list, source, i)
    context = rec.get("context") or []
    texts = {}
    for item in context:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[1], list):
            texts[item[0]] = "".join(str(s) for s in item[1])
    titles = []
    for fact in facts:
        if not (isinstance(fact, list) and fact and isinstance(fact[0], str)):
            raise IngestError(source, "expected [title, sentence_index] pairs", i, "supporting_facts")
        titles.append(fact[0])
    return [(t, texts.get(t)) for t in dict.fromkeys(titles)]


def _gold_musique(rec: dict, source: str, i: int) -> list[tuple[str, str | None]]:
    """(title, text) of the supporting paragraphs of a MuSiQue record."""
    paragraphs = _require(rec, "paragraphs", list, source, i)
    out = []
    for p in paragraphs:
        if not isinstance(p, dict) or "title" not in p or "paragraph_text" not in p:
            raise IngestError(source, "each paragraph needs title and paragraph_text", i, "paragraphs")
        if p.get("is_supporting"):
            out.append((p["title"], p["paragraph_text"]))
    return out


def _question_type(rec: dict) -> str:
    """HotpotQA/2Wiki ``type`` (bridge, comparison, ...), MuSiQue's hop count from its id (``2hop__…``)."""
    if isinstance(rec.get("type"), str):
        return rec["type"]
    qid = str(rec.get("id", ""))
    return qid.split("__", 1)[0] if "__" in qid else "unknown"


def _answer_span(rec: dict, source: str, i: int) -> tuple[int | None, int | None]:
    """A long-document question's ``answer_span: {start, end}``: its answer's character offsets in its gold
    document (``tasks.data.longdocs``), or (None, None)."""
    span = rec.get("answer_span")
    if span is None:
        return None, None
    if not (isinstance(span, dict) and isinstance(span.get("start"), int) and isinstance(span.get("end"), int)
            and 0 <= span["start"] <= span["end"]):
        raise IngestError(source, "expected {start, end} with 0 <= start <= end (character offsets)", i,
                          "answer_span")
    return span["start"], span["end"]


def parse_questions(records: list[Any], source: str) -> tuple[pd.DataFrame, list[tuple[str, list]]]:
    """Questions in any of the three HippoRAG shapes → ``questions`` and per-question gold keys."""
    rows, gold_keys = [], []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise IngestError(source, f"expected an object, got {type(rec).__name__}", i)
        qid = rec.get("_id", rec.get("id"))
        if qid is None:
            raise IngestError(source, "missing (expected '_id' or 'id')", i, "_id")
        question = _require(rec, "question", str, source, i)
        gold = _gold_musique(rec, source, i) if "paragraphs" in rec else _gold_hotpot(rec, source, i)
        rows.append((str(qid), question, _answers(rec, source, i), _question_type(rec), *_answer_span(rec, source, i)))
        gold_keys.append((str(qid), gold))
    questions = pd.DataFrame(rows, columns=["qid", "question", "answers", "qtype", "span_start", "span_end"])
    if questions["span_start"].isna().all():  # no answer spans (the benchmarks): the table keeps its four columns
        questions = questions.drop(columns=["span_start", "span_end"])
    else:
        questions = questions.astype({"span_start": "Int64", "span_end": "Int64"})
    dup = questions["qid"].duplicated()
    if dup.any():
        raise IngestError(source, f"duplicate question id {questions.qid[dup].iloc[0]!r}",
                          int(np.flatnonzero(dup.to_numpy())[0]), "_id")
    return questions, gold_keys


def read_user_questions(path: Path) -> pd.DataFrame:
    """A user's own questions → ``questions(qid, question)``; no gold, no answers needed.

    ``.jsonl``: one JSON object per line with a ``question`` field (``id``/``_id`` kept as the qid), or a JSON
    string; ``.json``: a list of such objects (any HippoRAG shape, with or without gold) or of strings; any other
    file: one question per non-empty line. A problem names the file, the line or record, and the field.
    """
    source = str(path)
    if not path.is_file():
        raise IngestError(source, "file not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise IngestError(source, f"not UTF-8 at line {line} (byte offset {err.start})") from None
    if path.suffix == ".json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise IngestError(source, f"not valid JSON ({err})") from None
        if not isinstance(records, list):
            raise IngestError(source, f"expected a JSON list of questions, got {type(records).__name__}")
        where = "record"
    elif path.suffix == ".jsonl":
        records = []
        for number, line in enumerate(text.split("\n"), start=1):  # \n only: U+2028 may be inside a string
            if line.strip():
                try:
                    records.append((number, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise IngestError(source, f"line {number} is not valid JSON ({err})") from None
        where = "line"
    else:
        records = [ln.strip() for ln in text.split("\n") if ln.strip()]
        where = "line"
    rows = []
    for i, item in enumerate(records):
        number, rec = item if where == "line" and path.suffix == ".jsonl" else (i + 1, item)
        if isinstance(rec, dict):
            question, qid = rec.get("question"), rec.get("_id", rec.get("id"))
        else:
            question, qid = rec, None
        if not isinstance(question, str) or not question.strip():
            raise IngestError(source, f"{where} {number}: expected a non-empty question string"
                              + (" in field 'question'" if isinstance(rec, dict) else ""))
        rows.append((str(qid) if qid is not None else f"q{len(rows) + 1}", question.strip()))
    if not rows:
        raise IngestError(source, "holds no questions")
    frame = pd.DataFrame(rows, columns=["qid", "question"])
    dup = frame["qid"].duplicated()
    if dup.any():
        raise IngestError(source, f"duplicate question id {frame['qid'][dup].iloc[0]!r}")
    return frame


def match_gold(docs: pd.DataFrame, gold_keys: Iterable[tuple[str, list]], report: IngestReport) -> pd.DataFrame:
    """Resolve (title, text) gold keys to doc ids: exact text first, else the title if unique."""
    by_title: dict[str, list[int]] = {}
    for pos, title in enumerate(docs["title"].tolist()):
        by_title.setdefault(title, []).append(pos)
    ids, texts = docs["doc_id"].tolist(), docs["text"].tolist()
    rows = []
    for qid, keys in gold_keys:
        for title, text in keys:
            cands = by_title.get(title, [])
            exact = [p for p in cands if text is not None and texts[p].strip() == text.strip()]
            chosen = exact or cands
            if not chosen:
                report.unmatched_gold.append((qid, title))
            elif len(chosen) > 1:
                report.ambiguous_gold.append((qid, title))
            rows.extend((qid, ids[p]) for p in chosen)
    return pd.DataFrame(rows, columns=["qid", "doc_id"]).drop_duplicates().reset_index(drop=True)


# ----------------------------------------------------------------------------- dataset configs

@dataclass(frozen=True)
class SampleParams:
    """``dataset=sample``: the generated fictional multi-hop corpus (``tasks.data.sample``)."""

    kind: str = "sample"
    name: str = "sample"
    n_passages: int = field(default=300, metadata=within("[20, inf)"))
    n_questions: int = field(default=60, metadata=COUNT0)
    seed: int = 0
    shuffle_seed: int | None = field(default=0, metadata=COUNT0)
    # a longer passage is refused, naming its record (None: any length)
    max_text_chars: int | None = field(default=None, metadata=COUNT)
    split: SplitParams = field(default_factory=lambda: SplitParams(enabled=False))  # passages already


@dataclass(frozen=True)
class HippoRAGParams:
    """``dataset=hipporag``: ``<data_dir>/<name>/corpus.json`` (+ optional ``questions.json``)."""

    kind: str = "hipporag"
    name: str = "hotpotqa-100"
    shuffle_seed: int | None = field(default=0, metadata=COUNT0)
    # a longer passage is refused, naming its record (None: any length)
    max_text_chars: int | None = field(default=None, metadata=COUNT)
    # benchmark passages are passages already, gold per passage: unsplit by default
    split: SplitParams = field(default_factory=lambda: SplitParams(enabled=False))


@dataclass(frozen=True)
class UserCorpusParams:
    """``dataset=jsonl`` / ``dataset=folder``: a user corpus, with an optional questions file."""

    kind: str = field(default="jsonl", metadata=one_of(('jsonl', 'folder')))
    name: str = "corpus"
    path: str = ""
    questions: str | None = None
    shuffle_seed: int | None = field(default=0, metadata=COUNT0)
    # a longer passage is refused, naming its record (None: any length)
    max_text_chars: int | None = field(default=None, metadata=COUNT)
    split: SplitParams = field(default_factory=SplitParams)
    # a file that cannot be read: fail names it; skip leaves it out and reports it
    on_error: str = field(default="fail", metadata=one_of(("fail", "skip")))


DatasetParams = SampleParams | HippoRAGParams | UserCorpusParams
DATASET_KINDS: dict[str, type] = {"sample": SampleParams, "hipporag": HippoRAGParams,
                                  "jsonl": UserCorpusParams, "folder": UserCorpusParams}


def dataset_label(params: DatasetParams) -> str:
    """Folder name of a dataset's artifacts."""
    if isinstance(params, SampleParams):
        return f"sample-{params.n_passages}-s{params.seed}"
    return params.name


def raw_sources(params: DatasetParams, data_dir: str) -> tuple[list[Path], Path | None]:
    """The files a dataset is read from: (corpus files, questions file or None); a user corpus's file or
    folder."""
    if isinstance(params, HippoRAGParams):
        root = Path(data_dir) / params.name
        if not (root / "corpus.json").exists():
            raise IngestError(str(root / "corpus.json"), f"file not found (dataset.name={params.name!r}, "
                              f"data_dir={data_dir!r}: expected DIR/NAME/corpus.json)")
        q = root / "questions.json"
        return [root / "corpus.json"], (q if q.exists() else None)
    if isinstance(params, UserCorpusParams):
        if not params.path:
            raise IngestError(f"dataset={params.kind}", "set dataset.path to the corpus file or folder")
        path = Path(params.path)
        if params.kind == "folder" and not path.is_dir():
            raise IngestError(str(path), "not a folder (dataset.path of dataset=folder)")
        files = [path]  # a folder's files are listed by the scan (tasks.data.corpus.scan)
        qpath = Path(params.questions) if params.questions else None
        for p in ([path] if params.kind == "jsonl" else []) + ([qpath] if qpath else []):
            if not p.is_file():  # before content_hash reads it: an IngestError, not an OSError
                raise IngestError(str(p), "file not found")
        return files, qpath
    return [], None


def sample_records(n_passages: int, n_questions: int, seed: int) -> tuple[list[Any], list[Any]]:
    """(corpus records, question records) of the generated sample (:mod:`tasks.data.sample`)."""
    return generate_sample(n_passages, n_questions, seed)


def question_file_records(qpath: Path | None) -> list[Any]:
    """The records of a questions file (JSON list or JSONL); none without one."""
    if qpath is None:
        return []
    return read_jsonl(qpath) if qpath.suffix == ".jsonl" else read_json_list(qpath)


def corpus_file_records(kind: str, corpus: Path) -> list[Any]:
    """The ``{title, text}`` records of a corpus file (``hipporag``: JSON list; ``jsonl``: one object a line)."""
    return read_json_list(corpus) if kind == "hipporag" else read_jsonl(corpus)


def passage_tables(docs: pd.DataFrame, split: SplitParams) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Canonical ``documents(doc_id, title, text)`` that are passages already (HippoRAG, the sample) → the
    ``documents`` table with lineage, and ``sources``. Unsplit (the default), each passage is its own document,
    spanning its whole text; with ``split.enabled`` a long one is cut, each piece naming it as its ``document``."""
    folder = model_folder(split)
    rows = []
    for d, title, text in docs[["doc_id", "title", "text"]].itertuples(index=False):
        pieces = split_document(ReadDocument(text), folder, split.max_tokens, split.overlap) if folder else []
        if len(pieces) <= 1:
            rows.append((d, title, text, d, 0, len(text)))
        else:
            rows.extend((doc_id(title, text[p.start:p.end]), title, text[p.start:p.end], d, p.start, p.end)
                        for p in pieces)
    out = pd.DataFrame(rows, columns=["doc_id", "title", "text", "document", "char_start", "char_end"])
    out = out.drop_duplicates("doc_id", keep="first").reset_index(drop=True)
    n = len(out)
    out = out.assign(source=pd.array([None] * n, dtype="string"), page=pd.array([None] * n, dtype="Int64"),
                     headings=[[] for _ in range(n)])
    counts = out.groupby("document", sort=False).size()
    sources = pd.DataFrame({"document": docs["doc_id"], "source": pd.array([None] * len(docs), dtype="string"),
                            "title": docs["title"], "content_hash": pd.array([None] * len(docs), dtype="string"),
                            "mtime": np.full(len(docs), np.nan), "n_passages": docs["doc_id"].map(counts).fillna(0)
                            .astype(int), "metadata": "{}"})
    return out[LINEAGE_COLUMNS], sources


# the documents table: passages and their lineage (docs/own-documents.md)
LINEAGE_COLUMNS = ["doc_id", "title", "text", "document", "source", "page", "headings", "char_start", "char_end"]


def canonical_tables(corpus: list[Any], source: str, qrecs: list[Any], qsource: str, max_text_chars: int | None,
                     shuffle_seed: int | None, split: SplitParams | None = None
                     ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, IngestReport, pd.DataFrame]:
    """Validated records → (documents, questions, gold, report, sources); gold names source passages."""
    report = IngestReport()
    docs = canonical_documents(corpus, source, report, max_text_chars)
    questions, gold_keys = parse_questions(qrecs, qsource)
    gold = match_gold(docs, gold_keys, report)
    passages, sources = passage_tables(docs, split or SplitParams(enabled=False))
    return shuffle_documents(passages, shuffle_seed), questions, gold, report, sources


def corpus_tables(kind: str, path: str, entries: list[Entry], scan_skipped: list[tuple[str, str]],
                  rows: pd.DataFrame, on_error: str, qpath: Path | None, max_text_chars: int | None,
                  shuffle_seed: int | None
                  ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, IngestReport, pd.DataFrame, pd.DataFrame]:
    """A scanned user corpus and its ``read`` rows → (documents, questions, gold, report, sources, skipped)."""
    if scan_skipped and on_error == "fail":
        src, reason = scan_skipped[0]
        raise IngestError(path, f"{where(src)}: {reason} (dataset.on_error=skip skips such files and reports them)")

    try:
        passages, sources, skipped = passages_of(entries, rows, on_error, title_rule(kind))
    except UnreadableFile as err:
        raise IngestError(path, str(err)) from None
    skipped = list(scan_skipped) + skipped
    if not passages:
        raise IngestError(path, "the corpus is empty" + (f": all {len(skipped)} files were skipped" if skipped else
                                                         f" (no {', '.join(sorted(FORMATS))} files)"
                                                         if kind == "folder" else ""))
    report = IngestReport(n_records=len(sources))
    docs = documents_frame(passages)
    if max_text_chars is not None:
        long = docs["text"].str.len() > max_text_chars
        if long.any():
            first = docs[long].iloc[0]
            raise IngestError(path, f"a passage of {len(first.text):,} characters in {where(first.source)}, over "
                              f"dataset.max_text_chars={max_text_chars}: lower dataset.split.max_tokens or raise "
                              f"the limit")
    n = len(docs)
    docs = docs.drop_duplicates("doc_id", keep="first").reset_index(drop=True)
    report.n_duplicate_records = n - len(docs)
    sources_df = pd.DataFrame(sources, columns=["document", "source", "title", "content_hash", "mtime", "n_passages",
                                                "metadata"])
    text_of = dict(zip(rows["key"], rows["text"]))
    whole = pd.DataFrame({"doc_id": sources_df["document"], "title": sources_df["title"],
                          "text": [text_of[k] for k in sources_df["content_hash"]]})
    questions, gold_keys = parse_questions(question_file_records(qpath), str(qpath))
    gold = match_gold(whole.drop_duplicates("doc_id"), gold_keys, report)
    skipped_df = pd.DataFrame(skipped, columns=["source", "reason"])
    return shuffle_documents(docs, shuffle_seed), questions, gold, report, sources_df, skipped_df


def title_rule(kind: str) -> Callable[[Entry, Any], str]:
    """A user document's title: its record's ``title`` (JSONL), its file's stem (a folder)."""
    def title_of(entry: Entry, row: Any) -> str:
        return str(row["title"]) if kind == "jsonl" else Path(entry.source).stem

    return title_of


def documents_frame(passages: list[dict[str, Any]]) -> pd.DataFrame:
    """Passage rows (:func:`tasks.data.corpus.passages_of`) → a ``documents`` frame with its column types."""
    docs = pd.DataFrame(passages, columns=LINEAGE_COLUMNS)
    docs["page"] = docs["page"].astype("Int64")
    return docs


# the documents table's Arrow schema, as pandas writes it for a frame of documents_frame (streamed batches keep it)
DOCUMENTS_SCHEMA = pa.Schema.from_pandas(documents_frame([{
    "doc_id": "", "title": "", "text": "", "document": "", "source": "", "page": 1, "headings": [""],
    "char_start": 0, "char_end": 0}]), preserve_index=False)
# documents a batch of the streamed ingest reads at once, and passage text (bytes) a spill bucket holds while the
# passages are put in corpus order: they bound its memory and change no result; engineering, not from a paper
INGEST_BATCH_DOCUMENTS = 256
SPILL_BUCKET_BYTES = 16 * 2**20


def _batches(entries: list[Entry], reader: KeyedParquet) -> Iterator[tuple[list[Entry], pd.DataFrame]]:
    """The scan's entries a batch at a time, with their ``read`` rows."""
    for a in range(0, len(entries), INGEST_BATCH_DOCUMENTS):
        batch = entries[a:a + INGEST_BATCH_DOCUMENTS]
        yield batch, reader.take(list(dict.fromkeys(e.key for e in batch))).to_pandas()


def stream_corpus_tables(kind: str, path: str, entries: list[Entry], scan_skipped: list[tuple[str, str]],
                         reader: KeyedParquet, on_error: str, qpath: Path | None, max_text_chars: int | None,
                         shuffle_seed: int | None
                         ) -> tuple[TableStream, pd.DataFrame, pd.DataFrame, IngestReport, pd.DataFrame,
                                    pd.DataFrame]:
    """:func:`corpus_tables` in bounded memory: (documents as a stream, questions, gold, report, sources, skipped),
    the same tables. The ``read`` rows are fetched by key a batch of documents at a time, twice:
    a first pass keeps each passage's id (and the few whole texts that gold titles name), a second puts the passages
    in corpus order through spill files (:class:`tasks.core.spill.SpillSort`)."""
    if scan_skipped and on_error == "fail":
        src, reason = scan_skipped[0]
        raise IngestError(path, f"{where(src)}: {reason} (dataset.on_error=skip skips such files and reports them)")
    title_of = title_rule(kind)
    questions, gold_keys = parse_questions(question_file_records(qpath), str(qpath))
    gold_titles = {title for _, keys in gold_keys for title, _ in keys}
    ids, sizes, sources, skipped, whole, long = [], [], [], [], [], None
    for batch, rows in _batches(entries, reader):
        passages, batch_sources, batch_skipped = passages_of(batch, rows, "skip", title_of)
        ids.append(np.array([p["doc_id"] for p in passages], dtype="S"))
        sizes.append(np.array([len(p["text"]) for p in passages], dtype=np.int64))
        if long is None and max_text_chars is not None:
            long = next((p for p in passages if len(p["text"]) > max_text_chars), None)
        text_of = dict(zip(rows["key"], rows["text"]))
        whole.extend((s["document"], s["title"], text_of[s["content_hash"]]) for s in batch_sources
                     if s["title"] in gold_titles)
        sources.extend(batch_sources)
        skipped.extend(batch_skipped)
    if skipped and on_error == "fail":
        raise IngestError(path, str(unreadable(skipped)))
    skipped = list(scan_skipped) + skipped
    all_ids = np.concatenate(ids) if ids else np.array([], dtype="S")
    if not len(all_ids):
        raise IngestError(path, "the corpus is empty" + (f": all {len(skipped)} files were skipped" if skipped else
                                                         f" (no {', '.join(sorted(FORMATS))} files)"
                                                         if kind == "folder" else ""))
    if long is not None:
        raise IngestError(path, f"a passage of {len(long['text']):,} characters in {where(long['source'])}, over "
                          f"dataset.max_text_chars={max_text_chars}: lower dataset.split.max_tokens or raise the limit")
    report = IngestReport(n_records=len(sources))
    keep = np.zeros(len(all_ids), dtype=bool)
    keep[np.unique(all_ids, return_index=True)[1]] = True  # a passage's first occurrence
    report.n_duplicate_records = int(len(all_ids) - keep.sum())
    kept = all_ids[keep]
    order = np.arange(len(kept)) if shuffle_seed is None else np.lexsort(
        (kept, shuffle_keys((d.decode() for d in kept), shuffle_seed)))  # shuffle_documents' order
    rank = np.full(len(all_ids), -1, dtype=np.int64)
    rank[np.flatnonzero(keep)[order]] = np.arange(len(kept))
    spill = SpillSort(len(kept), -(-int(np.concatenate(sizes)[keep].sum()) // SPILL_BUCKET_BYTES), DOCUMENTS_SCHEMA)
    start = 0
    for batch, rows in _batches(entries, reader):
        frame = documents_frame(passages_of(batch, rows, "skip", title_of)[0])
        here = slice(start, start + len(frame))
        start += len(frame)
        table = pa.Table.from_pandas(frame, schema=DOCUMENTS_SCHEMA, preserve_index=False)
        spill.add(table.filter(pa.array(keep[here])), rank[here][keep[here]])
    sources_df = pd.DataFrame(sources, columns=["document", "source", "title", "content_hash", "mtime", "n_passages",
                                                "metadata"])
    whole_df = pd.DataFrame(whole, columns=["doc_id", "title", "text"])
    gold = match_gold(whole_df.drop_duplicates("doc_id"), gold_keys, report)
    skipped_df = pd.DataFrame(skipped, columns=["source", "reason"])
    return (TableStream(DOCUMENTS_SCHEMA, spill.sorted, rows=len(kept)), questions, gold, report, sources_df,
            skipped_df)


def corpus_counts(params: UserCorpusParams) -> tuple[int, int]:
    """(documents, questions) of a user corpus by a scan alone, for checks before a run: the documents are not
    read here (the ``read`` stage reads each once, cached), so a bad file is named by the run, not before it."""
    _, qpath = raw_sources(params, "")
    entries, skipped = read_corpus(params)
    if not entries and not skipped:
        raise IngestError(params.path, "the corpus is empty" + (f" (no {', '.join(sorted(FORMATS))} files)"
                                                                if params.kind == "folder" else ""))
    return len(entries), len(parse_questions(question_file_records(qpath), str(qpath))[0])


def read_corpus(params: UserCorpusParams, run_id: str | None = None) -> tuple[list[Entry], list[tuple[str, str]]]:
    """:func:`tasks.data.corpus.scan` of a user corpus, its problems as :class:`IngestError`. With ``run_id``, one
    scan per run: the run manifest's dataset identity, ``ingest`` and ``evidence`` share it, so a folder's bytes
    are hashed once a run (and read once more by the ``read`` stage, for new and changed files only)."""
    try:
        return _run_scan(run_id, params.kind, params.path) if run_id else scan(params.kind, params.path)
    except CorpusError as err:
        raise IngestError(params.path, str(err).removeprefix(f"{params.path}: ")) from None


@functools.lru_cache(maxsize=1)  # the current run's scan only: the next run scans again
def _run_scan(run_id: str, kind: str, path: str) -> tuple[list[Entry], list[tuple[str, str]]]:
    return scan(kind, path)


def dataset_identity(params: DatasetParams, data_dir: str, run_id: str | None = None) -> str:
    """The identity of a dataset's content (the run manifest's ``dataset_content_hash``; the ``evidence`` stage's
    input): a user corpus by its scan (:func:`tasks.data.corpus.listing_hash`: each document's content key and
    source) and its questions file's bytes, a HippoRAG dataset by its files' bytes; ``generated`` for the
    sample."""
    if isinstance(params, SampleParams):
        return "generated"
    files, qpath = raw_sources(params, data_dir)
    if isinstance(params, UserCorpusParams):
        listing = listing_hash(*read_corpus(params, run_id))
        return hashlib.sha256(f"{listing}\x1f{content_hash([qpath]) if qpath else 'none'}".encode()).hexdigest()[:16]
    return content_hash(files + ([qpath] if qpath else []))


def corpus_path(params: HippoRAGParams | UserCorpusParams, data_dir: str) -> Path:
    """Where a dataset's corpus is: ``<data_dir>/<name>/corpus.json``, or ``dataset.path``."""
    return Path(data_dir) / params.name / "corpus.json" if isinstance(params, HippoRAGParams) else Path(params.path)


def load_dataset(params: DatasetParams, data_dir: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, IngestReport]:
    """Read and validate a dataset → (documents, questions, gold, report); nothing is written."""
    if isinstance(params, SampleParams):
        corpus, qrecs = sample_records(params.n_passages, params.n_questions, params.seed)
        return canonical_tables(corpus, "sample", qrecs, "sample", params.max_text_chars, params.shuffle_seed,
                                params.split)[:4]
    _, qpath = raw_sources(params, data_dir)
    corpus = corpus_path(params, data_dir)
    if isinstance(params, UserCorpusParams):  # every document read and split here, nothing cached
        entries, skipped = read_corpus(params)
        folder = model_folder(params.split)
        try:
            rows = pd.DataFrame([read_entry(e, params.split, folder) for e in {e.key: e for e in entries}.values()],
                                columns=["key", "title", "text", "metadata", "starts", "ends", "pages", "headings",
                                         "error"])
        except UnreadableFile as err:
            raise IngestError(params.path, str(err)) from None
        return corpus_tables(params.kind, params.path, entries, skipped, rows, params.on_error, qpath,
                             params.max_text_chars, params.shuffle_seed)[:4]
    return canonical_tables(corpus_file_records(params.kind, corpus), str(corpus), question_file_records(qpath),
                            str(qpath), params.max_text_chars, params.shuffle_seed, params.split)[:4]


def content_hash(paths: list[Path]) -> str:
    """Hash of the raw bytes of a dataset's files (the run manifest's dataset identity)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        try:
            h.update(p.read_bytes())
        except OSError as err:  # vanished or unreadable: the read stage names it (dataset.on_error)
            h.update(f"unreadable: {type(err).__name__}".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class SampleIngestParams(StageParams):
    """``ingest`` of the generated sample: its size and seeds, its splitting; ``max_text_chars`` only refuses
    input."""

    SOURCES = ("dataset",)
    n_passages: int
    n_questions: int
    seed: int
    shuffle_seed: int | None
    split: SplitParams
    max_text_chars: int | None = run_setting()


@dataclass(frozen=True)
class FileIngestParams(StageParams):
    """``ingest`` of a HippoRAG corpus file (its bytes are its input): which reader, the corpus order, its
    splitting; ``max_text_chars`` only refuses input."""

    SOURCES = ("dataset",)
    kind: str
    shuffle_seed: int | None
    split: SplitParams
    max_text_chars: int | None = run_setting()


@dataclass(frozen=True)
class CorpusIngestParams(StageParams):
    """``ingest`` of a user corpus (``jsonl``, ``folder``) from its ``read`` rows: the titles' rule, the corpus
    order, what a bad file does; ``max_text_chars`` only refuses input."""

    SOURCES = ("dataset",)
    kind: str
    shuffle_seed: int | None
    on_error: str
    max_text_chars: int | None = run_setting()


def ingest(ctx: RunContext, params: DatasetParams, data_dir: str) -> dict[str, ArtifactRef]:
    """The ``ingest`` stage of the dataset's kind: the generated sample, a HippoRAG file, or a user corpus (its
    ``read`` stage first)."""
    dataset = SimpleNamespace(dataset=params)
    if isinstance(params, SampleParams):
        return ingest_sample(ctx, SampleIngestParams.of(dataset))
    files, qpath = raw_sources(params, data_dir)
    if isinstance(params, UserCorpusParams):
        # one scan per computing run; opening or planning an index (a fixed run id, maybe in a long-lived server
        # that reopens it after the corpus changed) scans afresh each time
        entries, skipped = read_corpus(params, None if ctx.direct else ctx.run_id)
        listing = listing_hash(entries, skipped)
        try:
            read = read_rows(ctx, ReadParams.of(dataset, kind=params.kind), entries, listing)
        except UnreadableFile as err:
            raise IngestError(params.path, str(err)) from None
        return ingest_corpus(ctx, CorpusIngestParams.of(dataset), params.path, read["read"], entries, skipped, listing,
                             str(qpath) if qpath else None, content_hash([qpath]) if qpath else "none")
    raw = content_hash(files + ([qpath] if qpath else []))
    return ingest_files(ctx, FileIngestParams.of(dataset), str(corpus_path(params, data_dir)),
                        str(qpath) if qpath else None, raw)


def _ingest_outputs(docs: pd.DataFrame, questions: pd.DataFrame, gold: pd.DataFrame, report: IngestReport,
                    sources: pd.DataFrame, skipped: pd.DataFrame | None = None
                    ) -> tuple[dict[str, pd.DataFrame], int]:
    """The ``ingest`` stage's tables, its report logged. ``docs`` may also be a :class:`TableStream` with its row
    count (a user corpus's, streamed)."""
    summary = report.summary()
    if summary["unmatched_gold"] or summary["ambiguous_gold"]:
        log.warning("gold passages: %d not found in the corpus (e.g. %s), %d matched several passages "
                    "(e.g. %s)", summary["unmatched_gold"], summary["unmatched_examples"],
                    summary["ambiguous_gold"], summary["ambiguous_examples"])
    if summary["duplicate_records"]:
        log.warning("corpus: %d duplicate (title, text) records kept once", summary["duplicate_records"])
    skipped = skipped if skipped is not None else pd.DataFrame(columns=["source", "reason"], dtype="string")
    if len(skipped):
        log.warning("corpus: %d file(s) skipped (dataset.on_error=skip), e.g. %s: %s", len(skipped),
                    skipped["source"].iloc[0], skipped["reason"].iloc[0])
    report_df = pd.DataFrame([{"report": json.dumps({**summary, "skipped": len(skipped)})}])
    return {"documents": docs, "questions": questions, "gold": gold, "ingest_report": report_df,
            "sources": sources, "skipped": skipped.astype("string")}, len(docs)


@stage("ingest", params=SampleIngestParams)
def ingest_sample(ctx: RunContext, params: SampleIngestParams) -> dict[str, ArtifactRef]:
    """Stage: canonical ``documents``, ``sources``, ``questions`` and ``gold`` tables of the generated sample."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        corpus, qrecs = sample_records(params.n_passages, params.n_questions, params.seed)
        return _ingest_outputs(*canonical_tables(corpus, "sample", qrecs, "sample", params.max_text_chars,
                                                 params.shuffle_seed, params.split))

    return run_stage(ctx, params, {"content": content_hash([])}, compute)


@stage("ingest", params=FileIngestParams)
def ingest_files(ctx: RunContext, params: FileIngestParams, corpus: str, questions: str | None,
                 content: str) -> dict[str, ArtifactRef]:
    """Stage: canonical ``documents``, ``sources``, ``questions`` and ``gold`` tables of a HippoRAG corpus file
    (and its questions file), whose bytes hash to ``content``."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        qpath = Path(questions) if questions else None
        return _ingest_outputs(*canonical_tables(corpus_file_records(params.kind, Path(corpus)), corpus,
                                                 question_file_records(qpath), str(qpath), params.max_text_chars,
                                                 params.shuffle_seed, params.split))

    return run_stage(ctx, params, {"content": content}, compute)


@stage("ingest", params=CorpusIngestParams)
def ingest_corpus(ctx: RunContext, params: CorpusIngestParams, corpus: str, read: ArtifactRef, entries: list[Entry],
                  skipped: list[tuple[str, str]], listing: str, questions: str | None,
                  questions_content: str) -> dict[str, ArtifactRef]:
    """Stage: the ``documents`` (passages with lineage), ``sources``, ``questions``, ``gold`` and ``skipped``
    tables of a user corpus, from its ``read`` rows and its scan (whose identity is ``listing``)."""
    def compute() -> tuple[dict[str, pd.DataFrame | TableStream], int]:
        # streamed: the documents' texts are read a batch at a time and never all held (issue #58, item 1)
        docs, qs, gold, report, sources, skipped_df = stream_corpus_tables(
            params.kind, corpus, entries, skipped, ctx.store.keyed(read, "key"),
            params.on_error, Path(questions) if questions else None, params.max_text_chars, params.shuffle_seed)
        return _ingest_outputs(docs, qs, gold, report, sources, skipped_df)

    return run_stage(ctx, params, {"read": read.fp, "listing": listing, "questions": questions_content}, compute)


# ----------------------------------------------------------------------------- gold evidence sentences

def supporting_sentences(records: list[Any]) -> pd.DataFrame:
    """Gold supporting sentences of HotpotQA / 2Wiki records → ``(qid, title, sent_idx, sentence)``.

    A supporting fact is ``[title, sentence_index]`` into that title's sentence list in ``context``. A fact
    whose index is null (2wiki-dev) or out of range gives no row, and so do MuSiQue records (their
    evidence is whole supporting paragraphs, which the ``gold`` table already holds).
    """
    rows = []
    for rec in records:
        if not isinstance(rec, dict) or "paragraphs" in rec:
            continue
        qid = str(rec.get("_id", rec.get("id")))
        sentences = {item[0]: item[1] for item in rec.get("context") or []
                     if isinstance(item, list) and len(item) == 2 and isinstance(item[1], list)}
        for fact in rec.get("supporting_facts") or []:
            if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[1], int)):
                continue
            title, idx = fact
            sents = sentences.get(title, [])
            if 0 <= idx < len(sents) and str(sents[idx]).strip():
                rows.append((qid, title, idx, str(sents[idx]).strip()))
    frame = pd.DataFrame(rows, columns=["qid", "title", "sent_idx", "sentence"])
    return frame.drop_duplicates(["qid", "title", "sent_idx"]).reset_index(drop=True)


def question_records(params: DatasetParams, data_dir: str) -> list[Any]:
    """The raw question records of a dataset (empty when it has none)."""
    if isinstance(params, SampleParams):
        return sample_records(params.n_passages, params.n_questions, params.seed)[1]
    return question_file_records(raw_sources(params, data_dir)[1])


@dataclass(frozen=True)
class SampleEvidenceParams(StageParams):
    """``evidence`` of the generated sample: which sample."""

    SOURCES = ("dataset",)
    n_passages: int
    n_questions: int
    seed: int


@dataclass(frozen=True)
class FileEvidenceParams(StageParams):
    """``evidence`` of a questions file: nothing but its bytes, the stage's input."""


def gold_evidence(ctx: RunContext, params: DatasetParams, data_dir: str) -> dict[str, ArtifactRef]:
    """The ``evidence`` stage of the dataset's kind: the ``gold_sentences`` table (supporting facts kept at
    ingestion, for evidence recall).

    A stage of its own beside :func:`ingest`, on the same raw files, so that keeping the supporting facts
    leaves the fingerprints of ``ingest`` and of every index stage built on it unchanged.
    """
    dataset = SimpleNamespace(dataset=params)
    if isinstance(params, SampleParams):
        return sample_evidence(ctx, SampleEvidenceParams.of(dataset))
    _, qpath = raw_sources(params, data_dir)
    return file_evidence(ctx, FileEvidenceParams.of(dataset), str(qpath) if qpath else None,
                         dataset_identity(params, data_dir, ctx.run_id))


@stage("evidence", params=SampleEvidenceParams)
def sample_evidence(ctx: RunContext, params: SampleEvidenceParams) -> dict[str, ArtifactRef]:
    """Stage: the generated sample's ``gold_sentences``."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        table = supporting_sentences(sample_records(params.n_passages, params.n_questions, params.seed)[1])
        return {"gold_sentences": table}, len(table)

    return run_stage(ctx, params, {"content": content_hash([])}, compute)


@stage("evidence", params=FileEvidenceParams)
def file_evidence(ctx: RunContext, params: FileEvidenceParams, questions: str | None,
                  content: str) -> dict[str, ArtifactRef]:
    """Stage: the ``gold_sentences`` of a questions file (none without one), whose dataset's bytes hash to
    ``content``."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        table = supporting_sentences(question_file_records(Path(questions) if questions else None))
        return {"gold_sentences": table}, len(table)

    return run_stage(ctx, params, {"content": content}, compute)
