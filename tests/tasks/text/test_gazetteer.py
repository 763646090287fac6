"""The gazetteer (title-aware entity linking, beyond the papers) and the check of the graph it builds."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from tasks.graph.sparse import coo_matrix
from tasks.text.entities import entity_vocabulary, incidence
from tasks.text.gazetteer import (
    Gazetteer,
    cased_words,
    mask_names,
    build_names,
    linked_incidence,
    lowercase_only,
    match,
    scan_spans,
    normalize_text,
    scan,
    title_name,
    title_short_forms,
    unambiguous_short_forms,
    aliases_of,
)
from tasks.text.linking import (
    cover_named,
    qualified_title_mentions,
    qualified_titles,
    LinkingParams,
    name_idf,
    title_docs,
    title_restart,
    query_seeds,
)
from tasks.text.title_index import named_titles, title_link_coverage
from tasks.text.ner import NERParams, entity_mentions, recognise
from tasks.core.config_check import check_values

# Five passages that name each other's titles in lower case and possessive forms, as Wikipedia does; two
# never write their own title in full ("She was a singer", "Baker is a writer").
TITLES = ["Peter Jones (actor)", "Mary Smith", "Greenfield Studios", "Tom Baker", "Leeds"]
TEXTS = ["Peter Jones was an English actor born in Leeds. He married the singer mary smith in 1960.",
         "She was a singer. Her only album was recorded at greenfield studios.",
         "Greenfield Studios is a recording studio in Leeds. Its founder was tom baker's father.",
         "Baker is a writer. He wrote a biography of peter jones.",
         "Leeds is a city in England. The U.S. consulate there closed."]
NAMED = {(0, 4), (0, 1), (1, 2), (2, 4), (2, 3), (3, 0)}  # (passage, passage whose title it names)


def test_normal_forms():
    assert title_name("Peter Jones (actor)") == "peter jones"
    assert title_name("The Beatles") == "beatles"
    assert normalize_text("Tom Baker's father") == "tom baker father"
    assert normalize_text("the U.S. Navy") == "us navy" and normalize_text("J.K. Rowling") == "jk rowling"


def test_names_keep_titles_and_ner_strings_drop_short_and_numeric():
    names = build_names(["Peter Jones (actor)", "Ra"], ["Leeds", "1960", "U.S. Navy", "uk"])
    assert names["entity"].tolist() == ["leeds", "peter jones", "us navy"]
    assert names["is_title"].tolist() == [False, True, False]
    assert names["entity_idx"].tolist() == [0, 1, 2]


def test_scan_is_whole_word_longest_match():
    gaz = Gazetteer.of(["new york", "new york city", "york", "peter jones"])
    words = normalize_text("From New York City to york, and peter jones's yorkshire").split()
    assert scan(words, gaz) == [1, 2, 3]  # 'new york city' not 'new york'; 'yorkshire' is not 'york'
    rows, cols = match(["york york", "nothing", "New York"], gaz)
    assert rows.tolist() == [0, 0, 2] and cols.tolist() == [2, 2, 0]
    assert scan("york".split(), Gazetteer.of(["york", "new york"], min_chars=5)) == []


def test_scan_prefers_the_longer_of_overlapping_names():
    gaz = Gazetteer.of(["film age", "age old friends", "old friends", "film", "born"])
    words = normalize_text("Where was the director of film Age-Old Friends born?").split()
    assert scan(words, gaz) == [1, 4]  # 'age old friends' (3 words) wins over 'film age' and 'old friends'
    assert scan_spans(words, gaz) == [(6, 3, 1), (9, 1, 4)]
    # equal lengths: the leftmost; a name that loses its words to a longer one is gone, not cut shorter
    assert scan("a b c".split(), Gazetteer.of(["a b", "b c"])) == [0]
    assert scan("x a b c y".split(), Gazetteer.of(["a b c", "x a", "c y"])) == [0]


def test_mask_names_leaves_out_the_capitalised_names_and_keeps_the_relation():
    gaz = Gazetteer.of(["eagle eye", "george lessey", "director", "film", "us navy"])
    assert mask_names(["It was directed by George Lessey.", "Where did the director of film The Eagle's Eye study?",
                       "He served in the U.S. Navy band", "served in a us navy band", "", "Nothing named here"], gaz) == [
        "it was directed by", "where did the director of film the study",  # lower-case names stay
        "he served in the band", "served in a us navy band", "", "nothing named here"]
    # the case test is per text, as for questions: a name the text also writes capitalised is a name
    assert mask_names(["He left the U.S. Navy and the us navy band"], gaz) == ["he left the and the band"]


def test_linked_incidence_puts_each_title_in_its_passage_and_first_chunk():
    gaz = Gazetteer.of(["mary smith", "peter jones"])
    chunk_texts = ["He was born.", "He married mary smith.", "She sang.", "Peter Jones's wife."]
    chunk_doc = np.array([0, 0, 1, 1])
    doc_entity, chunk_entity = linked_incidence(["Peter Jones (actor)", "Mary Smith"], chunk_texts, chunk_doc,
                                                np.array([0, 2]), gaz)
    D = coo_matrix(doc_entity, (2, 2)).toarray()
    C = coo_matrix(chunk_entity, (4, 2)).toarray()
    np.testing.assert_array_equal(D, [[1, 1], [1, 1]])  # doc 0: its title + 'mary smith'; doc 1: title + jones
    np.testing.assert_array_equal(C, [[0, 1], [1, 0], [1, 0], [0, 1]])


def test_linked_incidence_counts_the_mentions_written_with_a_capital():
    gaz = Gazetteer.of(["princess", "mary smith"])
    chunk_texts = ["She was a princess.", "Mary Smith met the princess.", "Princess (film) is a film.", "x"]
    chunk_doc = np.array([0, 1, 2, 2])
    doc_entity, _ = linked_incidence(["Anna", "Bob", "Princess (film)"], chunk_texts, chunk_doc,
                                     np.array([0, 1, 2]), gaz)
    got = {(r.row, r.col): (r.value, r.cased) for r in doc_entity.itertuples()}
    # docs 0 and 1 write 'princess' in lower case only, doc 1 'Mary Smith' capitalised; doc 2, titled Princess,
    # writes it capitalised once, and its title counts once more, as written with a capital
    assert got == {(0, 0): (1, 0), (1, 0): (1, 0), (1, 1): (1, 1), (2, 0): (2, 2)}
    low = lowercase_only(doc_entity, (3, 2)).toarray()
    np.testing.assert_array_equal(low, [[1, 0], [1, 0], [0, 0]])
    with pytest.raises(ValueError, match="cased"):
        lowercase_only(doc_entity.drop(columns="cased"), (3, 2))


def test_idf_down_weights_hubs_and_seeds_take_it():
    doc_entity = sp.csr_array(np.array([[1, 1, 0], [1, 0, 0], [1, 0, 1], [1, 0, 0]]))
    idf = name_idf(doc_entity)
    assert idf[0] == 0.0 and idf[1] == pytest.approx(1.0) and idf[2] == pytest.approx(1.0)
    gaz = Gazetteer.of(["america", "peter jones", "mary smith"])
    seeds = query_seeds(["Was Peter Jones's wife, Mary Smith, from America? peter jones!"], gaz, idf)
    np.testing.assert_allclose(seeds.toarray(), [[0.0, 1.0, 1.0]])  # the hub carries no weight; no double count


def test_lowercase_names_seed_at_their_weight_and_cased_use_wins():
    gaz = Gazetteer.of(["place of birth", "peter jones", "the film"])
    idf = np.array([0.8, 0.6, 0.5])
    q = ["What is the place of birth of Peter Jones's son?", "Where was peter jones born?",
         "Is Place Of Birth a film? Was place of birth, the film, made?"]
    seeds = query_seeds(q, gaz, idf, lowercase_weight=0.1).toarray()
    np.testing.assert_allclose(seeds, [[0.08, 0.6, 0.0], [0.0, 0.06, 0.0], [0.8, 0.0, 0.05]])
    # weight 1 is the old behaviour, case ignored
    np.testing.assert_allclose(query_seeds(q, gaz, idf, 1.0).toarray(), [[0.8, 0.6, 0], [0, 0.6, 0], [0.8, 0, 0.5]])
    assert cased_words("Was Peter Jones's U.S. wife here") == {"was", "peter", "jones", "us"}


def test_linking_params_refuse_unknown_values():
    with pytest.raises(ValueError, match="graph_linking"):  # the config check, from the field's one_of metadata
        check_values(LinkingParams, "method", {"graph_linking": "regex"})


def test_named_titles_reference():
    got = named_titles(TITLES, TEXTS)
    assert set(map(tuple, got.to_numpy().tolist())) == NAMED


def _ner_graph() -> tuple[sp.csr_array, list[str]]:
    """The papers' doc–entity graph of the corpus: spaCy mentions, one node per normalised string."""
    spans = recognise(TEXTS, NERParams())
    mentions = entity_mentions(spans, NERParams()).assign(doc_id=lambda f: f["text_idx"].astype(str))
    vocab = entity_vocabulary(mentions)
    table = incidence(mentions, "doc_id", [str(i) for i in range(len(TEXTS))], vocab)
    return coo_matrix(table, (len(TEXTS), len(vocab))), vocab["entity"].tolist()


def _gazetteer_graph() -> tuple[sp.csr_array, list[str]]:
    """The gazetteer's doc–entity graph of the corpus (one chunk per passage here)."""
    spans = recognise(TEXTS, NERParams())
    names = build_names(TITLES, entity_mentions(spans, NERParams())["surface"].tolist())
    gaz = Gazetteer.of(names["entity"].tolist())
    n = len(TEXTS)
    doc_entity, _ = linked_incidence(TITLES, TEXTS, np.arange(n), np.arange(n), gaz)
    return coo_matrix(doc_entity, (n, len(names))), names["entity"].tolist()


def test_title_links_are_in_the_graph_after_and_mostly_missing_before():
    before = title_link_coverage(TITLES, TEXTS, *_ner_graph())
    after = title_link_coverage(TITLES, TEXTS, *_gazetteer_graph())
    assert after == {"named": 6, "node": 6, "linked": 6}
    # spaCy (en_core_web_sm) finds most names here, but a passage that never writes its own title in full
    # has no node for it, so 'mary smith' and 'tom baker' lead nowhere; one lower-case name is missed
    assert before == {"named": 6, "node": 5, "linked": 3}


def test_title_restart_links_the_titled_passages_with_a_boost():
    gaz = Gazetteer.of(["mary smith", "peter jones"])
    titled = title_docs(["Peter Jones (actor)", "Mary Smith", "Other"], gaz)
    np.testing.assert_array_equal(titled.toarray(), [[0, 1, 0], [1, 0, 0]])
    cos = np.array([[0.1, 0.2, 0.9]])
    query_doc = sp.csr_array(np.array([[0.0, 0.0, np.exp(0.9)]]))  # the dense block kept only passage 2
    seeds = sp.csr_array(np.array([[0.5, 0.0]]))  # the question names 'mary smith' (weight 0.5)
    fused = title_restart(query_doc, cos, seeds, titled).toarray()
    np.testing.assert_allclose(fused, [[0.0, np.exp(0.2) * 1.5, np.exp(0.9)]])


def test_cover_named_lifts_each_named_entitys_best_passage_once_keeping_their_order():
    scores = np.array([[0.9, 0.8, 0.1, 0.05, 0.3], [0.5, 0.4, 0.3, 0.2, 0.1]])
    # entity 0 titles passages 2 and 3 (ambiguous title), entity 1 titles passage 4, entity 2 titles 4 too
    titled = sp.csr_array(np.array([[0, 0, 1, 1, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 1]], dtype=float))
    seeds = sp.csr_array(np.array([[0.7, 0.5, 0.9], [0.05, 0.0, 0.0]]))  # query 1's only name is below the floor
    out = cover_named(scores, seeds, titled, min_seed=0.3)
    assert list(np.argsort(-out[0], kind="stable")) == [4, 2, 0, 1, 3]  # 4 (lifted once) and 2 (best of 2, 3) first
    np.testing.assert_array_equal(out[1], scores[1])
    np.testing.assert_array_equal(cover_named(scores, seeds, titled, 0.0), scores)  # 0 = off


def test_a_qualified_title_in_the_question_picks_among_namesakes():
    titles = ["David Elliot (footballer)", "David Elliot (illustrator)", "Amy (2015 film)", "Eustace Ferguson"]
    q = ["Do David Elliot (Illustrator) and Eustace Ferguson share a nationality?", "Is Amy (2015 Film) older?"]
    named = qualified_title_mentions(q, qualified_titles(titles)).toarray()
    np.testing.assert_array_equal(named, [[0, 1, 0, 0], [0, 0, 1, 0]])
    gaz = Gazetteer.of(["david elliot", "eustace ferguson"])
    seeds = query_seeds(q, gaz, np.array([0.8, 0.9]))
    titled = sp.csr_array(np.array([[1, 1, 0, 0], [0, 0, 0, 1]], dtype=float))
    scores = np.array([[0.9, 0.2, 0.5, 0.4], [0.9, 0.8, 0.1, 0.3]])
    out = cover_named(scores, seeds, titled, 0.3, sp.csr_array(named))
    assert set(np.argsort(-out[0])[:2]) == {1, 3}  # the illustrator, not the higher-scored footballer
    assert np.argsort(-out[1])[0] == 2  # "amy" is too short to be a name; its qualified title still lifts it


def test_cover_named_needs_both_gazetteer_linkings():
    with pytest.raises(ValueError, match="cover_named_min_seed"):
        LinkingParams(graph_linking="gazetteer", query_linking="ner", cover_named_min_seed=0.5)


# ---------------------------------------------------------------- a title's short forms (title_aliases)


def test_title_short_forms():
    assert title_short_forms("Mithridates VI of Pontus") == {"mithridates vi", "mithridates"}  # never "pontus"
    assert title_short_forms("George Lessey") == {"george", "lessey"}
    assert title_short_forms("Paris, Texas") == {"paris"}
    assert title_short_forms("Leeds") == set() and title_short_forms("Tom Baker (writer)") == {"baker"}  # 3 chars out
    assert title_short_forms("The Grand Budapest Hotel") == {"grand", "hotel"}  # normalised: no leading "the"


SHORT_TITLES = TITLES + ["Tom Jones (singer)", "Bakery", "Charley's Aunt"]
SHORT_TEXTS = TEXTS + ["Tom Jones sang in Leeds with his aunt.", "A Baker bakes bread. His aunt sells it.",
                       "Charley's Aunt is a farce. Its aunt is a fake."]


def _names_and_counts(titles: list[str], texts: list[str]) -> tuple[list[str], sp.csr_array]:
    names = build_names(titles, [], 4)["entity"].tolist()
    doc_entity, _ = linked_incidence(titles, texts, np.arange(len(texts)), np.arange(len(texts)), Gazetteer.of(names))
    return names, sp.csr_array(coo_matrix(doc_entity, (len(titles), len(names))))


def test_short_forms_that_stand_for_one_title_in_the_corpus():
    names, doc_names = _names_and_counts(SHORT_TITLES, SHORT_TEXTS)
    got = unambiguous_short_forms(SHORT_TITLES, SHORT_TEXTS, names, doc_names, min_share=0.5)
    index = {n: i for i, n in enumerate(names)}
    # "baker" is written by Tom Baker's own passage ("Baker is a writer"), by Greenfield Studios' ("tom baker's"),
    # and by "Bakery" ("A Baker bakes"), which does not name him: 2 of 3 name him, 2 of 3 write it capitalised
    assert got["baker"] == index["tom baker"]
    assert got["greenfield"] == index["greenfield studios"] and got["peter"] == index["peter jones"]
    assert "jones" not in got  # the short form of two titles (Peter Jones, Tom Jones)
    assert "smith" not in got  # only ever written in lower case here ("mary smith"): no sign it is a name
    assert "aunt" not in got and got["charley"] == index["charley aunt"]  # "aunt": 1 of 3 passages name the play
    stricter = unambiguous_short_forms(SHORT_TITLES, SHORT_TEXTS, names, doc_names, min_share=0.7)
    assert "baker" not in stricter and "greenfield" not in stricter and stricter["charley"] == index["charley aunt"]
    assert all(alias not in index for alias in got)  # a vocabulary name is an entity of its own, never an alias


def test_aliases_link_passages_and_questions_to_the_title():
    names, doc_names = _names_and_counts(SHORT_TITLES, SHORT_TEXTS)
    aliases = unambiguous_short_forms(SHORT_TITLES, SHORT_TEXTS, names, doc_names, min_share=0.5)
    baker = names.index("tom baker")
    plain, linked = Gazetteer.of(names), Gazetteer.of(names, aliases=aliases)
    question = "Whose biography did Baker write?"
    assert scan(normalize_text(question).split(), plain) == []
    assert scan(normalize_text(question).split(), linked) == [baker]
    assert Gazetteer.of(names, aliases={"tom baker": 0}).index["tom baker"] == baker  # a name wins over an alias
    vocab = pd.DataFrame({"entity_idx": [0, 1, 2], "aliases": ["a|bb", "", None]})
    assert aliases_of(vocab) == {"a": 0, "bb": 0} and aliases_of(vocab.drop(columns="aliases")) == {}
    with pytest.raises(ValueError, match="title_aliases"):
        LinkingParams(title_aliases=True)


def test_linked_entity_graph_stage_with_title_aliases(ctx):
    from tasks.core.files import write_parquet
    from tasks.core.hashing import short_hash
    from tasks.core.store import ArtifactRef, Store
    from tasks.text.linking_stages import LinkedGraphParams, linked_entity_graph

    def ref(stage: str, name: str, frame: pd.DataFrame) -> ArtifactRef:
        fp = short_hash(frame.astype(str).to_numpy().tolist())
        path = ctx.store.path_for(ctx.dataset, stage, name, fp)
        return ArtifactRef(name, str(path), fp, write_parquet(frame, path))

    ids = [f"d{i}" for i in range(len(SHORT_TITLES))]
    docs = ref("ingest", "documents", pd.DataFrame({"doc_id": ids, "title": SHORT_TITLES, "text": SHORT_TEXTS}))
    chunks = ref("chunk", "chunks", pd.DataFrame({"chunk_id": ids, "doc_id": ids, "position": 0, "text": SHORT_TEXTS}))
    mentions = ref("ner", "mentions", pd.DataFrame({"doc_id": ["d0"], "surface": ["Leeds"]}))
    plain = linked_entity_graph.fn(ctx, LinkedGraphParams(min_chars=4), docs, chunks, mentions)
    aliased = linked_entity_graph.fn(ctx, LinkedGraphParams(min_chars=4, title_aliases=True, alias_min_share=0.5),
                                     docs, chunks, mentions)
    assert plain["entities"].fp != aliased["entities"].fp
    vocab = Store.read(aliased["entities"])
    assert "aliases" not in Store.read(plain["entities"]).columns
    baker = int(vocab.loc[vocab["entity"] == "tom baker", "entity_idx"].iloc[0])
    assert "baker" in vocab.loc[baker, "aliases"].split("|")
    counts = {name: coo_matrix(Store.read(r["doc_entity"]), (len(ids), len(vocab))).toarray() for name, r in
              (("plain", plain), ("aliased", aliased))}
    # "Baker is a writer. He wrote a biography of peter jones.": its own title, then also the name it writes
    assert counts["plain"][3, baker] == 1 and counts["aliased"][3, baker] == 2
