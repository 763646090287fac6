"""LLM-based named-entity recognition (``ner=llm``): the same spans table as spaCy's, from a chat model.

ZoomRAG's authors extracted entities with GPT-4o-mini (paper §5, set-up paragraph); HippoRAG and LinearRAG ask
for a JSON list of named entities per passage. The model returns entity *strings*; spans are
recovered by locating each string in the text (word-bounded, exact case first, then any case),
because chunk mentions are assigned by character offsets. A string that does not occur in the
text (a paraphrase or a hallucination) gives no span and is counted as ``unlocated``.

The model is not asked for entity types, so labels are ``ENTITY``, or ``CARDINAL`` for strings
made only of digits and punctuation; with ``keep_numeric=false`` the prompt also asks the model
to leave dates and numbers out.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import pandas as pd

from tasks.llm.client import LLMClient
from tasks.llm.params import Messages
from tasks.llm.schema import check_empty_fraction

log = logging.getLogger("dagrag")

NER_STAGE = "ner"              # ledger stage of the corpus extraction
QUERY_NER_STAGE = "query_ner"  # and of the questions'
NER_SCHEMA = {"type": "object", "required": ["entities"],
              "properties": {"entities": {"type": "array", "items": {"type": "string"}}}}
_NUMERIC = re.compile(r"^[\d\s.,:/%+-]+$")


def ner_messages(text: str, keep_numeric: bool) -> Messages:
    """Chat messages asking for the named entities of one text as JSON ``{"entities": [...]}``."""
    scope = ("people, organisations, places, works, events, products and other proper names"
             + ("" if not keep_numeric else ", and also dates, years, numbers and quantities"))
    rules = [f"List the named entities in the text: {scope}.",
             "Copy each entity exactly as it is written in the text (same spelling), once per distinct entity.",
             "Reply with JSON only, of the form {\"entities\": [\"...\", \"...\"]}; "
             "use an empty list when the text names nothing."]
    if not keep_numeric:
        rules.insert(1, "Leave out dates, years, times, numbers, amounts and ordinals.")
    return [{"role": "system", "content": "You extract named entities for a search index. " + " ".join(rules)},
            {"role": "user", "content": f"Text:\n{text}"}]


def entity_label(surface: str) -> str:
    """``CARDINAL`` for strings of digits and punctuation only (filtered like spaCy's numbers), else ``ENTITY``."""
    return "CARDINAL" if _NUMERIC.match(surface) else "ENTITY"


def locate(text: str, names: list[str]) -> list[tuple[str, str, int, int]]:
    """Every word-bounded occurrence of each returned name in ``text``: ``(surface, label, start, end)``.

    Exact-case matches are used when a name has any; otherwise case-insensitive ones (models
    often change the case of a leading article or a heading). Overlaps are kept: a longer
    name and a name inside it are both entities, as the model listed both.
    """
    spans: dict[tuple[int, int], tuple[str, str, int, int]] = {}
    for name in dict.fromkeys(n.strip() for n in names if isinstance(n, str) and n.strip()):
        pattern = r"(?<!\w)" + re.escape(name) + r"(?!\w)"
        hits = list(re.finditer(pattern, text)) or list(re.finditer(pattern, text, re.IGNORECASE))
        for m in hits:  # one span per offset range, however many names (e.g. two casings) matched it
            spans.setdefault((m.start(), m.end()), (m.group(0), entity_label(name), m.start(), m.end()))
    return [spans[k] for k in sorted(spans)]


@dataclass(frozen=True)
class Extraction:
    """Spans of every text plus what did not make it: invalid replies and names not found in their text."""

    spans: pd.DataFrame  # text_idx, surface, label, start, end
    invalid: int
    unlocated: int
    empty_fraction: float


def llm_recognise(client: LLMClient, texts: list[str], keep_numeric: bool,
                  max_empty_fraction: float, stage: str = NER_STAGE) -> Extraction:
    """Entity spans of ``texts`` from the LLM (one cached, schema-checked call per text).

    Raises ``ExtractionMostlyEmpty`` when more than ``max_empty_fraction`` of the texts come
    back invalid or with no entity found in them, rather than building an empty graph.
    """
    replies = client.chat_json([ner_messages(t, keep_numeric) for t in texts], NER_SCHEMA, stage=stage)
    rows, located, unlocated = [], [], 0
    for i, (text, reply) in enumerate(zip(texts, replies)):
        names = list((reply or {}).get("entities") or [])
        spans = locate(text, names)
        found = {s[0].casefold() for s in spans}
        unlocated += sum(n.strip().casefold() not in found for n in dict.fromkeys(names) if n.strip())
        rows.extend((i, *s) for s in spans)
        located.append(spans)
    frac = check_empty_fraction(located, max_empty_fraction, f"{stage} (llm)")
    invalid = sum(r is None for r in replies)
    if invalid or unlocated:
        log.warning("%s (ner=llm): %d of %d replies invalid, %d returned names not found in their text",
                    stage, invalid, len(texts), unlocated)
    return Extraction(pd.DataFrame(rows, columns=["text_idx", "surface", "label", "start", "end"]),
                      invalid, unlocated, frac)
