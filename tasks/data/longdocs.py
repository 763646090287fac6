"""The long-document development set (issue 58, Deliver 8): real long documents that ship offline, and questions
whose short answer spans lie deep inside them.

``python -m tasks.data.longdocs --out DIR`` writes

- ``DIR/corpus.jsonl``: one record per document, ``{title, text, source, kind, version}``: the long description
  (``METADATA`` body) of every Python package installed beside this interpreter, and the text layer (pypdf) of
  the Debian documentation PDFs in :data:`DEBIAN_PDFS` that are installed;
- ``DIR/questions.json``: the questions of :data:`QUESTIONS_FILE` whose answer span was found, in the HotpotQA shape
  (``supporting_facts`` names the gold document) plus ``answer_span: {document, start, end}``, the span's character
  offsets in its document's text, located now (package versions drift, so the repository ships the span text and
  its gold document, never an offset);
- ``DIR/build_report.json``: what is missing (a PDF not installed: the ``apt-get install`` line that brings it) and
  every question whose span was not found, with the reason. Nothing is dropped silently: the same lines are
  printed, and ``--strict`` exits 1 when any question is lost.

Then ``dagrag evaluate dataset=jsonl dataset.path=DIR/corpus.jsonl dataset.questions=DIR/questions.json``.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

QUESTIONS_FILE = Path(__file__).with_name("longdocs_questions.jsonl")

# Debian documentation PDFs (path, package): real manuals produced by real tools (TeX, DocBook), small enough
# to read in seconds. A machine without them builds the set from the package descriptions alone, and says so.
DEBIAN_PDFS: tuple[tuple[str, str, str], ...] = (  # (path, Debian package, document title)
    ("/usr/share/doc/bzip2/manual.pdf.gz", "bzip2-doc", "bzip2 and libbzip2 manual"),
    ("/usr/share/doc/fontconfig/fontconfig-user.pdf.gz", "fontconfig", "fontconfig user manual"),
    ("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf", "shared-mime-info",
     "Shared MIME-info Database specification"),
    ("/usr/share/doc/libtasn1-doc/libtasn1.pdf", "libtasn1-doc", "GNU Libtasn1 manual"),
    ("/usr/share/doc/nettle-dev/nettle.pdf.gz", "nettle-dev", "Nettle manual"),
    ("/usr/share/doc/zlib1g-dev/crc-doc.1.0.pdf.gz", "zlib1g-dev", "Everything we know about CRC"),
)
MIN_CHARS = 2000  # a package description shorter than this is not a long document (most are a few lines)


@dataclass(frozen=True)
class Document:
    """One long document: its title (package or PDF name), extracted text and where it came from."""

    title: str
    text: str
    source: str
    kind: str      # "metadata" or "pdf"
    version: str


@dataclass(frozen=True)
class Question:
    """A shipped question: the answer span's text, its gold document, and an anchor (a longer quote around the
    span, unique in the document) that fixes which occurrence of the span is meant."""

    qid: str
    question: str
    answer: str
    gold: str
    anchor: str


# ----------------------------------------------------------------------------- pure functions

def package_description(metadata: Any) -> str:
    """A distribution's long description: the ``METADATA`` body, else its ``Description`` field."""
    body = metadata.get_payload() if hasattr(metadata, "get_payload") else None
    return (body or metadata.get("Description") or "").strip()


def locate_span(text: str, anchor: str, answer: str) -> tuple[int, int] | str:
    """``(start, end)`` of ``answer`` inside the one occurrence of ``anchor`` in ``text``, or why not (the anchor
    is missing or occurs twice, or the answer is not inside the anchor)."""
    at = anchor.find(answer)
    if at < 0:
        return "the answer is not inside its anchor"
    first = text.find(anchor)
    if first < 0:
        return "anchor not found in the document"
    if text.find(anchor, first + 1) >= 0:
        return "anchor occurs more than once in the document"
    start = first + at
    return start, start + len(answer)


def question_record(q: Question, start: int, end: int) -> dict[str, Any]:
    """A located question in the HotpotQA shape (gold document in ``supporting_facts``) with its span."""
    return {"_id": q.qid, "question": q.question, "answer": q.answer, "type": "longdoc",
            "supporting_facts": [[q.gold, 0]],
            "answer_span": {"document": q.gold, "start": start, "end": end}}


def build_questions(questions: Iterable[Question], documents: dict[str, str]
                    ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(located question records, lost questions with their reason) against ``documents`` (title → text)."""
    located, lost = [], []
    for q in questions:
        if q.gold not in documents:
            lost.append({"qid": q.qid, "gold": q.gold, "reason": "gold document not in the corpus"})
            continue
        span = locate_span(documents[q.gold], q.anchor, q.answer)
        if isinstance(span, str):
            lost.append({"qid": q.qid, "gold": q.gold, "reason": span})
        else:
            located.append(question_record(q, *span))
    return located, lost


def depth_summary(records: list[dict[str, Any]], documents: dict[str, str]) -> dict[str, float]:
    """How deep the answers lie: the share past the first 2,000 characters (more than MiniLM's 256 tokens read
    from a document's start) and the median span start as a share of its document's length."""
    if not records:
        return {"n": 0}
    starts = [r["answer_span"]["start"] for r in records]
    rel = sorted(s / max(len(documents[r["answer_span"]["document"]]), 1) for s, r in zip(starts, records))
    return {"n": len(records), "share_past_2000_chars": round(sum(s > 2000 for s in starts) / len(starts), 3),
            "median_relative_depth": round(rel[len(rel) // 2], 3)}


# ----------------------------------------------------------------------------- reading the sources

def package_documents(min_chars: int = MIN_CHARS) -> list[Document]:
    """The long descriptions of the installed distributions (one per name, the first on sys.path wins)."""
    out: dict[str, Document] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if not name or name.lower() in out:
            continue
        text = package_description(dist.metadata)
        if len(text) >= min_chars:
            out[name.lower()] = Document(name.lower(), text, f"{name}-{dist.version}.dist-info/METADATA",
                                         "metadata", str(dist.version))
    return sorted(out.values(), key=lambda d: d.title)


def pdf_text(path: Path) -> str:
    """A PDF's text layer, page after page (pypdf), read from a plain or gzipped file."""
    from pypdf import PdfReader

    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return "\n\n".join((page.extract_text() or "") for page in PdfReader(io.BytesIO(data)).pages).strip()


def pdf_documents(pdfs: Iterable[tuple[str, str, str]] = DEBIAN_PDFS) -> tuple[list[Document], list[str]]:
    """(the installed PDFs as documents, one line per missing one naming the package that ships it)."""
    docs, missing = [], []
    for path, package, title in pdfs:
        p = Path(path)
        if not p.is_file():
            missing.append(f"{path}: not installed (apt-get install {package})")
            continue
        docs.append(Document(title, pdf_text(p), path, "pdf", package))
    return docs, missing


def read_questions(path: Path = QUESTIONS_FILE) -> list[Question]:
    """The shipped questions (one JSON object per line)."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if line.strip():
            rec = json.loads(line)
            try:
                out.append(Question(rec["qid"], rec["question"], rec["answer"], rec["gold"], rec["anchor"]))
            except KeyError as err:
                raise ValueError(f"{path}: line {number}: missing field {err}") from None
    return out


def write_atomic(path: Path, text: str) -> None:
    """Write a file whole or not at all (a temporary file beside it, then a rename)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def build(out: Path, with_pdfs: bool = True, min_chars: int = MIN_CHARS,
          only: list[str] | None = None) -> dict[str, Any]:
    """Write the corpus, the located questions and the build report into ``out``; return the report. ``only``
    (titles) keeps those documents alone, and their questions: a small set for a slow box."""
    docs = package_documents(min_chars)
    missing: list[str] = []
    if with_pdfs:
        pdfs, missing = pdf_documents()
        docs += pdfs
    if only is not None:
        unknown = sorted(set(only) - {d.title for d in docs})
        if unknown:
            raise ValueError(f"--documents: no document titled {unknown} (titles are in corpus.jsonl)")
        docs = [d for d in docs if d.title in set(only)]
    by_title = {d.title: d.text for d in docs}
    located, lost = build_questions([q for q in read_questions() if only is None or q.gold in set(only)], by_title)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "corpus.jsonl", "".join(json.dumps({"title": d.title, "text": d.text, "source": d.source,
                                                           "kind": d.kind, "version": d.version}) + "\n"
                                               for d in docs))
    write_atomic(out / "questions.json", json.dumps(located, indent=1))
    report = {"documents": len(docs), "pdf_documents": sum(d.kind == "pdf" for d in docs),
              "characters": sum(len(d.text) for d in docs), "questions": len(located), "lost_questions": lost,
              "missing_sources": missing, "depth": depth_summary(located, by_title)}
    write_atomic(out / "build_report.json", json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    """Command line: build the set, print what is missing or lost, one line each."""
    parser = argparse.ArgumentParser(prog="python -m tasks.data.longdocs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for corpus.jsonl and questions.json")
    parser.add_argument("--no-pdf", action="store_true", help="package descriptions only (what ships with pip)")
    parser.add_argument("--min-chars", type=int, default=MIN_CHARS, help="shortest package description kept")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a question's span is not found")
    parser.add_argument("--documents", help="comma-separated titles: keep only these documents and their questions")
    args = parser.parse_args(argv)
    only = [t.strip() for t in args.documents.split(",")] if args.documents else None
    try:
        report = build(args.out, not args.no_pdf, args.min_chars, only)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in report["missing_sources"]:
        print(f"missing: {line}")
    for q in report["lost_questions"]:
        print(f"lost question {q['qid']} ({q['gold']}): {q['reason']}")
    print(f"{report['documents']} documents ({report['pdf_documents']} PDF, {report['characters']:,} characters), "
          f"{report['questions']} questions located; depth {report['depth']}; written to {args.out}")
    return 1 if args.strict and report["lost_questions"] else 0


if __name__ == "__main__":
    sys.exit(main())
