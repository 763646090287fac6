"""Query-side NER (spaCy and LLM backends) and the LLM extraction's span recovery."""
from __future__ import annotations

import pytest

from tasks.llm.client import make_client
from tasks.llm.ner import NER_SCHEMA, entity_label, llm_recognise, locate, ner_messages
from tasks.llm.params import ExtractionMostlyEmpty, LLMParams
from tasks.text.ner import NERParams, QueryRecogniser, normalize_entity
from tests.llm_server import FakeLLMServer


def test_spacy_query_names_are_normalised_and_skip_numbers(tmp_path) -> None:
    rec = QueryRecogniser(NERParams(), None, str(tmp_path))
    out = rec.names(["When did the Roman Empire conquer Gaul in 52 BC?", "what is it?"])
    assert len(out) == 2 and out[1] == []
    assert out[0] and all(s == normalize_entity(s) and s for s in out[0])
    assert not any(ch.isdigit() for s in out[0] for ch in s)


def test_locate_finds_every_word_bounded_occurrence() -> None:
    text = "Paris is in France. paris hosts the Louvre; Parisian food differs. France won."
    spans = locate(text, ["Paris", "France", "Louvre", "Berlin", " ", "louvre"])
    got = [(s, text[a:b], a) for s, _, a, b in spans]
    assert got == [("Paris", "Paris", 0), ("France", "France", 12), ("Louvre", "Louvre", 36),
                   ("France", "France", 67)]  # exact case wins over 'paris'; 'Parisian' is not 'Paris'
    assert locate("the eiffel tower", ["Eiffel Tower"]) == [("eiffel tower", "ENTITY", 4, 16)]  # case-insensitive fallback
    assert locate("C++ and C", ["C++"]) == [("C++", "ENTITY", 0, 3)]  # regex characters are literal


def test_labels_and_prompt_follow_keep_numeric() -> None:
    assert entity_label("1,984") == "CARDINAL" and entity_label("1984 (film)") == "ENTITY"
    assert "Leave out dates" in ner_messages("x", keep_numeric=False)[0]["content"]
    assert "Leave out dates" not in ner_messages("x", keep_numeric=True)[0]["content"]
    assert NER_SCHEMA["properties"]["entities"]["type"] == "array"


def test_llm_ner_over_http_spans_cache_and_ledger(tmp_path) -> None:
    texts = ["Alice met Bob in Paris.", "nothing here", "Carol wrote about Dublin and Carol again."]
    with FakeLLMServer() as server:
        client = make_client(LLMParams(provider="local", model="m", base_url=server.base_url), tmp_path / "c.duckdb")
        ext = llm_recognise(client, texts, keep_numeric=False, max_empty_fraction=0.5)
        spans = ext.spans
        assert sorted(spans[spans.text_idx == 0]["surface"]) == ["Alice", "Bob", "Paris"]
        assert spans[spans.text_idx == 1].empty
        carol = spans[(spans.text_idx == 2) & (spans.surface == "Carol")]
        assert carol["start"].tolist() == [0, texts[2].rindex("Carol")]  # both occurrences, by offset
        assert ext.unlocated > 0  # the fake model also returns 'Text' from the prompt, which is in no passage
        assert ext.empty_fraction == pytest.approx(1 / 3)
        served = server.requests
        again = llm_recognise(client, texts, keep_numeric=False, max_empty_fraction=0.5)
        assert server.requests == served and again.spans.equals(spans)  # cached: zero HTTP calls
        assert client.ledger_summary("ner")["llm_calls"] == len(texts)


def test_llm_ner_fails_loudly_when_mostly_empty(tmp_path) -> None:
    with FakeLLMServer() as server:
        client = make_client(LLMParams(provider="local", model="m", base_url=server.base_url), tmp_path / "c.duckdb")
        with pytest.raises(ExtractionMostlyEmpty, match="ner"):
            llm_recognise(client, ["no names", "none here", "Only Anna"], keep_numeric=False, max_empty_fraction=0.5)


def test_llm_backend_without_llm_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="ner=llm .*llm=local"):
        QueryRecogniser(NERParams(backend="llm"), LLMParams(), str(tmp_path))
    with pytest.raises(ValueError, match="backend"):
        NERParams(backend="stanza")


def test_llm_query_names_match_the_corpus_normalisation(tmp_path) -> None:
    with FakeLLMServer() as server:
        llm = LLMParams(provider="local", model="m", base_url=server.base_url)
        rec = QueryRecogniser(NERParams(backend="llm"), llm, str(tmp_path))
        assert rec.names(["Who painted The Scream in Oslo?", "what?"]) == [["who", "the", "scream", "oslo"], []]  # the fake model lists capitalised words


def test_numpy_and_blis_matrix_products_find_the_same_entities() -> None:
    """``ner.matmul`` changes what runs spaCy's matrix products, not what it finds: the same spans, labels and
    offsets on the generated sample's passages and questions, and each pipeline's layers use the ops asked."""
    from tasks.core.sample import generate_sample
    from tasks.text.ner import load_ner, recognise

    corpus, questions = generate_sample(n_passages=120, n_questions=30, seed=3)
    texts = [f"{p['title']}\n{p['text']}" for p in corpus] + [q["question"] for q in questions]
    fast, spacy_default = NERParams(matmul="numpy"), NERParams(matmul="blis")
    numpy_spans = recognise(texts, fast)
    assert len(numpy_spans) > len(corpus)  # entities were found, so the comparison says something
    assert numpy_spans.equals(recognise(texts, spacy_default))
    for params, blis in ((fast, False), (spacy_default, True)):
        ops = load_ner(params.model, params.matmul).get_pipe("ner").model.ops
        assert ops.use_blis is blis
    with pytest.raises(ValueError, match="ner.matmul"):
        NERParams(matmul="mkl")

