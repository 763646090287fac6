"""Which passages a text names by title: the title index a retriever reads, and the coverage measures.

A title is plain once its trailing parenthetical qualifier is removed ("Peter Jones (actor)" → "Peter Jones"),
and a text names it when the plain title occurs whole-word.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import scipy.sparse as sp

from tasks.core.store import ArtifactRef, Store
from tasks.text.ner import normalize_entity
from tasks.text.gazetteer import QUALIFIER, Gazetteer, title_name
from tasks.text.linking import cover_named, qualified_title_mentions, qualified_titles, title_docs

@dataclass(frozen=True)
class TitleIndex:
    """What a retriever needs of the passages' titles: ``titled`` (E x N, :func:`title_docs`) and, for
    :func:`cover_named`, the gazetteer of qualified titles (:func:`qualified_titles`; None when unused)."""

    titled: sp.csr_array
    qualified: tuple[Gazetteer, np.ndarray, int] | None

    @classmethod
    def read(cls, documents: ArtifactRef, doc_ids: Sequence[str], gaz: Gazetteer, qualified: bool) -> "TitleIndex":
        """The titles of ``documents`` in the order of ``doc_ids`` (the retriever's passage order)."""
        docs = Store.read(documents, ["doc_id", "title"]).set_index("doc_id")
        titles = docs["title"].reindex(list(doc_ids)).fillna("").astype(str).tolist()
        return cls(title_docs(titles, gaz), qualified_titles(titles) if qualified else None)

    def cover(self, scores: np.ndarray, seeds: sp.sparray, questions: Sequence[str], min_seed: float) -> np.ndarray:
        """:func:`cover_named` with the questions' qualified titles."""
        if self.qualified is None:
            raise ValueError("this TitleIndex was read without qualified titles (qualified=False)")
        return cover_named(scores, seeds, self.titled, min_seed, qualified_title_mentions(questions, self.qualified))


def plain_title(title: str) -> str:
    """A title as the multi-hop benchmarks' reference matching reads it: qualifier removed, lower case."""
    return QUALIFIER.sub("", str(title)).lower().strip()


def names_whole_word(text: str, name: str) -> bool:
    """``text`` (already lower case) contains ``name`` as whole words."""
    return bool(name) and re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", text) is not None


def named_titles(titles: Sequence[str], texts: Sequence[str], min_chars: int = 4) -> pd.DataFrame:
    """``(doc, titled)``: passage ``doc``'s lower-cased text names passage ``titled``'s title (whole word).

    An independent reference for :func:`title_link_coverage`: one regex alternation of the titles over
    the raw lower-cased text, as the reference matching does; no gazetteer normalisation.
    """
    plain = [plain_title(t) for t in titles]
    by_name: dict[str, list[int]] = {}
    for i, t in enumerate(plain):
        if len(t) >= min_chars:
            by_name.setdefault(t, []).append(i)
    if not by_name:
        return pd.DataFrame({"doc": pd.Series(dtype="int64"), "titled": pd.Series(dtype="int64")})
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(t) for t in sorted(by_name, key=len, reverse=True))
                         + r")(?!\w)")
    pairs = {(d, j) for d, text in enumerate(texts) for hit in pattern.findall(text.lower())
             for j in by_name[hit] if j != d}
    frame = pd.DataFrame(sorted(pairs), columns=["doc", "titled"], dtype="int64")
    return frame


def title_link_coverage(titles: Sequence[str], texts: Sequence[str], doc_entity: sp.sparray,
                        entity_names: Sequence[str]) -> dict[str, int]:
    """How many (passage, title it names) pairs the entity graph carries.

    ``named``: pairs from :func:`named_titles`; ``node``: the title's name is an entity node of the
    naming passage; ``linked``: that node is also an entity of the titled passage, so a walk goes
    passage → title entity → titled passage. A title's name is looked up in both normal forms
    (:func:`title_name` and the NER's :func:`normalize_entity`).
    """
    pairs = named_titles(titles, texts)
    index = {str(n): i for i, n in enumerate(entity_names)}
    names = [title_name(t) for t in titles]
    alt = [normalize_entity(QUALIFIER.sub("", t)) for t in titles]
    col = np.array([index.get(a, index.get(b, -1)) for a, b in zip(names, alt)], dtype=np.int64)
    D = sp.csr_array(doc_entity) != 0
    c = col[pairs["titled"].to_numpy()]
    known = c >= 0
    d, t = pairs["doc"].to_numpy()[known], pairs["titled"].to_numpy()[known]
    in_doc = np.asarray(D[d, c[known]]).ravel().astype(bool)
    in_titled = np.asarray(D[t, c[known]]).ravel().astype(bool)
    return {"named": int(len(pairs)), "node": int(in_doc.sum()), "linked": int((in_doc & in_titled).sum())}
