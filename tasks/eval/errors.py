"""Why a graph method misses a gold passage that a simpler retriever finds (error analysis).

Pure pandas over a run's ``hits`` and the dataset's tables; no models. A missed gold passage gets one
reason, judged from titles alone (the multi-hop benchmarks' reference matching of a title in a text:
whole-word, lower case, trailing parenthetical qualifier removed):

* ``comparison, one side missing``: a comparison question whose other gold passage is retrieved;
* ``ambiguous title``: the question names the passage's title, and another passage has the same title;
* ``named, ranked low``: the question names the title, the walk did not rank the passage high enough;
* ``bridge, wrong hop``: the question does not name it, another gold passage does (the second hop);
* ``no title link``: neither the question nor another gold passage names it (a described entity).
"""
from __future__ import annotations

import pandas as pd

from tasks.text.title_index import names_whole_word as _names
from tasks.text.title_index import plain_title as _title


def missed_gold(hits: pd.DataFrame, gold: pd.DataFrame, k: int, qids: list[str]) -> pd.DataFrame:
    """``(qid, doc_id)`` of the gold passages not in a question's top ``k``."""
    g = gold[gold["qid"].isin(set(qids))].drop_duplicates(["qid", "doc_id"])
    top = hits[hits["rank"] <= k][["qid", "doc_id"]].drop_duplicates()
    found = g.merge(top, on=["qid", "doc_id"], how="left", indicator=True)
    return found[found["_merge"] == "left_only"][["qid", "doc_id"]].reset_index(drop=True)


def miss_reasons(missed: pd.DataFrame, hits: pd.DataFrame, gold: pd.DataFrame, questions: pd.DataFrame,
                 documents: pd.DataFrame, k: int) -> pd.DataFrame:
    """One row per missed gold passage: ``qid, doc_id, qtype, reason`` (see the module docstring)."""
    docs = documents.set_index("doc_id")
    name = docs["title"].map(_title)
    text = docs["text"].astype(str).str.lower()
    title_count = name.value_counts()
    q = questions.set_index("qid")
    golds = gold.drop_duplicates(["qid", "doc_id"]).groupby("qid")["doc_id"].apply(list)
    top = hits[hits["rank"] <= k].groupby("qid")["doc_id"].apply(set)
    rows = []
    for qid, doc in zip(missed["qid"], missed["doc_id"]):
        question, qtype, title = str(q.at[qid, "question"]).lower(), str(q.at[qid, "qtype"]), name.get(doc, "")
        others = [d for d in golds.get(qid, []) if d != doc]
        if "comparison" in qtype and any(d in top.get(qid, set()) for d in others):
            reason = "comparison, one side missing"
        elif _names(question, title):
            reason = "ambiguous title" if title_count.get(title, 0) > 1 else "named, ranked low"
        elif any(_names(text.get(d, ""), title) for d in others):
            reason = "bridge, wrong hop"
        else:
            reason = "no title link"
        rows.append({"qid": qid, "doc_id": doc, "qtype": qtype, "reason": reason})
    return pd.DataFrame(rows, columns=["qid", "doc_id", "qtype", "reason"])


def losses_against(method_hits: pd.DataFrame, other_hits: pd.DataFrame, gold: pd.DataFrame,
                   questions: pd.DataFrame, documents: pd.DataFrame, k: int, qids: list[str]) -> pd.DataFrame:
    """:func:`miss_reasons` of the method's misses on the questions where ``other_hits`` finds more gold
    passages in its top ``k`` than the method does."""
    mine, theirs = missed_gold(method_hits, gold, k, qids), missed_gold(other_hits, gold, k, qids)
    n_mine, n_theirs = mine.groupby("qid").size(), theirs.groupby("qid").size()
    worse = [qid for qid in qids if n_mine.get(qid, 0) > n_theirs.get(qid, 0)]
    return miss_reasons(mine[mine["qid"].isin(set(worse))], method_hits, gold, questions, documents, k)
