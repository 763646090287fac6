"""Answer-in-context at a token budget: one LLM-free measure of what reaches the reader, for every method.

DPR's "answer string in the retrieved text" (Karpukhin et al., 2020, top-k retrieval accuracy), taken on the
context the method hands the reader rather than on passages alone:

- a method's context is its list of items in its own order (:func:`tasks.llm.generate.contexts_for`: ZoomRAG's
  chunks, EraRAG's summaries and leaves, ArchRAG's descriptions, the ranked passages of the others), packed to
  the budget as the reader packs it (:func:`tasks.llm.generate.select_passages`);
- an answer is in the context when one of its gold aliases, normalised as SQuAD does
  (:func:`tasks.eval.answer_metrics.normalize_answer`), is a substring of the normalised packed context;
- questions whose every alias is yes or no are left out (their string is in almost any text); their count is
  reported, and ``answer_in_context_n`` is the count of the questions scored.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from tasks.eval.answer_metrics import normalize_answer
from tasks.llm.generate import select_passages
from tasks.llm.ledger import estimate_text_tokens

YES_NO = frozenset({"yes", "no"})


def is_yes_no(answers: Sequence[str]) -> bool:
    """Every alias is yes or no once normalised (a comparison question's answer)."""
    norm = [normalize_answer(a) for a in answers]
    return bool(norm) and all(a in YES_NO for a in norm)


def answer_in_text(answers: Sequence[str], text: str) -> bool:
    """A non-empty normalised alias is a substring of the normalised text."""
    t = normalize_answer(text)
    return any((a := normalize_answer(x)) and a in t for x in answers)


def packed(items: Sequence[str], budget: int) -> list[str]:
    """The items the reader gets within ``budget`` tokens (:func:`select_passages`: rank order, stop at the
    first that does not fit, the first one cut to the budget if it alone is too long)."""
    return select_passages(list(items), budget)


def answer_in_context(contexts: Mapping[str, Sequence[str]], answers: Mapping[str, Sequence[str]],
                      budgets: Sequence[int]) -> dict[str, float | int]:
    """``answer_in_context@B`` (% of the scored questions) and ``context_tokens@B`` (mean tokens packed) for each
    budget B, over the questions of ``answers`` that are not yes/no; ``answer_in_context_n`` and
    ``answer_in_context_yes_no`` count the questions scored and left out. A question without context scores 0."""
    scored = [q for q, a in answers.items() if not is_yes_no(a)]
    out: dict[str, float | int] = {"answer_in_context_n": len(scored),
                                   "answer_in_context_yes_no": len(answers) - len(scored)}
    for b in budgets:
        chosen = [packed(contexts.get(q, []), b) for q in scored]
        found = [answer_in_text(answers[q], "\n\n".join(c)) for q, c in zip(scored, chosen)]
        out[f"answer_in_context@{b}"] = round(float(np.mean(found)) * 100, 2) if scored else float("nan")
        out[f"context_tokens@{b}"] = (round(float(np.mean([sum(estimate_text_tokens(x) for x in c)
                                                            for c in chosen])), 1) if scored else float("nan"))
    return out
