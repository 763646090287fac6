"""Readers: a file's bytes → the document's text, in the form the splitter cuts (no I/O beyond the bytes given).

Every reader returns a :class:`ReadDocument`: the extracted ``text`` (the string a passage's span indexes),
whether it is Markdown (its ``#`` headings give the heading path), and for a PDF the character offset where each
page starts. A file that cannot be read raises :class:`UnreadableFile` with its reason in words; the caller names
the file.

Library choices (measured in docs/own-documents.md):

- PDF: **pypdfium2** (PDFium's text layer). On two Debian documentation PDFs it extracted the same text as pypdf
  7–13x faster (libtasn1.pdf, 36 pages: 1.1 s against 8.0 s), and it tells an encrypted file from a corrupt one
  by PDFium's own error codes.
- HTML: **selectolax** (lexbor). trafilatura removes more boilerplate, but on 278 Debian HTML manuals (11 MB) it
  took 39.7 s against 0.46 s, and it dropped the section headings a citation needs. The main text is taken from
  ``<main>``/``<article>`` when the page has one, with ``nav``, ``header``, ``footer``, ``aside``, scripts and
  forms removed, and headings kept as Markdown ``#`` lines.
- Markdown and text: the file's own UTF-8 text, unchanged, so a span cuts the file itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# formats by file suffix; anything else in a folder is not a document
FORMATS: dict[str, str] = {".txt": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html",
                           ".htm": "html", ".pdf": "pdf"}


class UnreadableFile(ValueError):
    """A file whose content cannot give a document: the message is the reason (encrypted, corrupt, ...)."""


@dataclass(frozen=True)
class ReadDocument:
    """A document's extracted text; ``markdown``: its ``#`` lines are headings; ``page_starts``: the offset in
    ``text`` where each PDF page starts (empty for other formats)."""

    text: str
    markdown: bool = False
    page_starts: list[int] = field(default_factory=list)


def decode_text(data: bytes) -> str:
    """UTF-8 text of a text file (a BOM dropped, line ends normalised to ``\\n``); a binary file (a NUL byte) or
    invalid UTF-8 raises :class:`UnreadableFile`."""
    if b"\x00" in data[:65536]:
        raise UnreadableFile("binary file (it holds NUL bytes), not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise UnreadableFile(f"invalid UTF-8 at byte offset {err.start} (line {line}): save the file as UTF-8 "
                             f"(e.g. iconv -f latin1 -t utf-8)") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_pdf(data: bytes) -> ReadDocument:
    """The text layer of a PDF, pages joined by a blank line, with each page's start offset."""
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as err:
        message = str(err).lower()
        if "password" in message or "security" in message:
            raise UnreadableFile("encrypted PDF (it needs a password): decrypt it first, e.g. "
                                 "qpdf --decrypt in.pdf out.pdf") from None
        raise UnreadableFile(f"corrupt PDF ({err})") from None
    try:
        pages, starts, at = [], [], 0
        for i in range(len(pdf)):
            page = pdf[i]
            textpage = page.get_textpage()
            text = textpage.get_text_range().replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "").strip()
            textpage.close()
            page.close()
            starts.append(at)
            pages.append(text)
            at += len(text) + 2
    finally:
        pdf.close()
    if not any(p.strip() for p in pages):
        raise UnreadableFile(f"no text layer in its {len(pages)} page(s) (a scanned PDF?): run OCR first, e.g. "
                             f"ocrmypdf in.pdf out.pdf")
    return ReadDocument("\n\n".join(pages), False, starts)


_DROP = ("script", "style", "noscript", "template", "nav", "header", "footer", "aside", "form", "iframe", "svg",
         "[role=navigation]", "[role=banner]", "[role=contentinfo]", "[aria-hidden=true]")
_BLOCKS = frozenset({"p", "div", "section", "article", "main", "li", "ul", "ol", "table", "tr", "pre", "blockquote",
                     "dl", "dt", "dd", "figure", "figcaption", "br", "hr", "body", "td", "th"})


def read_html(data: bytes) -> ReadDocument:
    """The main text of an HTML page as Markdown-like text: headings as ``#`` lines, blocks as paragraphs."""
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(decode_text(data))
    root = tree.css_first("main") or tree.css_first("article") or tree.body or tree.root
    if root is None:
        raise UnreadableFile("an HTML page without a body")
    for selector in _DROP:
        for node in root.css(selector):
            node.decompose()
    out: list[str] = []
    line: list[str] = []

    def flush() -> None:
        text = " ".join("".join(line).split())
        if text:
            out.append(text)
        line.clear()

    def walk(node) -> None:  # noqa: ANN001 - a lexbor node
        for child in node.iter(include_text=True):
            tag = child.tag
            if tag == "-text":
                line.append(child.text_content or "")
            elif tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
                flush()
                heading = " ".join(child.text(separator=" ").split())
                if heading:
                    out.append("#" * int(tag[1]) + " " + heading)
            elif tag == "pre":
                flush()
                out.append(child.text().strip("\n"))
            elif tag in _BLOCKS:
                flush()
                walk(child)
                flush()
            else:
                walk(child)

    walk(root)
    flush()
    text = "\n\n".join(out)
    if not text.strip():
        raise UnreadableFile("no text in the HTML page's main content")
    return ReadDocument(text, True)


def read_document(data: bytes, fmt: str) -> ReadDocument:
    """A file's bytes in one of :data:`FORMATS`' formats → its :class:`ReadDocument`."""
    if fmt == "pdf":
        return read_pdf(data)
    if fmt == "html":
        return read_html(data)
    text = decode_text(data)
    if not text.strip():
        raise UnreadableFile("empty file")
    return ReadDocument(text, fmt == "markdown")
