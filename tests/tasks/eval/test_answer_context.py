"""Answer-in-context on hand-made contexts whose outcome is worked out by hand: SQuAD normalisation, the reader's
packing at each budget, yes/no questions left out and counted."""
from __future__ import annotations

from tasks.eval.answer_context import answer_in_context, answer_in_text, is_yes_no, packed
from tasks.llm.ledger import estimate_text_tokens

LONG = "Zorblax Observatory: " + "the dome is white and the telescope is old. " * 20  # no answer in it
SHORT = "Ilsa Brandt: founded the Zorblax trust in 1901."


def test_answers_are_normalised_as_squad_does():
    assert answer_in_text(["The Beatles"], "a record by beatles, from Liverpool")  # article and case dropped
    assert answer_in_text(["U.S."], "made in the US")  # punctuation dropped
    assert not answer_in_text(["1902"], SHORT)
    assert not answer_in_text([""], SHORT)  # an empty alias finds nothing
    assert is_yes_no(["Yes"]) and is_yes_no(["no."]) and not is_yes_no(["yes", "Yes Minister"]) and not is_yes_no([])


def test_each_budget_packs_the_items_as_the_reader_does():
    cost = estimate_text_tokens(LONG)
    assert packed([LONG, SHORT], cost) == [LONG]  # the second item does not fit: the reader stops there
    assert packed([LONG, SHORT], cost + estimate_text_tokens(SHORT)) == [LONG, SHORT]
    assert packed([LONG, SHORT], 10) == [LONG[:40]]  # a first item alone too long is cut to the budget


def test_answer_in_context_at_budgets_excludes_yes_no():
    small, large = estimate_text_tokens(LONG), estimate_text_tokens(LONG) + estimate_text_tokens(SHORT)
    contexts = {"q1": [LONG, SHORT], "q2": [SHORT, LONG], "q3": [LONG], "q4": [SHORT]}
    answers = {"q1": ["Ilsa Brandt"], "q2": ["ilsa brandt"], "q3": ["Ilsa Brandt"], "q4": ["yes"],
               "q5": ["Ilsa Brandt"]}  # q5: no context at all
    m = answer_in_context(contexts, answers, [small, large])
    assert m["answer_in_context_n"] == 4 and m["answer_in_context_yes_no"] == 1
    assert m[f"answer_in_context@{small}"] == 25.0  # q2 only: its answer leads
    assert m[f"answer_in_context@{large}"] == 50.0  # q1 too, once the second item fits
    short = estimate_text_tokens(SHORT)  # q2 at the small budget: its long second item does not fit
    assert m[f"context_tokens@{small}"] == (small + short + small + 0) / 4
    assert m[f"context_tokens@{large}"] == (large + large + small + 0) / 4
