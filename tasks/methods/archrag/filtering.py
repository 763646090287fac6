"""ArchRAG adaptive filtering-based generation (paper §3.2.2, eqs. (3)-(4)) and its "Direct Prompt"
ablation (Table 4).

Input per question: the question and what C-HNSW retrieved on each layer, ``layers[i]`` = the texts
``R_i`` (layer 0: entity and relation texts; layer ``l >= 1``: community report texts), each list
already in relevance order.

* Eq. (3) ``A_i = LLM(P_filter || R_i)``: every layer's items are packed, in order, into prompts of
  at most ``filter_budget_tokens`` of item text; each pack is one JSON call returning key points
  ``{"points": [{"description", "score" 0-100}]}``. The calls of all questions go out in one
  ``chat_json`` batch (cached, ledgered under ``archrag_filter``, one repair round). A reply still
  invalid after its repair is counted in ``stats["filter_failures"]`` and contributes no points.
* Eq. (4) ``Output = LLM(P_merge || Sort({A_0..A_n}))``: points with score <= 0 are dropped, the
  rest sorted by score (descending, stable) and added to the merge prompt until
  ``merge_budget_tokens``; one reader call per question (``archrag_merge``) whose reply ends with
  ``Answer: <short answer>`` (the :func:`tasks.llm.generate.extract_answer` convention).
* Direct Prompt: no filtering; all layers' items in one reader prompt within
  ``merge_budget_tokens`` (``archrag_direct``).

No I/O beyond the client; prompts are our own wording (the paper's Fig. 15 gives only their shape).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from tasks.llm.client import LLMClient
from tasks.llm.generate import build_reader_messages, extract_answer, select_passages
from tasks.llm.ledger import CHARS_PER_TOKEN, estimate_text_tokens
from tasks.llm.params import Messages
from tasks.llm.schema import JSON_FORMAT

log = logging.getLogger("dagrag")

FILTER_STAGE = "archrag_filter"
MERGE_STAGE = "archrag_merge"
DIRECT_STAGE = "archrag_direct"
MODES = ("filter", "direct")

POINTS_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["points"],
    "properties": {"points": {"type": "array", "items": {
        "type": "object", "required": ["description", "score"],
        "properties": {"description": {"type": "string"}, "score": {"type": "number"}}}}}}

FILTER_SYSTEM = (
    "You are an analyst helping to answer a question. You are given a batch of retrieved records "
    "(knowledge-graph entities and relations, or community reports). Read them and pull out the key "
    "points that help answer the question. State each point as a self-contained sentence or two that "
    "keeps the names, dates and numbers it relies on, and give it an importance score from 0 to 100: "
    "how much the point helps answer the question. Use only what the records say; invent nothing. "
    "If the records contain nothing useful for the question, return a single point saying so with "
    "score 0. Reply with one JSON object only, shaped as "
    '{"points": [{"description": "<key point>", "score": <0-100>}]}.'
)

MERGE_SYSTEM = (
    "You answer a question with the help of key points that analysts extracted from retrieved "
    "records. The points are listed from most to least important; they may contain mistakes or be "
    "off topic, so use only those that bear on the question. If no points are given or none of them "
    "settle the question, answer from your own knowledge. Give a short explanation of the answer that "
    "covers the relevant points, then end with exactly one final line of the form "
    "'Answer: <answer>', where <answer> is a short phrase (an entity, date, number, or yes/no), not "
    "a sentence. Give your best guess on that line even when unsure."
)

NO_POINTS = "(none: the analysts found nothing useful; answer from what you know)"


@dataclass(frozen=True)
class FilterParams:
    """Budgets and mode of the generation step (paper §3.2.2; code: 4000-token packs and merge)."""

    filter_budget_tokens: int = 4000   # item text per filter prompt (code: 4000-token packs)
    merge_budget_tokens: int = 4000    # point text in the merge prompt / items in the direct prompt
    filter_max_tokens: int = 1000      # completion cap of a filter call
    answer_max_tokens: int = 512       # completion cap of the merge / direct call
    mode: str = "filter"               # filter | direct

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"FilterParams.mode must be one of {MODES}, got {self.mode!r}")
        for name in ("filter_budget_tokens", "merge_budget_tokens", "filter_max_tokens", "answer_max_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"FilterParams.{name} must be positive")


@dataclass
class Generation:
    """Raw model outputs and extracted short answers, one per question, plus counts."""

    raw: list[str]
    answers: list[str]
    stats: dict[str, int] = field(default_factory=dict)


# ----------------------------------------------------------------------------- eq. (3): filter prompts

def pack_items(items: Sequence[str], budget_tokens: int) -> tuple[list[list[str]], int]:
    """Split one layer's items, in order, into packs of at most ``budget_tokens`` item tokens.

    Greedy: an item joins the current pack while the pack's summed ``estimate_text_tokens`` stays
    within the budget, else it starts the next pack. An item alone over the budget is cut to the
    budget (§3.2.2: content over the limit is truncated) and fills a pack by itself. Blank items are
    skipped. Returns ``(packs, number of truncated items)``.
    """
    packs: list[list[str]] = []
    current: list[str] = []
    used = truncated = 0
    for raw in items:
        text = raw.strip()
        if not text:
            continue
        cost = estimate_text_tokens(text)
        if cost > budget_tokens:
            text, cost, truncated = text[: budget_tokens * CHARS_PER_TOKEN], budget_tokens, truncated + 1
        if current and used + cost > budget_tokens:
            packs.append(current)
            current, used = [], 0
        current.append(text)
        used += cost
    if current:
        packs.append(current)
    return packs, truncated


def layer_kind(layer: int) -> str:
    """What the records of a C-HNSW layer are (§3.2.1: layer 0 = entities + relations, above = communities)."""
    return ("knowledge-graph entities and relations" if layer == 0
            else f"community reports (hierarchy level {layer})")


def filter_messages(question: str, layer: int, pack: Sequence[str]) -> Messages:
    """Eq. (3) ``P_filter || R_i``: one pack of layer ``layer``'s records and the question."""
    records = "\n\n".join(f"[{k}] {text}" for k, text in enumerate(pack, 1))
    user = (f"Question: {question.strip()}\n\nRecords ({layer_kind(layer)}):\n{records}\n\n"
            "List the key points of these records that help answer the question, each with its "
            "importance score, as the JSON object described.")
    return [{"role": "system", "content": FILTER_SYSTEM}, {"role": "user", "content": user}]


@dataclass(frozen=True)
class FilterPlan:
    """All filter prompts of a batch: ``owner[j]`` is the question index of ``messages[j]``."""

    messages: list[Messages]
    owner: list[int]
    truncated: int


def plan_filter_calls(questions: Sequence[str], layers: Sequence[Sequence[Sequence[str]]],
                      budget_tokens: int) -> FilterPlan:
    """Filter prompts of every question, layer by layer and pack by pack (question order kept).

    Batching is per layer as eq. (3) writes it; the authors' code instead packs by item type
    (entities+relations together, communities of all levels together) - notes §4.
    """
    _check_lengths(questions, layers)
    messages: list[Messages] = []
    owner: list[int] = []
    truncated = 0
    for qi, (question, per_layer) in enumerate(zip(questions, layers)):
        for li, items in enumerate(per_layer):
            packs, cut = pack_items(items, budget_tokens)
            truncated += cut
            messages.extend(filter_messages(question, li, pack) for pack in packs)
            owner.extend([qi] * len(packs))
    return FilterPlan(messages, owner, truncated)


def clip_score(score: Any) -> float:
    """A point's score clipped to [0, 100] (NaN -> 0)."""
    s = float(score)
    return 0.0 if math.isnan(s) else min(max(s, 0.0), 100.0)


def reply_points(reply: dict[str, Any] | None) -> list[tuple[str, float]]:
    """``(description, clipped score)`` of a schema-valid filter reply, in reply order (None -> [])."""
    if reply is None:
        return []
    return [(str(p["description"]).strip(), clip_score(p["score"])) for p in reply["points"]]


# ----------------------------------------------------------------------------- eq. (4): merge prompt

def point_block(rank: int, description: str, score: float) -> str:
    """How one key point appears in the merge prompt."""
    return f"Point {rank} (importance {score:g}):\n{description}"


@dataclass(frozen=True)
class MergeSelection:
    """The point blocks that go into one merge prompt and what was left out."""

    blocks: list[str]
    dropped: int   # score <= 0 or empty description
    cut: int       # useful, but past the merge budget


def select_points(points: Sequence[tuple[str, float]], budget_tokens: int) -> MergeSelection:
    """Eq. (4) ``Sort({A_0..A_n})`` within the budget.

    Points with score <= 0 (or no text) are dropped (code: client_reasoning.py drops score <= 0);
    the rest are sorted by score, descending and stable (ties keep layer / pack / reply order), and
    added while they fit ``budget_tokens``; the first that does not fit ends the list (code:
    GraphRAG-style reduce stops there), except that a top point alone over the budget is truncated.
    """
    useful = [(d, s) for d, s in points if s > 0 and d]
    ranked = sorted(useful, key=lambda p: -p[1])
    blocks = [point_block(k, d, s) for k, (d, s) in enumerate(ranked, 1)]
    kept = select_passages(blocks, budget_tokens)
    return MergeSelection(kept, len(points) - len(useful), len(useful) - len(kept))


def merge_messages(question: str, blocks: Sequence[str]) -> Messages:
    """Eq. (4) ``P_merge || Sort(A)``: the ranked key points and the question; reply ends 'Answer: ...'."""
    body = "\n\n".join(blocks) if blocks else NO_POINTS
    user = (f"Key points, most important first:\n{body}\n\nQuestion: {question.strip()}\n\n"
            "Explain briefly, then finish with a line 'Answer: <short answer>'.")
    return [{"role": "system", "content": MERGE_SYSTEM}, {"role": "user", "content": user}]


# ----------------------------------------------------------------------------- the two modes

def _check_lengths(questions: Sequence[str], layers: Sequence[Any]) -> None:
    if len(questions) != len(layers):
        raise ValueError(f"{len(questions)} questions vs {len(layers)} retrieved layer lists")


def _filter_sampling(client: LLMClient, params: FilterParams) -> dict[str, Any]:
    """Sampling of the filter calls exactly as ``chat_json`` sends them (so dry-run keys match)."""
    samp: dict[str, Any] = {"max_tokens": params.filter_max_tokens}
    if client.params.json_mode:
        samp["response_format"] = JSON_FORMAT
    return samp


def adaptive_answer(client: LLMClient, questions: list[str], layers: list[list[list[str]]],
                    params: FilterParams) -> Generation:
    """Adaptive filtering-based generation (§3.2.2): eq. (3) filter calls, then one eq. (4) merge call each.

    ``stats``: ``filter_calls`` (packs), ``filter_repairs`` and ``filter_failures`` (replies
    invalid after the repair round: they add no points), ``items_truncated``, ``points_total``,
    ``points_kept`` (in a merge prompt), ``points_dropped`` (score <= 0), ``points_cut`` (past the
    merge budget), ``questions_without_points`` and ``merge_calls``.
    """
    plan = plan_filter_calls(questions, layers, params.filter_budget_tokens)
    repairs_before = client.ledger_summary(FILTER_STAGE)["json_repairs"]
    replies = (client.chat_json(plan.messages, POINTS_SCHEMA, stage=FILTER_STAGE,
                                max_tokens=params.filter_max_tokens) if plan.messages else [])
    failures = sum(r is None for r in replies)
    if failures:
        log.warning("%s: %d of %d filter replies invalid after repair; they add no points",
                    FILTER_STAGE, failures, len(replies))
    points: list[list[tuple[str, float]]] = [[] for _ in questions]
    for qi, reply in zip(plan.owner, replies):
        points[qi].extend(reply_points(reply))
    selections = [select_points(p, params.merge_budget_tokens) for p in points]
    msgs = [merge_messages(q, s.blocks) for q, s in zip(questions, selections)]
    results = client.chat_many(msgs, stage=MERGE_STAGE, max_tokens=params.answer_max_tokens) if msgs else []
    raw = [r.text for r in results]
    stats = {"filter_calls": len(plan.messages),
             "filter_repairs": int(client.ledger_summary(FILTER_STAGE)["json_repairs"] - repairs_before),
             "filter_failures": failures, "items_truncated": plan.truncated,
             "points_total": sum(len(p) for p in points),
             "points_kept": sum(len(s.blocks) for s in selections),
             "points_dropped": sum(s.dropped for s in selections),
             "points_cut": sum(s.cut for s in selections),
             "questions_without_points": sum(not s.blocks for s in selections),
             "merge_calls": len(msgs)}
    return Generation(raw, [extract_answer(t) for t in raw], stats)


def direct_items(per_layer: Sequence[Sequence[str]]) -> list[str]:
    """All layers' items for the Direct Prompt: layer 0 first, each layer in its rank order.

    (Table 4 gives no order; the code's "direct" strategy sorts hits by distance, which we do not
    have across layers, so a budget cut drops the highest layers' last items first.)
    """
    return [t.strip() for items in per_layer for t in items if t.strip()]


def direct_answer(client: LLMClient, questions: list[str], layers: list[list[list[str]]],
                  params: FilterParams) -> Generation:
    """Direct Prompt ablation (Table 4): one reader call per question over all retrieved items.

    ``stats``: ``direct_calls``, ``items_used`` (in a prompt) and ``items_cut`` (past the budget).
    """
    _check_lengths(questions, layers)
    items = [direct_items(per_layer) for per_layer in layers]
    msgs = [build_reader_messages(q, its, params.merge_budget_tokens) for q, its in zip(questions, items)]
    results = client.chat_many(msgs, stage=DIRECT_STAGE, max_tokens=params.answer_max_tokens) if msgs else []
    raw = [r.text for r in results]
    used = [len(select_passages(its, params.merge_budget_tokens)) for its in items]
    stats = {"direct_calls": len(msgs), "items_used": sum(used),
             "items_cut": sum(len(its) for its in items) - sum(used)}
    return Generation(raw, [extract_answer(t) for t in raw], stats)


def generate_answers(client: LLMClient, questions: list[str], layers: list[list[list[str]]],
                     params: FilterParams) -> Generation:
    """:func:`adaptive_answer` (``mode="filter"``) or :func:`direct_answer` (``mode="direct"``)."""
    fn = adaptive_answer if params.mode == "filter" else direct_answer
    return fn(client, questions, layers, params)


def filter_estimate(client: LLMClient, questions: list[str], layers: list[list[list[str]]],
                    params: FilterParams) -> dict[str, int]:
    """Dry-run cost of :func:`generate_answers` (cache misses only), without calling the model.

    Filter mode: the filter prompts (completion ``filter_max_tokens`` each) plus the merge prompts
    estimated with no points (their real points are unknown before filtering). Direct mode: the
    direct prompts. Returns ``calls``, ``prompt_tokens``, ``completion_tokens`` and the per-stage
    ``<stage>_calls`` / ``<stage>_prompt_tokens``.
    """
    _check_lengths(questions, layers)
    parts: dict[str, dict[str, int]] = {}
    if params.mode == "direct":
        msgs = [build_reader_messages(q, direct_items(pl), params.merge_budget_tokens)
                for q, pl in zip(questions, layers)]
        parts[DIRECT_STAGE] = client.dry_run_estimate(msgs, params.answer_max_tokens,
                                                      max_tokens=params.answer_max_tokens)
    else:
        plan = plan_filter_calls(questions, layers, params.filter_budget_tokens)
        parts[FILTER_STAGE] = client.dry_run_estimate(plan.messages, params.filter_max_tokens,
                                                      **_filter_sampling(client, params))
        parts[MERGE_STAGE] = client.dry_run_estimate([merge_messages(q, []) for q in questions],
                                                     params.answer_max_tokens,
                                                     max_tokens=params.answer_max_tokens)
    out = {k: sum(p[k] for p in parts.values()) for k in ("calls", "prompt_tokens", "completion_tokens")}
    for stage, p in parts.items():
        out[f"{stage}_calls"], out[f"{stage}_prompt_tokens"] = p["calls"], p["prompt_tokens"]
    return out
