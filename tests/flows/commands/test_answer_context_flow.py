"""answer_in_context@B on a hand-made corpus whose contexts are known: BM25 ranks the passage that shares the
question's rare words first and the answer's passage second, so the answer reaches the reader only at the budget
that holds both; a yes/no question is left out and counted."""
from __future__ import annotations

import json

from flows.commands.evaluate import evaluate_flow
from tasks.llm.ledger import estimate_text_tokens
from tests.flows.conftest import make_config

FIRST = ("Zorblax Observatory", "The Zorblax Observatory near Velmora looks over Velmora. The Zorblax Observatory "
         "near Velmora has a white dome, and the observatory at Velmora keeps an old telescope.")
SECOND = ("Ilsa Brandt", "Ilsa Brandt founded a Zorblax trust.")
OTHERS = [("Harbour", "Fishing boats leave the harbour at dawn and return with the tide."),
          ("Bakery", "The bakery sells rye bread, buns and cakes every morning."),
          ("River Tam", "The river floods its meadows each spring after the snow melts."),
          ("Chess club", "The chess club meets on Tuesdays in the library hall.")]


def _write(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"title": t, "text": x}) + "\n" for t, x in [FIRST, SECOND, *OTHERS]))
    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps([
        {"_id": "q1", "question": "Who founded the Zorblax Observatory near Velmora?", "answer": "Ilsa Brandt",
         "supporting_facts": [["Ilsa Brandt", 0]]},
        {"_id": "q2", "question": "Is the Zorblax Observatory near Velmora?", "answer": "yes",
         "supporting_facts": [["Zorblax Observatory", 0]]}]))
    return corpus, questions


def test_answer_in_context_reaches_the_answer_only_at_the_budget_that_holds_it(tmp_path):
    corpus, questions = _write(tmp_path)
    first, second = (estimate_text_tokens(f"{t}: {x}") for t, x in (FIRST, SECOND))  # as contexts_for renders
    budgets = [first, first + second]
    cfg = make_config(tmp_path, "method=bm25", "dataset=jsonl", f"dataset.path={corpus}",
                      f"dataset.questions={questions}", f"eval.answer_budgets=[{budgets[0]},{budgets[1]}]")
    m = evaluate_flow(cfg, str(tmp_path / "run"))
    assert m["answer_in_context_n"] == 1 and m["answer_in_context_yes_no"] == 1
    assert m[f"answer_in_context@{budgets[0]}"] == 0.0  # the first passage alone: no answer
    assert m[f"answer_in_context@{budgets[1]}"] == 100.0
    assert m[f"context_tokens@{budgets[0]}"] == first and m[f"context_tokens@{budgets[1]}"] == first + second
