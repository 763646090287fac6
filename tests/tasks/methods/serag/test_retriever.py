"""SeRAG online helpers: a batch's query entities over distinct rows (stored vocabulary rows, then OOV names)."""
from __future__ import annotations

import numpy as np

from tasks.methods.serag.retriever import query_entity_pairs


def test_query_entity_pairs_by_hand():
    links = [[4, 9], [], [9, 2]]
    oov = [["zed"], ["ann", "zed"], []]
    owner, row, known, unknown = query_entity_pairs(links, oov)
    np.testing.assert_array_equal(known, [2, 4, 9])  # each vocabulary entity once, sorted
    assert unknown == ["zed", "ann"]  # each OOV name once, first-seen order
    np.testing.assert_array_equal(owner, [0, 0, 2, 2, 0, 1, 1])
    np.testing.assert_array_equal(row, [1, 2, 2, 0, 3, 4, 3])
    names = [*[f"v{e}" for e in known], *unknown]
    per_query = [sorted(names[r] for r, o in zip(row, owner) if o == q) for q in range(3)]
    assert per_query == [["v4", "v9", "zed"], ["ann", "zed"], ["v2", "v9"]]


def test_query_entity_pairs_empty():
    owner, row, known, unknown = query_entity_pairs([[], []], [[], []])
    assert owner.size == row.size == known.size == 0 and unknown == []
    assert owner.dtype == row.dtype == known.dtype == np.int64
