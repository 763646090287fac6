"""QA answer metrics: SQuAD-style EM / token F1, containment accuracy, LLM judge, and the ArchRAG
paper's Accuracy / Recall (scored on raw generations); :func:`score_predictions` scores a run's answers.

Normalisation (SQuAD convention): lower-case, drop punctuation, drop the
articles a/an/the, collapse whitespace. Every metric takes a list of gold
aliases and scores the best-matching alias.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import pandas as pd

    from tasks.llm.client import LLMClient

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)
_SPECIAL = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str | None) -> str:
    """Lower-case, strip punctuation and articles, collapse whitespace."""
    s = (text or "").lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(pred: str | None, answers: Sequence[str]) -> bool:
    """True when the normalised prediction equals any normalised alias."""
    p = normalize_answer(pred)
    return any(p == normalize_answer(a) for a in answers)


def _token_f1(pred_norm: str, gold_norm: str) -> float:
    """Token-overlap F1 of two normalised strings (yes/no/noanswer must match exactly)."""
    if (pred_norm in _SPECIAL or gold_norm in _SPECIAL) and pred_norm != gold_norm:
        return 0.0
    p_toks, g_toks = pred_norm.split(), gold_norm.split()
    common = sum((Counter(p_toks) & Counter(g_toks)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p_toks), common / len(g_toks)
    return 2 * precision * recall / (precision + recall)


def f1(pred: str | None, answers: Sequence[str]) -> float:
    """Max token F1 over aliases (in [0, 1])."""
    p = normalize_answer(pred)
    return max((_token_f1(p, normalize_answer(a)) for a in answers), default=0.0)


def contain_acc(pred: str | None, answers: Sequence[str]) -> bool:
    """True when any non-empty normalised alias is a substring of the normalised prediction."""
    p = normalize_answer(pred)
    return any((g := normalize_answer(a)) and g in p for a in answers)


def aggregate(preds: Sequence[str | None], answers_list: Sequence[Sequence[str]]) -> dict[str, float]:
    """Mean EM, F1 and containment accuracy, in percent (0.0 for no questions)."""
    if len(preds) != len(answers_list):
        raise ValueError(f"{len(preds)} predictions vs {len(answers_list)} answer lists")
    n = len(preds)
    if n == 0:
        return {"em": 0.0, "f1": 0.0, "contain_acc": 0.0}
    pairs = list(zip(preds, answers_list))
    return {"em": 100.0 * sum(exact_match(p, a) for p, a in pairs) / n,
            "f1": 100.0 * sum(f1(p, a) for p, a in pairs) / n,
            "contain_acc": 100.0 * sum(contain_acc(p, a) for p, a in pairs) / n}


# ----------------------------------------------------------------------------- ArchRAG paper metrics

def paper_accuracy(pred: str | None, answers: Sequence[str]) -> bool:
    """ArchRAG "Accuracy" (paper §4.1 Metrics, §B.1): a normalised gold alias is a substring of the
    normalised prediction (same test as :func:`contain_acc`; empty aliases never match).

    Score it on the RAW model output (the whole generation, reasoning included), not the extracted
    short answer: the paper checks "whether gold answers are included in the generations" (§4.1);
    the authors' code scores both and logs the raw one (notes §5).
    """
    return contain_acc(pred, answers)


def _token_recall(pred_norm: str, gold_norm: str) -> float:
    """|common tokens| / |gold tokens| of two normalised strings (yes/no/noanswer must match exactly)."""
    # §B.1 says recall is 0 if gold or output "contains" yes/no; like the authors' code (HotpotQA
    # f1_score, notes §5) and _token_f1 we zero it only when either side IS yes/no/noanswer and differs.
    if (pred_norm in _SPECIAL or gold_norm in _SPECIAL) and pred_norm != gold_norm:
        return 0.0
    g_toks = gold_norm.split()
    if not g_toks:
        return 0.0
    common = sum((Counter(pred_norm.split()) & Counter(g_toks)).values())
    return common / len(g_toks)


def token_recall(pred: str | None, answers: Sequence[str]) -> float:
    """ArchRAG "Recall" (paper §4.1, §B.1): token-level recall of the gold in the prediction, max
    over aliases (in [0, 1]). Like :func:`paper_accuracy`, scored on the raw model output.
    (The authors' code joins the aliases into one gold; we take the best alias, as :func:`f1` does.)
    """
    p = normalize_answer(pred)
    return max((_token_recall(p, normalize_answer(a)) for a in answers), default=0.0)


def paper_metrics(raw_outputs: Sequence[str | None], answers_list: Sequence[Sequence[str]]) -> dict[str, float]:
    """Mean :func:`paper_accuracy` and :func:`token_recall` over raw outputs, in percent
    (keys ``accuracy``, ``recall``; 0.0 for no questions)."""
    if len(raw_outputs) != len(answers_list):
        raise ValueError(f"{len(raw_outputs)} outputs vs {len(answers_list)} answer lists")
    n = len(raw_outputs)
    if n == 0:
        return {"accuracy": 0.0, "recall": 0.0}
    pairs = list(zip(raw_outputs, answers_list))
    return {"accuracy": 100.0 * sum(paper_accuracy(p, a) for p, a in pairs) / n,
            "recall": 100.0 * sum(token_recall(p, a) for p, a in pairs) / n}


JUDGE_SCHEMA: dict = {"type": "object", "required": ["correct"],
                      "properties": {"correct": {"type": "boolean"}}}


def judge_messages(question: str, pred: str, answers: Sequence[str]) -> list[dict[str, str]]:
    """Prompt asking a model whether ``pred`` answers ``question`` like the gold aliases."""
    gold = "; ".join(answers)
    return [
        {"role": "system", "content": "You grade short answers to questions. Be strict about "
                                      "facts and lenient about wording. Reply with JSON only."},
        {"role": "user", "content": f"Question: {question}\nGold answer(s): {gold}\n"
                                    f"Predicted answer: {pred}\n\nDoes the predicted answer mean the "
                                    f"same as a gold answer? Reply as JSON: {{\"correct\": true}} or "
                                    f"{{\"correct\": false}}."},
    ]


def llm_judge(client: "LLMClient", questions: Sequence[str], preds: Sequence[str | None],
              answers: Sequence[Sequence[str]], stage: str = "llm_judge") -> list[bool]:
    """LLM-as-judge correctness per question (invalid judge replies count as False)."""
    msgs = [judge_messages(q, p or "", a) for q, p, a in zip(questions, preds, answers, strict=True)]
    verdicts = client.chat_json(msgs, JUDGE_SCHEMA, stage=stage)
    return [bool(v and v.get("correct") is True) for v in verdicts]


def score_predictions(predictions: "pd.DataFrame", questions: "pd.DataFrame",
                      judge: "LLMClient | None" = None) -> dict[str, float]:
    """A run's answer scores: EM / F1 / Contain-Acc of each extracted answer (``prediction``), the ArchRAG
    paper's accuracy / recall of the raw reply (``raw``, §4.1), and with a ``judge`` client its verdicts'
    accuracy (``llm_acc``). ``predictions`` holds ``(qid, prediction, raw)``; ``questions`` the same qids with
    their ``question`` and gold ``answers``."""
    asked = questions.set_index("qid").loc[predictions["qid"]]
    preds, answers = predictions["prediction"].tolist(), asked["answers"].map(list).tolist()
    scores = {**aggregate(preds, answers), **paper_metrics(predictions["raw"].tolist(), answers)}
    if judge is not None:
        verdicts = llm_judge(judge, asked["question"].tolist(), preds, answers)
        scores["llm_acc"] = 100.0 * sum(verdicts) / max(len(verdicts), 1)
    return scores
