"""Reader prompt construction and answer extraction for QA generation."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.llm.ledger import CHARS_PER_TOKEN, estimate_text_tokens

if TYPE_CHECKING:
    import pandas as pd

    from tasks.llm.client import LLMClient

READER_SYSTEM = (
    "You answer questions using the numbered context passages you are given. "
    "Work through the evidence step by step, linking facts across passages when the "
    "question needs several hops. Keep the reasoning brief. End with exactly one final "
    "line of the form 'Answer: <answer>', where <answer> is a short phrase (an entity, "
    "date, number, or yes/no), not a sentence. If the passages do not settle it, give "
    "your best guess on that line anyway."
)

_ANSWER_MARK = re.compile(r"\banswer\b\s*(?:\*\*|__)?\s*[:：]", re.IGNORECASE)
_QUOTES = "\"'`“”‘’«»"


def select_passages(passages: Sequence[str], max_context_tokens: int) -> list[str]:
    """Passages in rank order while they fit the token budget.

    Stops at the first passage that does not fit; if even the top passage is
    too long it is truncated to the budget so the context is never empty.
    """
    chosen: list[str] = []
    used = 0
    for text in passages:
        cost = estimate_text_tokens(text)
        if used + cost > max_context_tokens:
            if not chosen and max_context_tokens > 0:
                chosen.append(text[: max_context_tokens * CHARS_PER_TOKEN])
            break
        chosen.append(text)
        used += cost
    return chosen


def build_reader_messages(question: str, passages: Sequence[str],
                          max_context_tokens: int) -> list[dict[str, str]]:
    """Chain-of-thought reader prompt: numbered passages, question, final 'Answer:' line."""
    chosen = select_passages(passages, max_context_tokens)
    context = "\n\n".join(f"[{i}] {p.strip()}" for i, p in enumerate(chosen, 1)) or "(no passages)"
    user = (f"Context passages:\n{context}\n\nQuestion: {question.strip()}\n\n"
            "Reason step by step, then finish with a line 'Answer: <short answer>'.")
    return [{"role": "system", "content": READER_SYSTEM}, {"role": "user", "content": user}]


def _clean(answer: str) -> str:
    """Strip markdown emphasis, surrounding quotes, trailing period and spaces."""
    s = answer.replace("**", "").replace("__", "")
    prev = None
    while s != prev:
        prev = s
        s = s.strip().rstrip(".").strip(_QUOTES)
    return s


def extract_answer(text: str | None) -> str:
    """Final answer from a reader reply.

    Uses the text after the last ``Answer:`` marker (case-insensitive, markdown
    bold allowed); if that line is empty, the next non-empty line. Without a
    marker, falls back to the last non-empty line.
    """
    body = text or ""
    marks = list(_ANSWER_MARK.finditer(body))
    if marks:
        rest_lines = body[marks[-1].end():].split("\n")
        first = _clean(rest_lines[0])
        if first:
            return first
        following = [ln for ln in rest_lines[1:] if _clean(ln)]
        return _clean(following[0]) if following else ""
    lines = [ln for ln in body.splitlines() if ln.strip()]
    return _clean(lines[-1]) if lines else ""


# ----------------------------------------------------------------------------- the generate stage

def contexts_for(hits: "pd.DataFrame", docs: "pd.DataFrame", traces: "pd.DataFrame | None",
                 n_passages: int) -> dict[str, list[str]]:
    """Per question, the context the method retrieved: its evidence chunks when it keeps some
    (ZoomRAG's ChunkZoom), else its top passages rendered as ``title: text``."""
    import json

    text = dict(zip(docs["doc_id"], (docs["title"] + ": " + docs["text"]).tolist()))
    out: dict[str, list[str]] = {}
    top = hits[hits["rank"] <= n_passages].sort_values(["qid", "rank"])
    for qid, group in top.groupby("qid", sort=False):
        out[qid] = [text[d] for d in group["doc_id"]]
    if traces is not None and "kept_chunks" in traces.columns:
        for qid, chunks in zip(traces["qid"], traces["kept_chunks"]):
            kept = json.loads(chunks) if isinstance(chunks, str) else list(chunks)
            if kept:
                out[qid] = kept
    return out


@task(name="generate", cache_policy=NO_CACHE)
def generate(client: "LLMClient", questions: "pd.DataFrame", contexts: dict[str, list[str]],
             max_context_tokens: int) -> "pd.DataFrame":
    """Stage: answer every question from its retrieved context; ``(qid, prediction, raw)``: the extracted answer
    and the reader's whole reply (scored by :func:`tasks.eval.answer_metrics.score_predictions`)."""
    import pandas as pd

    replies = read(client, questions["question"].tolist(), [contexts.get(qid, []) for qid in questions["qid"]],
                   max_context_tokens, stage="generate")
    return pd.DataFrame({"qid": questions["qid"], "prediction": [extract_answer(r) for r in replies],
                         "raw": replies})


def read(client: "LLMClient", questions: Sequence[str], contexts: Sequence[Sequence[str]], max_context_tokens: int,
         stage: str) -> list[str | None]:
    """The shared reader's reply to each question from its context (one batch of chat calls, logged as ``stage``);
    :func:`extract_answer` takes the answer out of a reply."""
    msgs = [build_reader_messages(q, c, max_context_tokens) for q, c in zip(questions, contexts)]
    return [r.text for r in client.chat_many(msgs, stage=stage)]
