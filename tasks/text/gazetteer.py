"""Title-aware entity linking, beyond the papers: a gazetteer of the corpus's own names.

The papers link a passage to the entities spaCy finds in it, one node per exact normalised string.
On Wikipedia-style corpora that loses the links that matter: a passage is about the entity its
title names, and the bridge to a second hop is another passage's title written in the text,
often lower-cased or possessive ("jones's"), which NER misses or splits. Here:

* every passage's title, with a trailing parenthetical qualifier removed ("Peter Jones (actor)"
  → "peter jones"), is an entity node of that passage;
* the names of the corpus (titles and NER strings) form a gazetteer, matched whole-word,
  longest match first (spaCy's filter_spans rule), over the normalised text of every chunk (and of questions): lower-cased,
  possessive 's stripped, punctuation removed, dotted initials joined ("U.S." → "us");
* a name's weight as a query seed is its IDF over passages, so hub names count less.

The matcher is a word-level trie in dict form (every name's word n-gram is a key; a scan tries
the longest n-gram first at each word that starts some name), so matches are whole-word by
construction. Pure functions first, then the stage.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.sparse as sp

from tasks.core.stage import RunContext, StageParams, from_config, input_fps, run_stage, stage
from tasks.core.store import ArtifactRef, Store
from tasks.graph.relation_gate import RelationGate
from tasks.text.embed import EmbedParams, embed, load_embeddings
from tasks.text.ner import normalize_entity
from tasks.core.limits import COUNT, COUNT0, one_of

_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")
_INITIALS = re.compile(r"\b(?:\w\.){2,}")


def normalize_text(text: str) -> str:
    """Text in the gazetteer's form: dotted initials joined ("U.S." → "US"), then :func:`normalize_entity`."""
    text = unicodedata.normalize("NFKC", text)
    return normalize_entity(_INITIALS.sub(lambda m: m.group(0).replace(".", ""), text))


def title_name(title: str) -> str:
    """The entity a passage's title names: its trailing parenthetical qualifier removed, normalised."""
    return normalize_text(_QUALIFIER.sub("", title))


def build_names(titles: Sequence[str], surfaces: Sequence[str], min_chars: int = 4) -> pd.DataFrame:
    """``names(entity_idx, entity, n_words, is_title)``: normalised titles and NER surfaces, sorted, unique.

    Names shorter than ``min_chars`` characters or made only of digits are dropped (they match noise).
    """
    titled = {title_name(t) for t in titles}
    names = titled | {normalize_text(s) for s in surfaces}
    names = np.array(sorted(n for n in names if len(n) >= min_chars and not n.replace(" ", "").isdigit()),
                     dtype=object)
    return pd.DataFrame({"entity_idx": np.arange(len(names), dtype=np.int64), "entity": names,
                         "n_words": [len(n.split()) for n in names],
                         "is_title": [n in titled for n in names]})


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

    def __post_init__(self) -> None:
        for key in ("graph_linking", "query_linking"):
            if getattr(self, key) not in LINKINGS:
                raise ValueError(f"method.{key} must be one of {LINKINGS}, got {getattr(self, key)!r}")
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


@dataclass(frozen=True)
class Gazetteer:
    """Names → entity index, keyed by their word sequence; ``starts`` holds every name's first word."""

    index: dict[str, int]
    starts: frozenset[str]
    max_words: int
    size: int  # vocabulary size (entity indices run 0..size-1)

    @classmethod
    def of(cls, names: Sequence[str], min_chars: int = 1, aliases: Mapping[str, int] | None = None) -> "Gazetteer":
        """The gazetteer of a vocabulary (position = entity index); names under ``min_chars`` are left out.
        ``aliases`` (e.g. :func:`unambiguous_short_forms`) are further strings for an entity; a vocabulary
        name wins over an alias."""
        index = {str(n): i for i, n in enumerate(names) if len(str(n)) >= min_chars}
        for alias, i in (aliases or {}).items():
            if len(alias) >= min_chars:
                index.setdefault(alias, int(i))
        return cls(index, frozenset(n.split()[0] for n in index), max((len(n.split()) for n in index), default=1),
                   len(names))


def scan_spans(words: list[str], gaz: Gazetteer) -> list[tuple[int, int, int]]:
    """Names in a word list, non-overlapping: ``(first word, n words, entity index)`` in text order.

    Each word starts at most its longest name; where those overlap, the longer name wins (ties: the leftmost),
    the rule of spaCy's ``filter_spans``. A leftmost-first scan would read "film age old friends" as
    "film age" + "old friends" and lose the title "Age-Old Friends".
    """
    found, n_words = [], len(words)
    for i, word in enumerate(words):
        if word in gaz.starts:
            for n in range(min(gaz.max_words, n_words - i), 0, -1):
                hit = gaz.index.get(" ".join(words[i:i + n]))
                if hit is not None:
                    found.append((i, n, hit))
                    break
    if len(found) < 2:
        return found
    found.sort(key=lambda span: (-span[1], span[0]))
    taken = bytearray(n_words)
    kept = []
    for i, n, hit in found:
        if not any(taken[i:i + n]):
            taken[i:i + n] = b"\x01" * n
            kept.append((i, n, hit))
    kept.sort()
    return kept


def scan(words: list[str], gaz: Gazetteer) -> list[int]:
    """Entity indices named in a word list (:func:`scan_spans`), one per occurrence."""
    return [hit for _, _, hit in scan_spans(words, gaz)]


def cased_words(text: str) -> set[str]:
    """Normalised words that come from a token with an upper-case letter ("Jones's" → {"jones"})."""
    return {w for token in text.split() if any(c.isupper() for c in token) for w in normalize_text(token).split()}


def mask_names(texts: Sequence[str], gaz: Gazetteer) -> list[str]:
    """Each text in the gazetteer's form with the names it writes capitalised left out: what remains is the
    relation ("Where did the director of film The Eagle's Eye study?" → "where did the director of film the
    study", "It was directed by George Lessey." → "it was directed by"). Lower-case names ("film", "director")
    stay: they are the relation's own words. Case is judged per text, as :func:`match_cased` does."""
    out = []
    for text in texts:
        words, capital = normalize_text(text).split(), cased_words(text)
        drop = bytearray(len(words))
        for start, n, _ in scan_spans(words, gaz):
            if any(w in capital for w in words[start:start + n]):
                drop[start:start + n] = b"\x01" * n
        out.append(" ".join(w for w, gone in zip(words, drop) if not gone))
    return out


def match(texts: Sequence[str], gaz: Gazetteer) -> tuple[np.ndarray, np.ndarray]:
    """Every name occurrence in ``texts``: ``(text position, entity index)`` arrays, one row per occurrence."""
    hits = [scan(normalize_text(t).split(), gaz) for t in texts]
    rows = np.repeat(np.arange(len(texts), dtype=np.int64), [len(h) for h in hits])
    return rows, np.fromiter((e for h in hits for e in h), dtype=np.int64, count=len(rows))


def match_cased(texts: Sequence[str], gaz: Gazetteer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`match` and, per occurrence, whether the text writes a word of the name with a capital letter
    (:func:`cased_words` of that text): case is a text's own cue that a phrase names an entity."""
    rows, cols, cased = [], [], []
    for i, text in enumerate(texts):
        words, capital = normalize_text(text).split(), cased_words(text)
        for start, n, hit in scan_spans(words, gaz):
            rows.append(i)
            cols.append(hit)
            cased.append(any(w in capital for w in words[start:start + n]))
    return np.asarray(rows, np.int64), np.asarray(cols, np.int64), np.asarray(cased, bool)


def _counts(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], cased: np.ndarray | None = None
            ) -> pd.DataFrame:
    """COO ``(row, col, value)`` occurrence counts (duplicates summed); with ``cased`` (one flag per
    occurrence) a ``cased`` column counts the occurrences written with a capital letter."""
    m = sp.csr_array((np.ones(len(rows)), (rows, cols)), shape=shape)
    m.sum_duplicates()
    c = m.tocoo()
    out = pd.DataFrame({"row": c.row.astype("int64"), "col": c.col.astype("int64"), "value": c.data})
    if cased is not None:
        k = sp.csr_array((np.asarray(cased, np.float64), (rows, cols)), shape=shape)
        k.sum_duplicates()
        out["cased"] = np.asarray(k[out["row"].to_numpy(), out["col"].to_numpy()]).ravel()
    return out


def lowercase_only(doc_entity: pd.DataFrame, shape: tuple[int, int]) -> sp.csr_array:
    """(N x E) 1 where passage n writes name e only in lower case (``doc_entity``'s ``cased`` count is 0): a
    common noun ("the princess", "an editor") rather than the passage that the name titles."""
    if "cased" not in doc_entity.columns:
        raise ValueError("the doc-entity table has no 'cased' column: it was not built by linked_entity_graph "
                         "(method.graph_linking=gazetteer)")
    low = doc_entity[doc_entity["cased"].to_numpy() == 0]
    return sp.csr_array((np.ones(len(low)), (low["row"].to_numpy(), low["col"].to_numpy())), shape=shape)


def linked_incidence(titles: Sequence[str], chunk_texts: Sequence[str], chunk_doc: np.ndarray,
                     chunk_first: np.ndarray, gaz: Gazetteer) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Doc–entity and chunk–entity counts from the gazetteer: names matched in every chunk, plus each
    document's title entity, counted once in its document and in its first chunk (``chunk_first``:
    the chunk index of each document's first chunk, -1 when it has none). The doc table's ``cased``
    column counts the mentions written with a capital letter (:func:`match_cased`; a title counts)."""
    n_docs, n_chunks, m = len(titles), len(chunk_texts), gaz.size
    c_rows, c_cols, c_cased = match_cased(chunk_texts, gaz)
    own = np.array([gaz.index.get(title_name(t), -1) for t in titles], dtype=np.int64)
    has = own >= 0
    titled_chunk = has & (chunk_first >= 0)
    chunk_rows = np.concatenate([c_rows, chunk_first[titled_chunk]])
    chunk_cols = np.concatenate([c_cols, own[titled_chunk]])
    doc_rows = np.concatenate([np.asarray(chunk_doc, np.int64)[c_rows], np.flatnonzero(has)])
    doc_cols = np.concatenate([c_cols, own[has]])
    doc_cased = np.concatenate([c_cased, np.ones(int(has.sum()), bool)])  # a title is written as a name
    return _counts(doc_rows, doc_cols, (n_docs, m), doc_cased), _counts(chunk_rows, chunk_cols, (n_chunks, m))


_SHORT_SPLIT = re.compile(r",| of ")


def title_short_forms(title: str, min_chars: int = 4) -> set[str]:
    """Shorter forms a title may go by in text, normalised: the part before its first comma or " of "
    ("Mithridates VI of Pontus" → "mithridates vi"), that part without a leading "the", and its first and
    last word when it has two to four ("George Lessey" → "george", "lessey"; "Mithridates VI" → "mithridates").
    Candidates only: :func:`unambiguous_short_forms` keeps those that are unambiguous in the corpus."""
    plain = _QUALIFIER.sub("", title)
    name = normalize_text(plain)
    head = normalize_text(_SHORT_SPLIT.split(plain, maxsplit=1)[0])  # "mithridates vi": never "pontus"
    forms = {head}
    words = head.split()
    if words[:1] == ["the"]:
        forms.add(" ".join(words[1:]))
    if 2 <= len(words) <= 4:
        forms.update((words[0], words[-1]))
    return {f for f in forms if f != name and len(f) >= min_chars and not f.replace(" ", "").isdigit()}


def unambiguous_short_forms(titles: Sequence[str], doc_texts: Sequence[str], names: Sequence[str],
                            doc_names: sp.sparray, min_share: float = 0.5, min_chars: int = 4) -> dict[str, int]:
    """Short forms (:func:`title_short_forms`) that stand for one title in this corpus: ``{alias: entity index}``.

    A form is kept when it is the short form of exactly one title name, is no name of the vocabulary
    ``names`` (titles and NER strings: those are entities of their own), and at least ``min_share`` of the
    passages that write it (whole word, in ``doc_texts``) also name that title or are its passage
    (``doc_names``, passages x entities, nonzero where a passage names the entity, its own title included)
    and write it capitalised (a name, not the common word: "Aunt" for "Charley's Aunt" is not kept).
    "Lessey" is kept where the passages writing it are about, or name, George Lessey; "George" is not.
    """
    vocabulary = {str(n): i for i, n in enumerate(names)}
    owners: dict[str, set[int]] = {}
    for t in titles:
        own = vocabulary.get(title_name(t))
        if own is not None:
            for form in title_short_forms(t, min_chars):
                owners.setdefault(form, set()).add(own)
    forms = sorted(f for f, o in owners.items() if len(o) == 1 and f not in vocabulary)
    if not forms:
        return {}
    entity = np.array([next(iter(owners[f])) for f in forms], dtype=np.int64)
    rows, cols = match(doc_texts, Gazetteer.of(forms))  # passage x form: which passages write each form
    writes = sp.csr_array((np.ones(len(rows)), (rows, cols)), shape=(len(doc_texts), len(forms)))
    writes.sum_duplicates()
    writes = writes.tocoo()
    names_it = np.asarray(sp.csr_array(doc_names)[writes.row, entity[writes.col]]).ravel() > 0
    cased = [cased_words(t) for t in doc_texts]
    capitalised = np.fromiter((all(w in cased[d] for w in forms[f].split()) for d, f in zip(writes.row, writes.col)),
                              dtype=bool, count=writes.nnz)
    n_write = np.bincount(writes.col, minlength=len(forms))
    n_both = np.bincount(writes.col[names_it], minlength=len(forms))
    n_cased = np.bincount(writes.col[capitalised], minlength=len(forms))
    keep = (n_write > 0) & (n_both >= min_share * n_write) & (n_cased >= min_share * n_write)
    return {forms[i]: int(entity[i]) for i in np.flatnonzero(keep)}


def aliases_of(vocab: pd.DataFrame) -> dict[str, int]:
    """``{alias: entity index}`` from an entities table's ``aliases`` column ("a|b" per entity); {} without one."""
    if "aliases" not in vocab.columns:
        return {}
    return {a: int(i) for i, joined in zip(vocab["entity_idx"], vocab["aliases"].fillna("")) for a in joined.split("|")
            if a}


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
    qualified = [i for i, t in enumerate(titles) if _QUALIFIER.search(t)]
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


# ---------------------------------------------------------------- checking the graph: what linking put in it

def plain_title(title: str) -> str:
    """A title as the multi-hop benchmarks' reference matching reads it: qualifier removed, lower case."""
    return _QUALIFIER.sub("", str(title)).lower().strip()


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
    alt = [normalize_entity(_QUALIFIER.sub("", t)) for t in titles]
    col = np.array([index.get(a, index.get(b, -1)) for a, b in zip(names, alt)], dtype=np.int64)
    D = sp.csr_array(doc_entity) != 0
    c = col[pairs["titled"].to_numpy()]
    known = c >= 0
    d, t = pairs["doc"].to_numpy()[known], pairs["titled"].to_numpy()[known]
    in_doc = np.asarray(D[d, c[known]]).ravel().astype(bool)
    in_titled = np.asarray(D[t, c[known]]).ravel().astype(bool)
    return {"named": int(len(pairs)), "node": int(in_doc.sum()), "linked": int((in_doc & in_titled).sum())}


# ---------------------------------------------------------------- stage

@dataclass(frozen=True)
class LinkedGraphParams(StageParams):
    """The gazetteer's entity layer (``method.graph_linking=gazetteer``): shortest name, and title aliases."""

    SOURCES = ("method",)
    min_chars: int = from_config("gazetteer_min_chars")
    title_aliases: bool = False
    alias_min_share: float = 0.5


@stage("linked_entity_graph", params=LinkedGraphParams)
def linked_entity_graph(ctx: RunContext, params: LinkedGraphParams, documents: ArtifactRef, chunks: ArtifactRef,
                        doc_mentions: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: the gazetteer's entity vocabulary and doc–/chunk–entity counts, the tables
    :func:`tasks.text.entities.entity_graph` writes (``graph_linking: gazetteer``). With ``title_aliases``
    the vocabulary's ``aliases`` column holds each title's unambiguous short forms
    (:func:`unambiguous_short_forms`), and the chunks are matched with them."""
    min_chars = params.min_chars

    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        docs = Store.read(documents, ["doc_id", "title"])
        ch = Store.read(chunks, ["chunk_id", "doc_id", "position", "text"])
        surfaces = Store.read(doc_mentions, ["surface"])["surface"].astype(str).tolist()
        titles, texts = docs["title"].astype(str).tolist(), ch["text"].astype(str).tolist()
        vocab = build_names(titles, surfaces, min_chars)
        names = vocab["entity"].tolist()
        doc_pos = pd.Series(np.arange(len(docs), dtype=np.int64), index=pd.Index(docs["doc_id"]))
        chunk_doc = doc_pos.loc[ch["doc_id"]].to_numpy()
        first = np.full(len(docs), -1, dtype=np.int64)
        lowest = pd.Series(ch["position"].to_numpy()).groupby(chunk_doc).idxmin()
        first[lowest.index.to_numpy()] = lowest.to_numpy()
        doc_entity, chunk_entity = linked_incidence(titles, texts, chunk_doc, first, Gazetteer.of(names))
        if params.title_aliases:  # a second pass: the first one's passage–name counts decide which short forms stand
            doc_names = sp.csr_array((doc_entity["value"], (doc_entity["row"], doc_entity["col"])),
                                     shape=(len(docs), len(names)))
            doc_texts = pd.Series(texts).groupby(chunk_doc).agg(" ".join).reindex(range(len(docs)), fill_value="")
            aliases = unambiguous_short_forms(titles, doc_texts.tolist(), names, doc_names, params.alias_min_share,
                                              min_chars)
            joined = pd.Series(list(aliases), dtype=object).groupby(list(aliases.values())).agg("|".join)
            vocab["aliases"] = joined.reindex(vocab["entity_idx"]).fillna("").to_numpy(dtype=object)
            doc_entity, chunk_entity = linked_incidence(titles, texts, chunk_doc, first,
                                                        Gazetteer.of(names, aliases=aliases))
        return {"entities": vocab, "doc_entity": doc_entity, "chunk_entity": chunk_entity}, len(vocab)

    return run_stage(ctx, params, input_fps(documents=documents, chunks=chunks, mentions=doc_mentions), compute)


@dataclass(frozen=True)
class RelationSentencesParams(StageParams):
    """The shortest name masked (``method.gazetteer_min_chars``)."""

    SOURCES = ("method",)
    min_chars: int = from_config("gazetteer_min_chars")


@stage("relation_sentences", params=RelationSentencesParams)
def relation_sentences(ctx: RunContext, params: RelationSentencesParams, chunks: ArtifactRef, entities: ArtifactRef,
                       chunk_entity: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage (beyond the paper, ``relation_gate_masked``): ``relation_sentences(chunk_id, text)``, every chunk
    that writes a title's name, with the names it writes capitalised left out (:func:`mask_names`). The masked
    relation gate (ZoomRAG, LinearRAG) compares these with the questions, likewise masked, so that the relation
    decides and not a name the two share."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        vocab = Store.read(entities).sort_values("entity_idx")
        ce = Store.read(chunk_entity, ["row", "col"])
        is_title = vocab["is_title"].to_numpy(dtype=bool)
        rows = np.unique(ce["row"].to_numpy()[is_title[ce["col"].to_numpy()]])
        ch = Store.read(chunks, ["chunk_id", "text"])
        gaz = Gazetteer.of(vocab["entity"].tolist(), params.min_chars, aliases_of(vocab))
        masked = mask_names(ch["text"].astype(str).to_numpy()[rows].tolist(), gaz)
        return {"relation_sentences": pd.DataFrame({"chunk_id": ch["chunk_id"].to_numpy()[rows], "text": masked})}, len(rows)

    return run_stage(ctx, params, input_fps(chunks=chunks, entities=entities, chunk_entity=chunk_entity), compute)


def masked_relation_gate(gate: RelationGate, index: Mapping[str, ArtifactRef], chunk_ids: np.ndarray) -> RelationGate:
    """``gate`` comparing questions with its sentences' masked embeddings (:func:`relation_sentences`, then the
    embed stage) instead of their own; ``chunk_ids`` are the ids of the chunks table that ``gate.chunks`` indexes."""
    if "relation_embeddings" not in index:
        raise RuntimeError("method.relation_gate_masked=true needs the relation_sentences stage: index again")
    ids, emb = load_embeddings(index["relation_embeddings"], "chunk_id")
    row = pd.Series(np.arange(len(ids)), index=pd.Index(ids))
    wanted = pd.Index(np.asarray(chunk_ids, dtype=object)[gate.chunks])
    if not wanted.isin(row.index).all():
        raise RuntimeError("relation_sentences lacks chunks the gate reads; delete the artifacts and index again")
    return replace(gate, chunk_emb=np.ascontiguousarray(emb[row.loc[wanted].to_numpy()], dtype=np.float32))


def index_relation_embeddings(ctx: RunContext, cfg, chunks: ArtifactRef, entities: ArtifactRef,
                              chunk_entity: ArtifactRef) -> dict[str, ArtifactRef]:
    """The index's ``relation_embeddings`` for the masked relation gate: :func:`relation_sentences`, embedded."""
    masked = relation_sentences(ctx, RelationSentencesParams.of(cfg), chunks, entities, chunk_entity)
    embedded = embed(ctx, EmbedParams.of(cfg, id_col="chunk_id"), masked["relation_sentences"])
    return {"relation_embeddings": embedded["embeddings"]}
