"""NER over the embedded text (title + "\n" + text, SeRAG §3.1): its mentions map back onto each passage's
own text, a title's mentions to the passage's first chunk."""
from __future__ import annotations

import pandas as pd

from tasks.text.embed import render_texts, text_starts
from tasks.text.entities import chunk_mentions, text_mentions

DOCS = pd.DataFrame({"doc_id": ["d0", "d1"], "title": ["Christopher Nolan", "Inception"],
                     "text": ["Christopher Edward Nolan is a director. He was born in London.",
                              "A 2010 film directed by Nolan."]})


def _mentions(rendered: list[str], surfaces: list[tuple[int, str]]) -> pd.DataFrame:
    """Mentions as NER reports them on the rendered texts: each surface's first occurrence."""
    rows = [(DOCS["doc_id"][i], s, rendered[i].index(s), rendered[i].index(s) + len(s)) for i, s in surfaces]
    return pd.DataFrame(rows, columns=["doc_id", "surface", "start", "end"]).assign(entity=lambda f: f["surface"])


def test_text_starts_point_at_the_passage_text_in_every_template():
    for template in ["{title}\n{text}", "{title}: {text}", "{text}", None]:
        rendered = render_texts(DOCS, template)
        for r, start, text in zip(rendered, text_starts(DOCS, template), DOCS["text"]):
            assert r[start:start + len(text)] == text


def test_mentions_of_the_text_keep_their_surface_and_title_mentions_go_to_the_first_chunk():
    rendered = render_texts(DOCS, "{title}\n{text}")
    starts = pd.Series(text_starts(DOCS, "{title}\n{text}"), index=DOCS["doc_id"])
    found = _mentions(rendered, [(0, "Christopher Nolan"), (0, "London"), (1, "Inception"), (1, "Nolan")])
    mapped = text_mentions(found, "doc_id", starts)
    text = dict(zip(DOCS["doc_id"], DOCS["text"]))
    in_text = mapped[mapped["surface"].isin(["London", "Nolan"])]
    assert all(text[d][s:e] == surface for d, s, e, surface in in_text[["doc_id", "start", "end", "surface"]]
               .itertuples(index=False))
    titles = mapped[mapped["surface"].isin(["Christopher Nolan", "Inception"])]
    assert (titles["start"] == 0).all() and (titles["end"] == 0).all()
    # two chunks of d0 (split after the first sentence), one of d1: the title's entity lands in d0's first chunk
    cut = DOCS["text"][0].index("He was")
    chunks = pd.DataFrame({"chunk_id": ["c0", "c1", "c2"], "doc_id": ["d0", "d0", "d1"], "start": [0, cut, 0],
                           "end": [cut, len(DOCS["text"][0]), len(DOCS["text"][1])]})
    got = chunk_mentions(mapped.assign(label="X"), chunks).set_index("surface")["chunk_id"].to_dict()
    assert got == {"Christopher Nolan": "c0", "London": "c1", "Inception": "c2", "Nolan": "c2"}
