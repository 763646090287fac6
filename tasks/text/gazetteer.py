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
construction. Its settings and the query side are :mod:`tasks.text.linking`; the stages :mod:`tasks.text.linking_stages`.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.sparse as sp

from tasks.text.ner import normalize_entity

QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")  # a title's trailing parenthetical: "Peter Jones (actor)"


_INITIALS = re.compile(r"\b(?:\w\.){2,}")


def normalize_text(text: str) -> str:
    """Text in the gazetteer's form: dotted initials joined ("U.S." → "US"), then :func:`normalize_entity`."""
    text = unicodedata.normalize("NFKC", text)
    return normalize_entity(_INITIALS.sub(lambda m: m.group(0).replace(".", ""), text))


def title_name(title: str) -> str:
    """The entity a passage's title names: its trailing parenthetical qualifier removed, normalised."""
    return normalize_text(QUALIFIER.sub("", title))


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
    plain = QUALIFIER.sub("", title)
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
