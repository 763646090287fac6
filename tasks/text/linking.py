"""Title-aware linking, beyond the papers: its settings (:class:`LinkingParams`) and the query side.

A question's seeds are the gazetteer names it contains, weighted by their IDF over passages (hub names count
less); a title a question names also restarts the walk at the passage it titles. The matcher is
:mod:`tasks.text.gazetteer`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from tasks.core.limits import COUNT, COUNT0, one_of
from tasks.text.gazetteer import QUALIFIER, Gazetteer, match, match_cased, normalize_text, title_name

LINKINGS = ("ner", "gazetteer")


@dataclass(frozen=True)
class LinkingParams:
    """Beyond the papers: how a graph method links passages and questions to entities.

    ``graph_linking``: ``ner`` (the papers: spaCy mentions) or ``gazetteer`` (titles are entity nodes,
    corpus names matched everywhere). ``query_linking``: ``ner`` (the papers) or ``gazetteer``
    (names the question contains, IDF-weighted seeds). ``gazetteer_min_chars``: shortest name matched.
    ``query_ner``: with gazetteer query linking, whether spaCy's question mentions are kept as seeds too
    (false: the gazetteer alone, microseconds a question instead of spaCy's milliseconds).
    ``query_lowercase_weight``: factor on the seed of a name the question writes all in lower case.
    ``cover_named_min_seed``: see :func:`cover_named`; 0 leaves the method's ranking alone.
    """

    graph_linking: str = field(default="ner", metadata=one_of(LINKINGS))
    query_linking: str = field(default="ner", metadata=one_of(LINKINGS))
    gazetteer_min_chars: int = field(default=4, metadata=COUNT)
    query_ner: bool = True  # false (with query_linking=gazetteer): no spaCy on questions, the gazetteer's names alone
    # factor on a question's names written all in lower case (1 = no cue)
    query_lowercase_weight: float = field(default=1.0, metadata=COUNT0)
    # > 0: each name seeded at least this much puts its best titled passage first
    cover_named_min_seed: float = field(default=0.0, metadata=COUNT0)
    title_aliases: bool = False  # graph_linking=gazetteer: a title's short forms name it too, where unambiguous
    alias_min_share: float = 0.5  # kept if at least this share of the passages writing a short form name its title

    def __post_init__(self) -> None:  # each field's own choices are its one_of metadata (the config check)
        if self.cover_named_min_seed > 0 and (self.graph_linking, self.query_linking) != ("gazetteer", "gazetteer"):
            raise ValueError("method.cover_named_min_seed > 0 needs method.graph_linking=gazetteer and "
                             "method.query_linking=gazetteer: it lifts the passages the question's names title")
        if self.title_aliases and self.graph_linking != "gazetteer":
            raise ValueError("method.title_aliases=true needs method.graph_linking=gazetteer: the aliases are "
                             "the gazetteer's")
        if not 0.0 <= self.alias_min_share <= 1.0:
            raise ValueError(f"method.alias_min_share must be within [0, 1], got {self.alias_min_share}")
        if not self.query_ner and self.query_linking != "gazetteer":
            raise ValueError("method.query_ner=false needs method.query_linking=gazetteer: with neither spaCy nor "
                             "the gazetteer a question links to no entity")


def name_idf(doc_entity: sp.sparray) -> np.ndarray:
    """Per entity, ln(N / df) / ln(N) clipped to [0, 1]: 1 for a name in one passage, 0 for one in all."""
    n = doc_entity.shape[0]
    df = np.bincount(sp.csr_array(doc_entity).tocoo().col, minlength=doc_entity.shape[1])
    return np.clip(np.log(n / np.maximum(df, 1)) / np.log(max(n, 2)), 0.0, 1.0)


def query_seeds(questions: Sequence[str], gaz: Gazetteer, idf: np.ndarray,
                lowercase_weight: float = 1.0) -> sp.csr_array:
    """(Q x E) seeds: the names each question contains (gazetteer scan), weighted by their IDF.

    ``lowercase_weight`` multiplies a name written entirely in lower case in the question ("the
    film", "place of birth"): case is the question's own cue that a phrase names an entity, so
    a common phrase that happens to title a passage seeds less. A name seen in both forms keeps 1.
    """
    if lowercase_weight == 1.0:
        rows, cols = match(questions, gaz)
        factor = np.ones(len(cols))
    else:
        rows, cols, cased = match_cased(questions, gaz)
        factor = np.where(cased, 1.0, lowercase_weight)
    shape = (len(questions), len(idf))
    if len(rows) == 0:
        return sp.csr_array(shape, dtype=np.float64)
    # a name named twice is still one seed of weight idf (times its largest case factor)
    order = np.lexsort((-factor, cols, rows))
    rows, cols, factor = rows[order], cols[order], factor[order]
    first = np.r_[True, (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])]
    rows, cols, factor = rows[first], cols[first], factor[first]
    seeds = sp.csr_array((idf[cols] * factor, (rows, cols)), shape=shape, dtype=np.float64)
    seeds.eliminate_zeros()
    return seeds


def title_docs(titles: Sequence[str], gaz: Gazetteer) -> sp.csr_array:
    """(E x N) 0/1: entity e is the name in passage n's title (:func:`title_name`)."""
    own = np.array([gaz.index.get(title_name(t), -1) for t in titles], dtype=np.int64)
    docs = np.flatnonzero(own >= 0)
    return sp.csr_array((np.ones(len(docs)), (own[docs], docs)), shape=(gaz.size, len(titles)))


def title_restart(query_doc: sp.sparray, cos: np.ndarray, query_entity: sp.sparray,
                  titled: sp.sparray) -> sp.csr_array:
    """(Q x N) query–passage restart links fused with the names the question contains.

    ``query_doc`` holds the method's own exp(cos) links; a passage titled by a linked name (weight w
    in ``query_entity``, e.g. its IDF) links with exp(cos) · (1 + w) instead, kept or not before.
    """
    named = sp.csr_array(sp.csr_array(query_entity) @ sp.csr_array(titled)).tocoo()
    boost = np.exp(cos[named.row, named.col].astype(np.float64)) * (1.0 + named.data)
    fused = sp.csr_array((boost, (named.row, named.col)), shape=query_doc.shape)
    return sp.csr_array(sp.csr_array(query_doc, dtype=np.float64).maximum(fused))


def qualified_titles(titles: Sequence[str]) -> tuple[Gazetteer, np.ndarray, int]:
    """The titles that carry a parenthetical qualifier, whole ("david elliot illustrator"), as a gazetteer:
    ``(gazetteer, passage of each of its names, number of passages)`` for :func:`qualified_title_mentions`."""
    qualified = [i for i, t in enumerate(titles) if QUALIFIER.search(t)]
    return Gazetteer.of([normalize_text(titles[i]) for i in qualified]), np.asarray(qualified, np.int64), len(titles)


def qualified_title_mentions(questions: Sequence[str], qualified: tuple[Gazetteer, np.ndarray, int]) -> sp.csr_array:
    """(Q x N) 1 where a question writes passage n's title *with* its qualifier ("David Elliot
    (Illustrator)"): the question's own choice between same-named passages."""
    gaz, passages, n = qualified
    rows, cols = match(questions, gaz)
    named = sp.csr_array((np.ones(len(rows)), (rows, passages[cols])), shape=(len(questions), n))
    named.sum_duplicates()
    named.data[:] = 1.0
    return named


def cover_named(scores: np.ndarray, seeds: sp.sparray, titled: sp.sparray, min_seed: float,
                qualified: sp.sparray | None = None) -> np.ndarray:
    """Scores (Q x N) re-ordered so that each name the question names comes first (a comparison question names both of its passages).

    For every seed (q, e) of weight >= ``min_seed`` (``seeds`` Q x E, e.g. IDF times the case factor of
    :func:`query_seeds`), the best-scoring passage that e titles (``titled`` E x N) is lifted above every
    passage that is not lifted; lifted passages keep their order among themselves. A comparison question
    then has each compared entity's passage in its top k, whatever the walk did with the other side.
    ``qualified`` (Q x N, :func:`qualified_title_mentions`): a passage the question names with its
    qualifier is the one lifted for its name, whatever its score.
    """
    out = np.array(scores, dtype=np.float64, copy=True)
    if min_seed <= 0 or out.size == 0:
        return out
    s = sp.csr_array(seeds).tocoo()
    keep = s.data >= min_seed
    q, e = s.row[keep].astype(np.int64), s.col[keep].astype(np.int64)
    t = sp.csr_array(titled)
    lengths = t.indptr[e + 1] - t.indptr[e]
    pair = np.repeat(np.arange(q.size), lengths)
    offset = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    p = t.indices[np.repeat(t.indptr[e], lengths) + offset].astype(np.int64)
    lifted = np.zeros(out.shape, dtype=bool)
    exact = sp.csr_array(qualified if qualified is not None else (out.shape)).tocoo()
    lifted[exact.row, exact.col] = True  # the question's "(2015 film)" names its passage outright
    value = out[q[pair], p] + lifted[q[pair], p] * (np.abs(out).max() * 4 + 1.0)  # and picks among namesakes
    order = np.lexsort((p, -value, pair))  # per (query, name): best passage first, ties by lower index
    first = order[np.r_[True, pair[order][1:] != pair[order][:-1]]] if order.size else order
    lifted[q[pair[first]], p[first]] = True  # a passage two names title is lifted once
    return out + lifted * (out.max(axis=1) - out.min(axis=1) + 1.0)[:, None]
