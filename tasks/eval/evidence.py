"""Evidence-level and context recall: did the gold *sentences*, and the gold passages, reach the reader?

- ``evidence_recall@k``: the share of a question's gold supporting sentences found among the method's
  top-k evidence units, averaged over the questions that have gold sentences (HotpotQA, the sample;
  not 2wiki-dev, whose sentence indices are null, nor MuSiQue, whose evidence is whole paragraphs).
  Units are the method's own when it ranks sub-passage evidence (ZoomRAG: ChunkZoom's kept chunks, best
  first, the first k); otherwise the **passage rule**: the sentences of its top-k passages, ranked by the
  cosine between the question and the sentence (MiniLM, sentence text alone), the first k.
- A gold sentence is *found* by a unit that contains it, or by a unit at least half its length that it
  contains (a splitter that cut the sentence in two), after lower-casing and collapsing whitespace.
- ``context_recall``: the share of a question's gold passages whose text reaches the reader's context,
  after the reader's token budget: the top ``eval.context_passages`` passages, or the method's own context
  items (``kept_chunks`` in its trace, each mapped to its passages by ``context_docs``: a ZoomRAG chunk to
  its passage, an EraRAG leaf to its passage and a summary node to every passage under it, an ArchRAG entity,
  relation or community to the passages it was made from). Where passages were cut from documents and gold
  names the documents (``dataset=folder``/``jsonl``, or a split benchmark), a passage in the context counts
  for the document it was cut from, as :func:`tasks.eval.metrics.document_hits` counts a hit.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from tasks.data.corpus import source_documents
from tasks.llm.generate import select_passages
from tasks.text.sentences import split_sentences


def normalise(text: str) -> str:
    """Lower-cased, whitespace collapsed."""
    return " ".join(str(text).lower().split())


def sentence_found(gold: str, units: list[str]) -> bool:
    """Whether a gold sentence is found: a unit contains it, or it contains a unit ≥ half its length."""
    g = normalise(gold)
    for unit in units:
        u = normalise(unit)
        if g in u or (u and u in g and 2 * len(u) >= len(g)):
            return True
    return False


def evidence_recall(units: Mapping[str, list[str]], gold_sentences: pd.DataFrame, qids: list[str]) -> float:
    """Mean over questions with gold sentences of |gold sentences found in units| / |gold sentences|, in %."""
    g = gold_sentences[gold_sentences["qid"].isin(set(qids))]
    if g.empty:
        return float("nan")
    per_q = [np.mean([sentence_found(s, units.get(qid, [])) for s in group["sentence"]])
             for qid, group in g.groupby("qid", sort=True)]
    return round(float(np.mean(per_q) * 100), 2)


def passage_sentences(hits: pd.DataFrame, docs: pd.DataFrame, depth: int) -> pd.DataFrame:
    """The sentences of each question's top-``depth`` passages → ``(qid, rank, position, sentence)``."""
    text = dict(zip(docs["doc_id"], docs["text"]))
    rows = [(qid, rank, pos, s) for qid, rank, doc in hits.loc[hits["rank"] <= depth, ["qid", "rank", "doc_id"]]
            .itertuples(index=False) for pos, s in enumerate(split_sentences(text.get(doc, "")))]
    return pd.DataFrame(rows, columns=["qid", "rank", "position", "sentence"])


def rank_sentences(sentences: pd.DataFrame, cosine: np.ndarray, k: int) -> dict[str, list[str]]:
    """The passage rule at k: sentences of the top-k passages, by query–sentence cosine (ties: passage
    rank, then position), the first k."""
    frame = sentences.assign(cos=cosine)
    frame = frame[frame["rank"] <= k].sort_values(["qid", "cos", "rank", "position"],
                                                  ascending=[True, False, True, True], kind="stable")
    return {qid: group["sentence"].head(k).tolist() for qid, group in frame.groupby("qid", sort=False)}


def chunk_units(traces: pd.DataFrame, k: int) -> dict[str, list[str]]:
    """A method's own evidence units at k: the first k of its trace's ``kept_chunks`` (best first)."""
    return {qid: _list(chunks)[:k] for qid, chunks in zip(traces["qid"], traces["kept_chunks"])}


def context_recall(context_docs: Mapping[str, set[str]], gold: pd.DataFrame, qids: list[str]) -> float:
    """Mean over questions with gold of |gold passages in the reader's context| / |gold passages|, in %."""
    g = gold[gold["qid"].isin(set(qids))].drop_duplicates(["qid", "doc_id"])
    if g.empty:
        return float("nan")
    per_q = [np.mean([d in context_docs.get(qid, set()) for d in group["doc_id"]])
             for qid, group in g.groupby("qid", sort=True)]
    return round(float(np.mean(per_q) * 100), 2)


def with_source_documents(context_docs: Mapping[str, set[str]], documents: pd.DataFrame) -> dict[str, set[str]]:
    """Each question's context passages together with the documents they were cut from (``documents``'
    ``doc_id`` → ``document``): gold that names a document is in the context when one of its passages is.
    Unsplit passages are their own documents: the sets unchanged."""
    if "document" not in documents.columns:
        return dict(context_docs)
    source = source_documents(documents)
    return {qid: ids | {source.get(d, d) for d in ids} for qid, ids in context_docs.items()}


def reader_context_docs(hits: pd.DataFrame, docs: pd.DataFrame, traces: pd.DataFrame | None, n_passages: int,
                        max_tokens: int) -> dict[str, set[str]]:
    """Per question, the passages whose text reaches the reader (what ``contexts_for`` gives, then the budget)."""
    text = dict(zip(docs["doc_id"], (docs["title"] + ": " + docs["text"]).tolist()))
    out: dict[str, set[str]] = {}
    for qid, group in hits[hits["rank"] <= n_passages].sort_values(["qid", "rank"]).groupby("qid", sort=False):
        ids = group["doc_id"].tolist()
        out[qid] = set(ids[:len(select_passages([text[d] for d in ids], max_tokens))])
    if traces is not None and {"kept_chunks", "context_docs"} <= set(traces.columns):
        for qid, chunks, chunk_docs in zip(traces["qid"], traces["kept_chunks"], traces["context_docs"]):
            kept = _list(chunks)
            if kept:  # as contexts_for: a method's own context replaces its passages when it kept any
                fit = len(select_passages(kept, max_tokens))
                out[qid] = {d for ds in _list(chunk_docs)[:fit] for d in ds}
    return out


def _list(value: Any) -> list:
    """A trace cell: a JSON string (as stored) or a list."""
    if isinstance(value, str):
        return json.loads(value)
    return [] if value is None else list(value)


def score_evidence(hits: pd.DataFrame, docs: pd.DataFrame, gold: pd.DataFrame, gold_sentences: pd.DataFrame,
                   questions: pd.DataFrame, traces: pd.DataFrame | None, ks: list[int], own_units: bool,
                   passage_context: bool, n_passages: int, max_tokens: int,
                   encode_sentences: Callable[[list[str]], np.ndarray],
                   encode_questions: Callable[[list[str]], np.ndarray]) -> dict[str, Any]:
    """``evidence_recall@k`` for each k and ``context_recall`` (None where the reader's context cannot be traced to
    passages: a method with its own generation whose trace has no ``context_docs``)."""
    qids = hits["qid"].unique().tolist()
    out: dict[str, Any] = {}
    asked = gold_sentences[gold_sentences["qid"].isin(set(qids))]
    if not asked.empty:
        if own_units and traces is not None and "kept_chunks" in traces.columns:
            units_at = {k: chunk_units(traces, k) for k in ks}
            out["evidence_units"] = "chunks"
        else:
            sents = passage_sentences(hits[hits["qid"].isin(set(asked["qid"]))], docs, max(ks))
            q = questions.set_index("qid").loc[sents["qid"].unique(), "question"]
            q_emb = dict(zip(q.index, encode_questions(q.tolist())))
            s_emb = encode_sentences(sents["sentence"].tolist())
            cos = np.einsum("ij,ij->i", s_emb, np.stack([q_emb[x] for x in sents["qid"]])) if len(sents) else []
            units_at = {k: rank_sentences(sents, cos, k) for k in ks}
            out["evidence_units"] = "passage sentences"
        out.update({f"evidence_recall@{k}": evidence_recall(units_at[k], asked, qids) for k in ks})
        out["n_questions_with_sentences"] = int(asked["qid"].nunique())
    context = with_source_documents(reader_context_docs(hits, docs, traces, n_passages, max_tokens), docs)
    out["context_recall"] = context_recall(context, gold, qids) if passage_context else None
    return out
