"""ArchRAG KG builders (tasks.methods.archrag.kg): co-occurrence KG, LLM-extraction merge, one output shape."""
from __future__ import annotations

import itertools
import random
import re
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tasks.llm.schema import validate_schema
from tasks.methods.archrag import kg
from tasks.text.ner import normalize_entity
from tasks.text.sentences import sentence_spans

_CAP = re.compile(r"\b[A-Z][a-z]+\b")


def _corpus(docs: dict[str, list[str]], labels: dict[str, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Chunks (one per listed text, consecutive in its document, separated by one space) and chunk mentions
    of every capitalised word (its label from ``labels``, default PERSON), with document offsets."""
    chunk_rows, mention_rows = [], []
    for doc_id, texts in docs.items():
        pos = 0
        for i, text in enumerate(texts):
            cid = f"{doc_id}-c{i}"
            chunk_rows.append((cid, doc_id, text, pos, pos + len(text)))
            for m in _CAP.finditer(text):
                label = (labels or {}).get(m.group(0), "PERSON")
                mention_rows.append((cid, m.group(0), label, pos + m.start(), pos + m.end(),
                                     normalize_entity(m.group(0))))
            pos += len(text) + 1
    chunks = pd.DataFrame(chunk_rows, columns=["chunk_id", "doc_id", "text", "start", "end"])
    mentions = pd.DataFrame(mention_rows, columns=["chunk_id", "surface", "label", "start", "end", "entity"])
    return chunks, mentions


def _pairs(relations: pd.DataFrame, entities: pd.DataFrame) -> dict[tuple[str, str], float]:
    names = entities["name"].tolist()
    return {(names[h], names[t]): w for h, t, w in zip(relations["head"], relations["tail"], relations["weight"])}


DOCS = {"d1": ["Alice met Bob in Paris. Bob likes Paris.", "Carol stayed home. Alice and Carol wrote."],
        "d2": ["Paris is big. Bob and Alice left Paris."]}


# ----------------------------------------------------------------------------- cooccur

def test_cooccur_entities_relations_and_weights_on_a_known_corpus() -> None:
    chunks, mentions = _corpus(DOCS, {"Paris": "GPE"})
    entities, relations = kg.cooccur_kg(chunks, mentions, description_tokens=100)
    assert entities["name"].tolist() == ["alice", "bob", "carol", "paris"]
    assert entities["entity_id"].tolist() == [0, 1, 2, 3]
    assert entities["type"].tolist() == ["PERSON", "PERSON", "PERSON", "GPE"]
    assert [list(c) for c in entities["chunk_ids"]] == [["d1-c0", "d1-c1", "d2-c0"], ["d1-c0", "d2-c0"],
                                                        ["d1-c1"], ["d1-c0", "d2-c0"]]
    assert entities["n_chunks"].tolist() == [3, 2, 1, 2]
    # sentences: {A,B,P} {B,P} {C} {A,C} {P} {B,A,P}
    assert _pairs(relations, entities) == {("alice", "bob"): 2.0, ("alice", "carol"): 1.0, ("alice", "paris"): 2.0,
                                           ("bob", "paris"): 3.0}
    assert (relations["head"] < relations["tail"]).all()
    assert relations["description"].tolist() == ["Alice met Bob in Paris.", "Alice and Carol wrote.",
                                                 "Alice met Bob in Paris.", "Alice met Bob in Paris."]
    assert entities.loc[2, "description"] == "Carol stayed home. Alice and Carol wrote."


def test_cooccur_type_is_the_most_frequent_label() -> None:
    chunks, mentions = _corpus({"d": ["Jordan won. Jordan is big. Jordan met Ann."]})
    mentions.loc[mentions["surface"] == "Jordan", "label"] = ["GPE", "PERSON", "GPE"]
    entities, _ = kg.cooccur_kg(chunks, mentions)
    assert dict(zip(entities["name"], entities["type"])) == {"ann": "PERSON", "jordan": "GPE"}


def test_cooccur_description_is_distinct_sentences_in_chunk_order_capped() -> None:
    docs = {"d1": ["Zed runs far. Zed runs far.", "Zed sleeps now and then."], "d2": ["Zed runs far. Zed ends."]}
    chunks, mentions = _corpus(docs)
    entities, _ = kg.cooccur_kg(chunks, mentions, description_tokens=100)
    assert entities["description"].tolist() == ["Zed runs far. Zed sleeps now and then. Zed ends."]
    capped, _ = kg.cooccur_kg(chunks, mentions, description_tokens=5)
    assert capped["description"].tolist() == ["Zed runs far. Zed sleeps"]
    assert kg.cooccur_kg(chunks, mentions, description_tokens=1)[0]["description"].tolist() == ["Zed"]


def test_cooccur_ids_and_graph_do_not_depend_on_chunk_order() -> None:
    chunks, mentions = _corpus(DOCS)
    e1, r1 = kg.cooccur_kg(chunks, mentions)
    e2, r2 = kg.cooccur_kg(chunks.iloc[::-1].reset_index(drop=True), mentions.sample(frac=1, random_state=0))
    cols = ["entity_id", "name", "type", "n_chunks"]
    pd.testing.assert_frame_equal(e1[cols], e2[cols])
    assert [list(c) for c in e1["chunk_ids"]] == [list(c) for c in e2["chunk_ids"]]
    pd.testing.assert_frame_equal(r1[["head", "tail", "weight"]], r2[["head", "tail", "weight"]])


def _naive_weights(chunks: pd.DataFrame, mentions: pd.DataFrame) -> dict[tuple[str, str], int]:
    """One sentence at a time: the entities whose mention starts inside it, every pair counted once."""
    counts: Counter = Counter()
    for cid, text, start in zip(chunks["chunk_id"], chunks["text"], chunks["start"]):
        m = mentions[mentions["chunk_id"] == cid]
        for a, b in sentence_spans(text):
            inside = m[(m["start"] >= start + a) & (m["start"] < start + b)]
            for pair in itertools.combinations(sorted(set(inside["entity"])), 2):
                counts[pair] += 1
    return dict(counts)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cooccur_weights_equal_a_sentence_by_sentence_count(seed: int) -> None:
    rng = random.Random(seed)
    names = ["Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus"]
    words = ["ran", "saw", "and", "met", "the", "home"]

    def sentence() -> str:
        return " ".join(rng.choice(names + words) for _ in range(rng.randint(2, 7))) + "."

    docs = {f"d{i}": [" ".join(sentence() for _ in range(rng.randint(1, 4)))
                      for _ in range(rng.randint(1, 3))] for i in range(6)}
    chunks, mentions = _corpus(docs)
    entities, relations = kg.cooccur_kg(chunks, mentions)
    expected = _naive_weights(chunks, mentions)
    assert expected and _pairs(relations, entities) == {k: float(v) for k, v in expected.items()}
    assert set(entities["name"]) == set(mentions["entity"])


def test_cooccur_mention_belongs_to_the_sentence_holding_its_start() -> None:
    text = "Dr. Who met Amy. Rory waited."  # "Dr." does not end a sentence
    chunks = pd.DataFrame({"chunk_id": ["c"], "doc_id": ["d"], "text": [text], "start": [10], "end": [10 + len(text)]})
    mentions = pd.DataFrame({"chunk_id": ["c"] * 3, "entity": ["who", "amy", "rory"], "label": ["PERSON"] * 3,
                             "start": [10 + text.index(w) for w in ["Who", "Amy", "Rory"]]})
    entities, relations = kg.cooccur_kg(chunks, mentions)
    assert _pairs(relations, entities) == {("amy", "who"): 1.0}


def test_cooccur_empty_inputs_keep_the_output_shape() -> None:
    chunks, mentions = _corpus({"d": ["nothing capitalised here."]})
    entities, relations = kg.cooccur_kg(chunks, mentions)
    ent, rel = kg.to_arrow(entities, relations)
    assert ent.num_rows == 0 and rel.num_rows == 0
    assert ent.schema == kg.ENTITY_SCHEMA and rel.schema == kg.RELATION_SCHEMA


# ----------------------------------------------------------------------------- llm: prompt, schema, records

def test_extract_prompt_and_schema() -> None:
    msgs = kg.extract_messages("Alice met Bob.")
    assert msgs[-1]["content"].endswith("Alice met Bob.")
    assert all(t in msgs[0]["content"] for t in kg.ENTITY_TYPES) and "JSON" in msgs[0]["content"]
    good = {"entities": [{"name": "Alice", "type": "person", "description": "a person"}],
            "relationships": [{"source": "Alice", "target": "Bob", "description": "met", "strength": 7}]}
    assert validate_schema(good, kg.EXTRACT_SCHEMA) is None
    assert validate_schema({"entities": [{"type": "person"}], "relationships": []}, kg.EXTRACT_SCHEMA) is not None
    assert validate_schema({"entities": [{"name": 3}], "relationships": []}, kg.EXTRACT_SCHEMA) is not None
    assert validate_schema({"entities": [], "relationships": [{"source": "A"}]}, kg.EXTRACT_SCHEMA) is not None
    assert validate_schema({"entities": []}, kg.EXTRACT_SCHEMA) is not None


def test_extraction_rows_keep_raw_records_and_mark_invalid_replies() -> None:
    reply = {"entities": [{"name": "The Alice", "type": "Person", "description": "d"}],
             "relationships": [{"source": "Alice", "target": "Bob", "description": "r", "strength": 1}]}
    sparse = {"entities": [{"name": "Bob"}], "relationships": [{"source": "Bob", "target": "Eve"}]}
    rows = kg.extraction_rows(["k1", "k2", "k3", "k4"], [reply, None, {"entities": [], "relationships": []}, sparse])
    assert rows.schema == kg.EXTRACTION_SCHEMA
    assert rows.column("invalid").to_pylist() == [False, True, False, False]
    assert rows.column("ent_name").to_pylist() == [["The Alice"], [], [], ["Bob"]]
    assert rows.column("ent_type").to_pylist()[3] == [""] and rows.column("rel_desc").to_pylist()[3] == [""]
    assert kg.extraction_rows(["k"], [None]).schema == kg.EXTRACTION_SCHEMA  # all-empty lists keep their types
    ext = rows.to_pandas().assign(chunk_id=["c1", "c2", "c3", "c4"])
    em, rm = kg.extraction_mentions(ext)
    assert em.values.tolist() == [["c1", "The Alice", "Person", "d"], ["c4", "Bob", "", ""]]
    assert rm.values.tolist() == [["c1", "Alice", "Bob", "r"], ["c4", "Bob", "Eve", ""]]


def test_canonical_types() -> None:
    got = kg.canonical_types(pd.Series(["Person", " ORGANIZATION ", "geo", "event", "weapon", "other"]))
    assert got.tolist() == ["person", "organisation", "location", "event", "other", "other"]


# ----------------------------------------------------------------------------- llm: merge

def _mentions() -> tuple[pd.DataFrame, pd.DataFrame]:
    em = pd.DataFrame([("c2", "The Alice", "Person", "a writer"), ("c1", "alice", "person", "a writer "),
                       ("c1", "Alice's", "organization", "a poet"), ("c3", "Bob", "org", "a firm"),
                       ("c3", "!!", "other", "nothing"), ("c3", "Carol", "location", "")],
                      columns=["chunk_id", "name", "type", "description"])
    rm = pd.DataFrame([("c1", "Alice", "Bob", "works for"), ("c2", "BOB", "alice", "employs"),
                       ("c3", "Alice", "Bob", "works for"), ("c3", "Bob", "Dave", "sued"),
                       ("c3", "Carol", "carol", "self"), ("c3", "Carol", "?", "nobody")],
                      columns=["chunk_id", "source", "target", "description"])
    return em, rm


def test_merge_on_normalised_names_types_chunks_and_descriptions() -> None:
    merged = kg.merge_extractions(*_mentions())
    e = merged.entities
    assert e["name"].tolist() == ["alice", "bob", "carol", "dave"] and e["entity_id"].tolist() == [0, 1, 2, 3]
    assert e["type"].tolist() == ["person", "organisation", "location", kg.UNKNOWN_TYPE]  # dave: endpoint only
    assert [list(c) for c in e["chunk_ids"]] == [["c1", "c2", "c3"], ["c1", "c2", "c3"], ["c3"], ["c3"]]
    assert e["n_chunks"].tolist() == [3, 3, 1, 1]
    assert [list(d) for d in e["descriptions"]] == [["a poet", "a writer"], ["a firm"], [], []]


def test_merge_relations_are_unordered_pairs_weighted_by_mentions() -> None:
    r = kg.merge_extractions(*_mentions()).relations
    assert r[["head", "tail", "weight"]].values.tolist() == [[0, 1, 3.0], [1, 3, 1.0]]  # no self loop, no "?"
    assert [list(d) for d in r["descriptions"]] == [["employs", "works for"], ["sued"]]


def test_merge_does_not_depend_on_mention_order() -> None:
    em, rm = _mentions()
    a = kg.merge_extractions(em, rm)
    b = kg.merge_extractions(em.iloc[::-1], rm.iloc[::-1])
    pd.testing.assert_frame_equal(a.entities, b.entities)
    pd.testing.assert_frame_equal(a.relations, b.relations)


def test_describe_requests_only_for_two_or_more_and_applied() -> None:
    merged = kg.merge_extractions(*_mentions())
    reqs = kg.describe_requests(merged)
    assert [(r.kind, r.row, r.label, r.descriptions) for r in reqs] == [
        ("entity", 0, "alice", ("a poet", "a writer")), ("relation", 0, "alice — bob", ("employs", "works for"))]
    msgs = kg.describe_messages(reqs[1], words=40)
    assert "relationship" in msgs[0]["content"] and "40 words" in msgs[0]["content"]
    assert "alice — bob" in msgs[1]["content"] and "- employs\n- works for" in msgs[1]["content"]
    entities, relations = kg.apply_descriptions(merged, reqs, ["Alice writes poems.", ""])
    assert entities["description"].tolist() == ["Alice writes poems.", "a firm", "", ""]
    assert relations["description"].tolist() == ["employs\nworks for", "sued"]  # an empty summary falls back
    assert list(entities.columns) == list(kg.ENTITY_COLUMNS) and list(relations.columns) == list(kg.RELATION_COLUMNS)


def test_both_builders_give_one_output_shape() -> None:
    chunks, mentions = _corpus(DOCS)
    co = kg.to_arrow(*kg.cooccur_kg(chunks, mentions))
    merged = kg.merge_extractions(*_mentions())
    reqs = kg.describe_requests(merged)
    llm = kg.to_arrow(*kg.apply_descriptions(merged, reqs, ["s"] * len(reqs)))
    empty = kg.merge_extractions(*(f.iloc[:0] for f in _mentions()))
    none = kg.to_arrow(*kg.apply_descriptions(empty, [], []))
    for tables in (co, llm, none):
        assert tables[0].schema == kg.ENTITY_SCHEMA and tables[1].schema == kg.RELATION_SCHEMA
    assert none[0].num_rows == 0 and none[1].num_rows == 0
    assert np.array_equal(llm[0].column("entity_id").to_numpy(), np.arange(llm[0].num_rows))
    assert isinstance(co[0].column("chunk_ids").type, pa.ListType)
