"""Summarisers: groups of child texts -> one summary text and one embedding per group.

One interface, ``Summarise``: a batch of :class:`SummaryRequest` (child texts + child
embeddings) -> (summary texts, ``(len(batch), d)`` summary embeddings). Two kinds, picked by
:func:`make_summariser`:

* ``extractive`` — model-free: the child sentences nearest the children's centroid (or the
  leading sentences), in their original order, within a whitespace-token budget.
* ``llm`` — one chat completion per group through ``LLMClient.chat_many``, so replies come from
  and go to the response cache and count in the token ledger under the caller's stage name.
  The prompt is the caller's: ``prompt(child_texts, words) -> messages`` (EraRAG asks for one
  paragraph per segment, ArchRAG a report per community).

:func:`dry_run_summariser` counts what the LLM's summaries would cost and answers with a stand-in
summariser instead. Summaries are embedded by the caller's ``embed`` callback (the encoder of the
children, usually through ``tasks.text.embed.cached_encode``). No I/O here beyond the callbacks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from tasks.llm.params import Messages
from tasks.llm.schema import check_empty_fraction
from tasks.text.sentences import split_sentences

if TYPE_CHECKING:
    from tasks.llm.client import LLMClient

SUMMARISER_KINDS = ("extractive", "llm")
MAX_EMPTY_SUMMARIES = 0.05  # an LLM batch with more empty replies than this fails instead of storing them


@dataclass(frozen=True)
class SummaryRequest:
    """One group of children to summarise into the caller's node ``node_id`` at ``layer``.

    ``node_id``, ``layer`` and ``child_ids`` identify the group for the caller; the summarisers
    read only ``child_texts`` and ``child_emb``.
    """

    node_id: str
    layer: int
    child_ids: tuple[str, ...]
    child_texts: tuple[str, ...]
    child_emb: np.ndarray  # (n_children, d)


# a batch of groups -> (summary texts, (len(batch), d) summary embeddings)
Summarise = Callable[[list[SummaryRequest]], tuple[list[str], np.ndarray]]
# texts -> (len(texts), d) embeddings
Embed = Callable[[list[str]], np.ndarray]
# a text -> its sentences
Split = Callable[[str], list[str]]
# (child texts, words asked for) -> chat messages
SummaryPrompt = Callable[[tuple[str, ...], int], Messages]


def summariser_kind(summariser: str, llm_provider: str) -> str:
    """``extractive`` or ``llm`` for a method's ``summariser`` setting: ``auto`` is llm when an LLM is configured
    (``llm_provider`` not ``none``), else extractive; ``llm`` without one is an error, not a fallback."""
    if summariser == "llm" and llm_provider == "none":
        raise ValueError("method.summariser=llm needs an LLM (llm=local or llm=openai); "
                         "use method.summariser=extractive or auto")
    if summariser == "auto":
        return "llm" if llm_provider != "none" else "extractive"
    return summariser


def summariser_params(cfg: Any, *variants: type) -> Any:
    """The params of the stage variant whose ``kind`` (``extractive`` or ``llm``) ``method.summariser`` resolves to
    (:func:`summariser_kind`), projected from the config ``cfg``."""
    kind = summariser_kind(cfg.method.summariser, cfg.llm.provider)
    return next(v for v in variants if v.kind == kind).of(cfg)


def _normalise(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


def completion_budget(words: int) -> int:
    """``max_tokens`` of one LLM summary: twice the words asked for."""
    return 2 * words


# ---------------------------------------------------------------- extractive


def extractive_summary(texts: Sequence[str], emb: np.ndarray, max_tokens: int,
                       split: Split = split_sentences,
                       sentence_emb: Optional[np.ndarray] = None) -> str:
    """Centroid-closest sentences in original order within max_tokens (an LLM-free summary).

    With ``sentence_emb`` (one row per sentence of ``split`` over ``texts``) sentences rank by
    cosine to the group's centroid; without it, by position in their text (leads first), then
    by their text's cosine to the centroid. Tokens are whitespace tokens.
    """
    sents, owner, pos = [], [], []
    for t, text in enumerate(texts):
        for p, s in enumerate(split(text)):
            sents.append(s), owner.append(t), pos.append(p)
    if not sents or max_tokens <= 0:
        return ""
    centroid = _normalise(_normalise(emb).mean(axis=0))
    if sentence_emb is not None:
        rank = np.lexsort((np.arange(len(sents)), -(_normalise(sentence_emb) @ centroid)))
    else:
        rank = np.lexsort((np.arange(len(sents)), -(_normalise(emb) @ centroid)[owner], pos))
    chosen, used = [], 0
    for i in rank:
        n = len(sents[i].split())
        if used + n <= max_tokens:
            chosen.append(i)
            used += n
    if not chosen:
        return " ".join(sents[rank[0]].split()[:max_tokens])
    return " ".join(sents[i] for i in sorted(chosen))


def extractive_summariser(max_tokens: int, embed: Optional[Embed] = None, split: Split = split_sentences,
                          embed_sentences: bool = True) -> Summarise:
    """Model-free ``Summarise``: :func:`extractive_summary` of each group.

    The summary embedding is ``embed(text)`` when an encoder is given, else the normalised
    child centroid; sentences are embedded in one batch per call when ``embed`` is given and
    ``embed_sentences`` (else they rank leads first, see ``extractive_summary``).
    """
    def summarise(requests: list[SummaryRequest]) -> tuple[list[str], np.ndarray]:
        per_req = [[s for t in r.child_texts for s in split(t)] for r in requests]
        flat = [s for ss in per_req for s in ss]
        sent_emb = np.asarray(embed(flat)) if embed is not None and embed_sentences and flat else None
        texts, start = [], 0
        for r, ss in zip(requests, per_req):
            part = None if sent_emb is None else sent_emb[start:start + len(ss)]
            texts.append(extractive_summary(r.child_texts, r.child_emb, max_tokens, split, part))
            start += len(ss)
        if embed is not None:
            return texts, _normalise(np.asarray(embed(texts)))
        return texts, _normalise(np.stack([_normalise(r.child_emb).mean(axis=0) for r in requests]))
    return summarise


# ---------------------------------------------------------------- LLM


def llm_summariser(client: "LLMClient", prompt: SummaryPrompt, words: int, stage: str, embed: Embed,
                   max_empty_fraction: float = MAX_EMPTY_SUMMARIES) -> Summarise:
    """``Summarise`` by the LLM: ``prompt(child_texts, words)`` per group, all of a batch in one
    ``chat_many`` (cached, counted in the ledger under ``stage``, ``max_tokens`` =
    :func:`completion_budget`); replies are stripped and embedded with ``embed``.

    Raises ``ExtractionMostlyEmpty`` when more than ``max_empty_fraction`` of the replies are empty.
    """
    def summarise(requests: list[SummaryRequest]) -> tuple[list[str], np.ndarray]:
        msgs = [prompt(r.child_texts, words) for r in requests]
        replies = client.chat_many(msgs, stage=stage, max_tokens=completion_budget(words))
        texts = [r.text.strip() for r in replies]
        check_empty_fraction(texts, max_empty_fraction, stage)
        return texts, embed(texts)
    return summarise


def dry_run_summariser(client: "LLMClient", prompt: SummaryPrompt, words: int,
                       stand_in: Summarise) -> tuple[Summarise, dict[str, int]]:
    """A ``Summarise`` that adds what the LLM's summaries would cost to the returned (growing)
    estimate and answers with ``stand_in``'s summaries, so groups built from summaries (upper
    layers) can be estimated too; their prompts then quote stand-ins, so their cache hits are
    not counted. Nothing is sent to the endpoint."""
    total = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}

    def summarise(requests: list[SummaryRequest]) -> tuple[list[str], np.ndarray]:
        msgs = [prompt(r.child_texts, words) for r in requests]
        budget = completion_budget(words)
        for k, v in client.dry_run_estimate(msgs, budget, max_tokens=budget).items():
            total[k] += v
        return stand_in(requests)
    return summarise, total


# ---------------------------------------------------------------- factory


def make_summariser(kind: str, words: int, embed: Optional[Embed], *, client: Optional["LLMClient"] = None,
                    prompt: Optional[SummaryPrompt] = None, stage: Optional[str] = None,
                    split: Split = split_sentences, embed_sentences: bool = True) -> Summarise:
    """The ``Summarise`` of ``kind`` (``extractive`` | ``llm``) for summaries of about ``words`` words.

    ``extractive`` uses ``split`` and ``embed_sentences`` (see :func:`extractive_summariser`;
    ``words`` is its whitespace-token budget); ``llm`` needs ``client``, ``prompt``, the ledger
    ``stage`` and ``embed`` (see :func:`llm_summariser`).
    """
    if kind == "extractive":
        return extractive_summariser(words, embed=embed, split=split, embed_sentences=embed_sentences)
    if kind != "llm":
        raise ValueError(f"summariser kind must be one of {SUMMARISER_KINDS}, got {kind!r}")
    if client is None or prompt is None or stage is None or embed is None:
        raise ValueError("an llm summariser needs client, prompt, stage and embed")
    return llm_summariser(client, prompt, words, stage, embed)
