"""Retrieval metrics: passage recall@k against gold, and latency summaries."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.data.corpus import source_documents
from tasks.text.title_index import names_whole_word, plain_title


def recall_at_k(hits: pd.DataFrame, gold: pd.DataFrame, ks: list[int], qids: list[str]) -> dict[str, float]:
    """Mean over questions of |gold ∩ top-k| / |gold|, in percent (questions without gold are skipped)."""
    g = gold[gold["qid"].isin(set(qids))].drop_duplicates(["qid", "doc_id"])
    n_gold = g.groupby("qid").size()
    found = hits.merge(g, on=["qid", "doc_id"], how="inner")
    out = {}
    for k in ks:
        top = found[found["rank"] <= k].drop_duplicates(["qid", "doc_id"])  # a doc counts once
        per_q = top.groupby("qid").size().reindex(n_gold.index, fill_value=0)
        out[f"recall@{k}"] = round(float((per_q / n_gold).mean() * 100), 2) if len(n_gold) else float("nan")
    return out


def document_hits(hits: pd.DataFrame, documents: pd.DataFrame) -> pd.DataFrame:
    """Hits on passages as hits on the documents they were cut from (``documents``' ``doc_id`` → ``document``),
    each document kept at its best rank: gold names source documents, so a hit on any piece counts for its
    document within the same top k passages. Unsplit passages are their own documents: ``hits`` unchanged."""
    if "document" not in documents.columns or (documents["document"] == documents["doc_id"]).all():
        return hits
    source = source_documents(documents)
    mapped = hits.assign(doc_id=hits["doc_id"].map(source).fillna(hits["doc_id"]))
    return mapped.sort_values(["qid", "rank"], kind="stable").drop_duplicates(["qid", "doc_id"]).reset_index(drop=True)


def document_titles(documents: pd.DataFrame) -> pd.DataFrame:
    """``(doc_id, title)`` of the documents gold names (the passages' own ids when unsplit)."""
    if "document" not in documents.columns:
        return documents[["doc_id", "title"]]
    return documents[["document", "title"]].drop_duplicates("document").rename(columns={"document": "doc_id"})


MIN_TIMINGS_FOR_PERCENTILES = 5


def latency_summary(latency: pd.DataFrame, column: str = "ms",
                    min_timings: int = MIN_TIMINGS_FOR_PERCENTILES) -> dict[str, float | None]:
    """mean / p50 / p95 / p99 of a per-query latency column (ms).

    Where queries were timed in batches (a ``batch`` column: every query of a batch has the batch's ms per
    query), the percentiles are over the batches, and None with fewer than ``min_timings`` of them: one or two
    timed batches have no spread to report (``flows.commands.benchmark`` repeats batches for that). The mean is over
    the queries."""
    v = latency[column].to_numpy(dtype=float)
    if v.size == 0:
        return {"mean": float("nan"), "p50": float("nan"), "p95": float("nan"), "p99": float("nan")}
    timings = latency.groupby("batch", sort=False)[column].first().to_numpy(dtype=float) \
        if "batch" in latency else v
    if timings.size < min_timings:
        return {"mean": float(v.mean()), "p50": None, "p95": None, "p99": None}
    return {"mean": float(v.mean()), "p50": float(np.percentile(timings, 50)),
            "p95": float(np.percentile(timings, 95)), "p99": float(np.percentile(timings, 99))}


def recall_by_type(hits: pd.DataFrame, gold: pd.DataFrame, questions: pd.DataFrame, ks: list[int],
                   qids: list[str]) -> dict[str, dict[str, float]]:
    """:func:`recall_at_k` per question type (bridge, comparison, 2hop, ...)."""
    asked = questions[questions["qid"].isin(set(qids))]
    return {str(t): {"n": len(g), **recall_at_k(hits, gold, ks, g["qid"].tolist())}
            for t, g in asked.groupby("qtype", sort=True)}


def names_gold_title(questions: pd.DataFrame, gold: pd.DataFrame, documents: pd.DataFrame) -> pd.Series:
    """Per qid: whether the question names the title of one of its gold passages (whole word, lower case,
    trailing parenthetical qualifier removed: the multi-hop benchmarks' reference matching)."""
    title = documents.set_index("doc_id")["title"].astype(str)
    g = gold.drop_duplicates(["qid", "doc_id"])
    g = g.assign(name=title.reindex(g["doc_id"]).fillna("").map(plain_title).to_numpy())
    text = questions.set_index("qid")["question"].astype(str).str.lower()
    named = {q: False for q in questions["qid"]}
    for q, name in zip(g["qid"], g["name"]):
        if q in text.index and names_whole_word(text[q], name):
            named[q] = True
    return pd.Series(named, name="names_gold_title")


def recall_by_title_mention(hits: pd.DataFrame, gold: pd.DataFrame, questions: pd.DataFrame,
                            documents: pd.DataFrame, ks: list[int], qids: list[str]) -> dict[str, dict[str, float]]:
    """:func:`recall_at_k` on the questions that name a gold passage's title and on those that name none
    (where title links cannot help, a graph method must still beat the simple retrievers)."""
    named = names_gold_title(questions[questions["qid"].isin(set(qids))], gold, documents)
    out = {}
    for key, flag in (("names_gold_title", True), ("names_no_gold_title", False)):
        part = [q for q in qids if bool(named.get(q, False)) == flag]
        out[key] = {"n": len(part), **(recall_at_k(hits, gold, ks, part) if part else {})}
    return out


def dev_split(qids: list[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """A seeded (dev, test) partition of the questions: round(fraction * n) dev questions, the rest test.

    The permutation is of the sorted ids, so a question's side depends on the set of ids and the seed only.
    """
    ordered = sorted(set(qids))
    perm = np.random.default_rng(seed).permutation(len(ordered))
    n_dev = int(round(fraction * len(ordered)))
    dev = {ordered[i] for i in perm[:n_dev]}
    return [q for q in qids if q in dev], [q for q in qids if q not in dev]
