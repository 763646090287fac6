"""The HTTP service's contract (``GET /openapi.json``): typed response models for every endpoint, every error
status with its ``{"error": ...}`` body, and the request schema with its own rules (exactly one of
``question``/``questions``, ``k``'s bounds, the length limits of ``serve.*``).

The models describe what :mod:`flows.serving.app` sends; the app still writes its bodies with ``orjson`` (no
per-response validation on the hot path), and ``tests/flows/serving/test_openapi_contract.py`` fuzzes a real server
against this schema (schemathesis) so the two cannot drift. Beyond the papers: serving.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from flows.runtime.config import ServeParams

# a question is not blank: it has a character that is not whitespace (Python's str.isspace set, spelled out:
# `\S` means different sets to Python's re and to ECMA regex, which JSON Schema tools use). The server checks
# the same pattern.
NOT_BLANK = (r"[^\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f"
             r"\u3000]")


class Error(BaseModel):
    """Every 4xx/5xx answer: one line saying what is wrong and how to fix it."""

    error: str = Field(description="what is wrong, and the fix")


class Lineage(BaseModel):
    """Where a passage comes from (issue 58's passage lineage); absent or null when the index has none."""

    document: str = Field(description="id of the source document the passage was cut from")
    source: str | None = Field(description="file path relative to the dataset folder, or <file>#<record>")
    page: int | None = Field(description="1-based PDF page where the passage starts")
    headings: list[str] = Field(description="heading path (Markdown/HTML)")
    span: list[int] | None = Field(description="[char_start, char_end] in the document's extracted text",
                                   min_length=2, max_length=2)
    citation: str = Field(description="the human citation, e.g. 'docs/guide.md § Install › Linux'")


class Passage(BaseModel):
    """One ranked passage (:class:`flows.serving.index.Passage`)."""

    doc_id: str
    title: str
    text: str
    score: float = Field(description="the method's score (higher ranks first)")
    rank: int = Field(ge=1, description="1 = best")
    lineage: Lineage | None = None


class IndexInfo(BaseModel):
    """What is served (``GET /index``): method, dataset, fingerprint, build time and settings."""

    method: str
    dataset: str
    fingerprint: str = Field(description="hash of the fingerprints of the stages the retriever reads")
    built_at: str = Field(description="when the newest of those stages was written (ISO 8601)")
    n_documents: int
    artifacts_dir: str
    config: dict[str, Any] = Field(description="the method's, dataset's, embedder's and NER's settings")
    loaded_at: str
    load_seconds: float
    reloads: int = Field(description="hot swaps since the server started")


class DocumentHit(BaseModel):
    """One document of a ``"group": "document"`` answer, ranked by its best passage, with its passages."""

    document: str = Field(description="id of the source document")
    title: str
    source: str | None = Field(description="file path relative to the dataset folder, or <file>#<record>")
    citation: str = Field(description="the document's citation (its source, else its title)")
    score: float = Field(description="its best passage's score")
    rank: int = Field(ge=1, description="1 = best")
    passages: list[Passage]


class RetrieveResponse(BaseModel):
    """``POST /retrieve``: per question (in request order) its passages, best first, and the method's trace."""

    results: list[list[Passage]]
    traces: list[dict[str, Any]] = Field(description="per question: the method's own trace (seeds, kept chunks, …)")
    index: IndexInfo
    documents: list[list[DocumentHit]] | None = Field(
        default=None, description='with "group": "document": per question its documents, best first')


class Answer(BaseModel):
    """One question's answer (:class:`flows.serving.index.Answer`)."""

    question: str
    answer: str
    raw: str = Field(description="the LLM's whole reply")
    context: list[str] = Field(description="what the reader was given")
    results: list[Passage]
    trace: dict[str, Any]


class AnswerResponse(BaseModel):
    """``POST /answer``: per question its answer and passages."""

    answers: list[Answer]
    index: IndexInfo


class Health(BaseModel):
    status: str = Field(description="'ok' while the process serves")
    index: str = Field(description="the served index's fingerprint")


class ReloadResponse(BaseModel):
    """``POST /admin/reload``: whether a newer build was swapped in."""

    reloaded: bool
    index: IndexInfo
    previous: str | None = Field(default=None, description="the fingerprint served before, when reloaded")


def retrieve_request(p: ServeParams) -> dict[str, Any]:
    """The request body of ``/retrieve`` and ``/answer`` with ``serve.*``'s limits: exactly one of ``question``
    (a string) or ``questions`` (a non-empty list), and an optional ``k``; nothing else."""
    question = {"type": "string", "minLength": 1, "maxLength": p.max_question_chars, "pattern": NOT_BLANK,
                "description": f"a question: not blank, at most serve.max_question_chars={p.max_question_chars} "
                               "characters"}
    k = {"type": "integer", "minimum": 1, "maximum": p.max_k,
         "description": f"passages per question, 1 to serve.max_k={p.max_k}; absent: the method's top_k"}
    group = {"type": "string", "enum": ["passage", "document"],
             "description": "document: also the passages grouped by their document, best document first"}
    return {
        "title": "RetrieveRequest",
        "description": "Exactly one of 'question' (one string) or 'questions' (a list of strings), and "
                       "optionally 'k' and 'group'. Unknown fields are refused.",
        "oneOf": [
            {"title": "OneQuestion", "type": "object", "additionalProperties": False, "required": ["question"],
             "properties": {"question": question, "k": k, "group": group}},
            {"title": "Questions", "type": "object", "additionalProperties": False, "required": ["questions"],
             "properties": {"questions": {"type": "array", "minItems": 1, "maxItems": p.max_questions,
                                          "items": question,
                                          "description": f"at most serve.max_questions={p.max_questions}"},
                            "k": k, "group": group}},
        ],
    }


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for these error statuses, each with the ``{"error": ...}`` body."""
    return {s: {"model": Error, "description": ERRORS[s]} for s in statuses}


ERRORS = {
    400: "the body is not UTF-8 or not valid JSON",
    401: "missing or wrong API key (send Authorization: Bearer <key>)",
    403: "an /admin/ endpoint on a server started without an API key",
    405: "this method is not allowed here (the Allow header lists those that are)",
    409: "the settings' index is not built",
    413: "the body is over serve.max_body_bytes",
    422: "the body breaks the request schema (a one-line reason names the field)",
    501: "the server cannot do this (no LLM configured, or no way to reopen its index)",
    503: "busy: the queue is full; retry after the Retry-After header's seconds",
}
