"""Tests for the fictional multi-hop QA generator in ``tasks.data.sample``."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.data.sample import content_words, generate_sample, shared_content_words

# Function words that occur in the question templates; the independent checker
# below must agree with the module's checker without sharing any code with it.
_TEST_STOPWORDS = {"the", "was", "which", "what", "who", "that", "and", "for", "with",
                   "from", "its", "his", "her", "she", "are", "has", "had"}
_SENTENCE_SPLIT = re.compile(r"(?<=\.) (?=[A-Z])")
_NUMBER = re.compile(r"\d[\d,]*")


def _words(text: str) -> set[str]:
    """Independent tokenizer: maximal runs of ASCII letters, lower-cased."""
    out, cur = set(), []
    for ch in text + " ":
        if ch.isascii() and ch.isalpha():
            cur.append(ch.lower())
        elif cur:
            word = "".join(cur)
            if len(word) >= 3 and word not in _TEST_STOPWORDS:
                out.add(word)
            cur = []
    return out


@pytest.fixture(scope="module")
def sample() -> tuple[list[dict], list[dict]]:
    """The default-sized sample, generated once for the module."""
    return generate_sample(300, 60, seed=0)


def _check_structure(corpus: list[dict], questions: list[dict]) -> None:
    """Invariants every (corpus, questions) pair must satisfy."""
    texts = {p["title"]: p["text"] for p in corpus}
    assert len(texts) == len(corpus), "titles must be unique"
    for q in questions:
        assert set(q) == {"_id", "question", "answer", "supporting_facts", "context",
                          "type", "level"}
        assert q["level"] == "medium"
        want = 2 if q["type"] in ("bridge", "comparison") else 3
        assert len(q["context"]) == len(q["supporting_facts"]) == want
        for (title, idx), (ctx_title, sents) in zip(q["supporting_facts"], q["context"]):
            assert title == ctx_title and title in texts
            assert 0 <= idx < len(sents)
            assert "".join(sents) == texts[title]
            assert all(s.startswith(" ") for s in sents[1:]) and not sents[0].startswith(" ")


def test_deterministic_for_a_seed() -> None:
    a = json.dumps(generate_sample(300, 60, seed=7), sort_keys=True)
    b = json.dumps(generate_sample(300, 60, seed=7), sort_keys=True)
    assert a == b


def test_different_seeds_differ() -> None:
    c0, q0 = generate_sample(300, 60, seed=0)
    c1, q1 = generate_sample(300, 60, seed=1)
    assert {p["title"] for p in c0} != {p["title"] for p in c1}
    assert [q["question"] for q in q0] != [q["question"] for q in q1]


def test_sizes_and_structure(sample: tuple[list[dict], list[dict]]) -> None:
    corpus, questions = sample
    assert len(corpus) == 300 and len(questions) == 60
    assert all(set(p) == {"title", "text"} for p in corpus)
    _check_structure(corpus, questions)
    assert len({q["_id"] for q in questions}) == 60
    assert len({q["question"] for q in questions}) == 60


def test_passages_have_three_to_six_sentences(sample: tuple[list[dict], list[dict]]) -> None:
    corpus, _ = sample
    for p in corpus:
        assert 3 <= len(_SENTENCE_SPLIT.split(p["text"])) <= 6, p
        assert p["text"].startswith(p["title"])


def test_passages_link_by_capitalised_names(sample: tuple[list[dict], list[dict]]) -> None:
    corpus, _ = sample
    titles = [p["title"] for p in corpus]
    linked = sum(any(t in p["text"] for t in titles if t != p["title"]) for p in corpus)
    assert linked == len(corpus), "every passage should mention another entity"


def test_distractors_exist(sample: tuple[list[dict], list[dict]]) -> None:
    corpus, questions = sample
    gold = {title for q in questions for title, _ in q["context"]}
    assert len(gold) < 0.8 * len(corpus)


def test_type_mix(sample: tuple[list[dict], list[dict]]) -> None:
    _, questions = sample
    counts = Counter(q["type"] for q in questions)
    assert set(counts) == {"bridge", "compositional", "comparison"}
    assert 0.4 <= counts["bridge"] / 60 <= 0.6
    assert 0.15 <= counts["compositional"] / 60 <= 0.35
    assert 0.15 <= counts["comparison"] / 60 <= 0.35


def test_content_words_definition() -> None:
    assert content_words("In which city was Tam Vollar's founder born?") == {
        "city", "tam", "vollar", "founder", "born"}
    assert shared_content_words("The Red Ox", "the ox ran") == set()
    assert shared_content_words("Red Oxen", "red oxen ran") == {"red", "oxen"}


def test_later_hops_share_no_content_words(sample: tuple[list[dict], list[dict]]) -> None:
    _, questions = sample
    chains = [q for q in questions if q["type"] != "comparison"]
    assert chains
    for q in chains:
        final_text = "".join(q["context"][-1][1])
        assert not shared_content_words(q["question"], final_text), q
        assert not _words(q["question"]) & _words(final_text), q
        for _, sents in q["context"][1:]:
            assert not _words(q["question"]) & _words("".join(sents)), q


def test_answers_are_in_gold_passages(sample: tuple[list[dict], list[dict]]) -> None:
    _, questions = sample
    for q in questions:
        if q["type"] == "comparison":
            assert q["answer"] in (q["context"][0][0], q["context"][1][0])
            assert q["context"][0][0] in q["question"] and q["context"][1][0] in q["question"]
        else:
            idx = q["supporting_facts"][-1][1]
            assert q["answer"] in q["context"][-1][1][idx]
            assert q["answer"].lower() not in q["question"].lower()


def test_comparison_answers_are_correct(sample: tuple[list[dict], list[dict]]) -> None:
    _, questions = sample
    comparisons = [q for q in questions if q["type"] == "comparison"]
    assert comparisons
    for q in comparisons:
        values = {}
        for (title, idx), (_, sents) in zip(q["supporting_facts"], q["context"]):
            values[title] = int(_NUMBER.search(sents[idx]).group().replace(",", ""))
        pick = max if "larger" in q["question"] else min
        assert q["answer"] == pick(values, key=values.__getitem__)
        assert len(set(values.values())) == 2


def test_bridge_first_hop_names_the_bridge_entity(sample: tuple[list[dict], list[dict]]) -> None:
    _, questions = sample
    for q in questions:
        if q["type"] == "comparison":
            continue
        for (title, idx), (next_title, _) in zip(q["supporting_facts"], q["context"][1:]):
            sents = dict((t, s) for t, s in q["context"])[title]
            assert next_title in sents[idx]
        assert q["context"][0][0] in q["question"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(min_value=20, max_value=80), seed=st.integers(0, 2**32 - 1),
       n_questions=st.integers(0, 120))
def test_small_corpora_never_crash(n: int, seed: int, n_questions: int) -> None:
    corpus, questions = generate_sample(n, n_questions, seed)
    assert len(corpus) == n
    assert len(questions) <= n_questions
    _check_structure(corpus, questions)
    for q in questions:
        if q["type"] == "bridge":
            assert not _words(q["question"]) & _words("".join(q["context"][-1][1]))


def test_too_small_corpus_is_rejected() -> None:
    with pytest.raises(ValueError):
        generate_sample(19, 5)


def test_scales_to_thousands_of_passages() -> None:
    corpus, questions = generate_sample(5000, 200, seed=3)
    assert len(corpus) == 5000 and len(questions) == 200
    assert len({p["title"] for p in corpus}) == 5000
    _check_structure(corpus, questions)
