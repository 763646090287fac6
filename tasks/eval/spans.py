"""Measures for long documents cut into passages (issue 58): where the answer span lands, which documents come
back, and how much text a result is.

Every passage carries its lineage (``documents``: ``document``, ``char_start``, ``char_end``; the cross-branch
contract of issue 58): the document it was cut from and its character span there. A table without these
columns holds unsplit passages, each its own document, spanning its whole text. A question of a long-document
set holds its answer span's offsets in its gold document (``questions``: ``span_start``, ``span_end``).

- ``span_hit@k``: % of the questions with a span whose span lies wholly inside one of the top-k passages (the
  passage is from the gold document and its span covers the answer's);
- ``span_in_context@B``: the same, over the ranked passages packed into B tokens as the reader packs them
  (:func:`tasks.llm.generate.select_passages`: ``title: text``, ~4 characters a token, rank order, the first one
  cut to the budget when it alone is longer): the answer span lies within the first B tokens of ranked context;
- ``doc_recall@k``: mean over questions of the share of their gold documents among the documents of the top-k
  passages (a document counts once, however many of its passages come back);
- ``result_chars@n`` / ``result_tokens@n``: mean characters (estimated tokens) of a returned passage, over the
  top-n results of every question: what a reader is handed per result.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from tasks.data.corpus import source_documents
from tasks.llm.ledger import CHARS_PER_TOKEN

LINEAGE = ["doc_id", "document", "char_start", "char_end", "n_chars", "title"]


def passage_lineage(docs: pd.DataFrame) -> pd.DataFrame:
    """``documents`` → ``(doc_id, document, char_start, char_end, n_chars, title)``; an unsplit passage (no lineage
    columns, or null ones) is its own document and spans ``[0, len(text))``."""
    n_chars = docs["text"].astype(str).str.len().to_numpy()
    out = pd.DataFrame({"doc_id": docs["doc_id"].to_numpy(), "n_chars": n_chars, "title": docs["title"].to_numpy()})
    out["document"] = source_documents(docs).to_numpy()
    start = docs["char_start"] if "char_start" in docs else pd.Series([np.nan] * len(docs), index=docs.index)
    end = docs["char_end"] if "char_end" in docs else pd.Series([np.nan] * len(docs), index=docs.index)
    out["char_start"] = pd.to_numeric(start, errors="coerce").fillna(0).to_numpy(dtype=np.int64)
    out["char_end"] = np.where(pd.isna(end).to_numpy(), out["char_start"] + n_chars,
                               pd.to_numeric(end, errors="coerce").fillna(0).to_numpy()).astype(np.int64)
    return out[LINEAGE]


def gold_documents(gold: pd.DataFrame, lineage: pd.DataFrame) -> pd.DataFrame:
    """``gold(qid, doc_id)`` → ``(qid, document)``: a gold passage stands for the document it was cut from; a gold
    id that is not a passage's (a split document's own id) is a document already."""
    to_document = lineage.set_index("doc_id")["document"]
    documents = gold["doc_id"].map(to_document).fillna(gold["doc_id"])
    return pd.DataFrame({"qid": gold["qid"].to_numpy(), "document": documents.to_numpy()}).drop_duplicates()


def _ranked(hits: pd.DataFrame, lineage: pd.DataFrame, qids: Sequence[str]) -> pd.DataFrame:
    """The hits of ``qids`` with each passage's lineage, in rank order."""
    asked = hits[hits["qid"].isin(set(qids))]
    return asked.merge(lineage, on="doc_id", how="left").sort_values(["qid", "rank"], kind="stable")


def document_recall(hits: pd.DataFrame, lineage: pd.DataFrame, gold_docs: pd.DataFrame, ks: Sequence[int],
                    qids: Sequence[str]) -> dict[str, float]:
    """``doc_recall@k`` (%): gold documents among the documents of the top-k passages, per question, averaged
    over the questions with gold."""
    g = gold_docs[gold_docs["qid"].isin(set(qids))]
    n_gold = g.groupby("qid").size()
    found = _ranked(hits, lineage, qids).merge(g, on=["qid", "document"], how="inner")
    out = {}
    for k in ks:
        per_q = found[found["rank"] <= k].drop_duplicates(["qid", "document"]).groupby("qid").size()
        share = per_q.reindex(n_gold.index, fill_value=0) / n_gold
        out[f"doc_recall@{k}"] = round(float(share.mean() * 100), 2) if len(n_gold) else float("nan")
    return out


def span_rows(questions: pd.DataFrame, gold_docs: pd.DataFrame, qids: Sequence[str]) -> pd.DataFrame:
    """``(qid, document, span_start, span_end)`` of the asked questions that hold an answer span (its document:
    the question's gold documents; a long-document question has one)."""
    if "span_start" not in questions:
        return pd.DataFrame(columns=["qid", "document", "span_start", "span_end"])
    q = questions[questions["qid"].isin(set(qids)) & questions["span_start"].notna()]
    spans = q[["qid", "span_start", "span_end"]].merge(gold_docs, on="qid", how="inner")
    return spans.astype({"span_start": np.int64, "span_end": np.int64})[["qid", "document", "span_start", "span_end"]]


def span_hit_at_k(hits: pd.DataFrame, lineage: pd.DataFrame, spans: pd.DataFrame, ks: Sequence[int]
                  ) -> dict[str, float]:
    """``span_hit@k`` (%): the answer span lies inside a top-k passage of its document (``char_start <=
    span_start`` and ``span_end <= char_end``), over the questions of ``spans``."""
    n = spans["qid"].nunique()
    covering = _covering(hits, lineage, spans)
    return {f"span_hit@{k}": round(100 * covering.loc[covering["rank"] <= k, "qid"].nunique() / n, 2)
            if n else float("nan") for k in ks}


def _covering(hits: pd.DataFrame, lineage: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """The hits whose passage covers its question's answer span: ``(qid, rank, char_start, title)``."""
    ranked = _ranked(hits, lineage, spans["qid"].unique()).merge(spans, on=["qid", "document"], how="inner")
    inside = (ranked["char_start"] <= ranked["span_start"]) & (ranked["span_end"] <= ranked["char_end"])
    return ranked[inside]


def span_in_context(hits: pd.DataFrame, lineage: pd.DataFrame, spans: pd.DataFrame, budgets: Sequence[int]
                    ) -> dict[str, float]:
    """``span_in_context@B`` (%): the answer span lies within the first B tokens of the ranked passages, packed as
    :func:`tasks.llm.generate.select_passages` packs them (``title: text``, ~4 characters a token)."""
    n = spans["qid"].nunique()
    ranked = _ranked(hits, lineage, spans["qid"].unique())
    by_qid = {q: g for q, g in ranked.groupby("qid", sort=False)}
    found = {b: 0 for b in budgets}
    for span in spans.drop_duplicates("qid").itertuples(index=False):
        group = by_qid.get(span.qid)
        if group is None:
            continue
        for b in budgets:
            found[b] += packed_covers(group, span.document, span.span_start, span.span_end, b)
    return {f"span_in_context@{b}": round(100 * found[b] / n, 2) if n else float("nan") for b in budgets}


def packed_covers(ranked: pd.DataFrame, document: str, start: int, end: int, budget: int) -> bool:
    """Whether the passages a reader is given at ``budget`` tokens (rank order; stop at the first that does not
    fit; the top one cut to its first ``budget`` * 4 characters of ``title: text`` when it alone is too long)
    hold the span ``[start, end)`` of ``document``."""
    used = 0
    for i, p in enumerate(ranked.itertuples(index=False)):
        prefix = len(str(p.title)) + 2  # "title: "
        cost = math.ceil((prefix + int(p.n_chars)) / CHARS_PER_TOKEN)  # estimate_text_tokens("title: text")
        if used + cost > budget:
            reach = p.char_start + budget * CHARS_PER_TOKEN - prefix  # what the cut top passage keeps
            return i == 0 and p.document == document and p.char_start <= start and end <= min(reach, p.char_end)
        if p.document == document and p.char_start <= start and end <= p.char_end:
            return True
        used += cost
    return False


def result_size(hits: pd.DataFrame, lineage: pd.DataFrame, n: int, qids: Sequence[str]) -> dict[str, float]:
    """``result_chars@n`` and ``result_tokens@n``: mean characters and estimated tokens (~4 characters a token)
    of a passage among each question's top-n results."""
    top = _ranked(hits, lineage, qids)
    top = top[top["rank"] <= n]
    if top.empty:
        return {f"result_chars@{n}": float("nan"), f"result_tokens@{n}": float("nan")}
    chars = top["n_chars"].to_numpy(dtype=float)
    return {f"result_chars@{n}": round(float(chars.mean()), 1),
            f"result_tokens@{n}": round(float(np.ceil(chars / CHARS_PER_TOKEN).mean()), 1)}
