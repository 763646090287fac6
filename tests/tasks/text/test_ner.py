"""Query-side NER (spaCy and LLM backends) and the LLM extraction's span recovery."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.llm.client import make_client
from tasks.llm.ner import NER_SCHEMA, entity_label, llm_recognise, locate, ner_messages
from tasks.llm.params import ExtractionMostlyEmpty, LLMParams
from tasks.llm.ner_backends import QueryRecogniser
from tasks.text.ner import NER_WINDOW_CHARS, NERParams, normalize_entity, recognise, recognise_windows, text_windows
from tasks.core.config_check import check_values
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
    with pytest.raises(ValueError, match="ner.backend='stanza' is not one of"):  # the config check, from its metadata
        check_values(NERParams, "ner", {"backend": "stanza"})


def test_llm_query_names_match_the_corpus_normalisation(tmp_path) -> None:
    with FakeLLMServer() as server:
        llm = LLMParams(provider="local", model="m", base_url=server.base_url)
        rec = QueryRecogniser(NERParams(backend="llm"), llm, str(tmp_path))
        assert rec.names(["Who painted The Scream in Oslo?", "what?"]) == [["who", "the", "scream", "oslo"], []]  # the fake model lists capitalised words


def test_numpy_and_blis_matrix_products_find_the_same_entities() -> None:
    """``ner.matmul`` changes what runs spaCy's matrix products, not what it finds: the same spans, labels and
    offsets on the generated sample's passages and questions, and each pipeline's layers use the ops asked."""
    from tasks.data.sample import generate_sample
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
    with pytest.raises(ValueError, match="ner.matmul"):  # the config check, from the field's metadata
        check_values(NERParams, "ner", {"matmul": "mkl"})



# ----------------------------------------------------------------------------- texts over the NER window

@given(st.text(alphabet="ab .\n", max_size=400), st.integers(min_value=4, max_value=50))
def test_text_windows_cover_the_text_in_order_each_within_the_size(text, size) -> None:
    windows = text_windows(text, size)
    assert windows[0][0] == 0 and windows[-1][1] == len(text)
    assert all(a == b for (_, a), (b, _) in zip(windows, windows[1:]))  # contiguous, no overlap
    assert all(0 < b - a <= size for a, b in windows) or windows == [(0, 0)]
    if len(text) <= size:
        assert windows == [(0, len(text))]


def test_text_windows_cut_after_a_sentence_end() -> None:
    text = "One sentence here. Another one here. " * 10
    for a, b in text_windows(text, 50)[:-1]:
        assert text[a:b].endswith(". ")


def test_a_text_over_the_window_is_recognised_whole_with_its_spans_in_place() -> None:
    """spaCy refuses a text over nlp.max_length; windows find every sentence's entity, at its place in the text."""
    sentence = "Alice Smith moved to Paris in the spring. "
    long_text = sentence * (3 * NER_WINDOW_CHARS // len(sentence))
    short = "Bob Jones visited London."
    spans = recognise_windows([short, long_text], NERParams())
    alone = recognise([short], NERParams())
    assert spans[spans["text_idx"] == 0].reset_index(drop=True).equals(alone)  # a short text as before
    long_spans = spans[spans["text_idx"] == 1]
    texts = [long_text[s:e] for s, e in zip(long_spans["start"], long_spans["end"])]
    assert texts == long_spans["surface"].tolist()
    assert texts.count("Alice Smith") == long_text.count("Alice Smith")
