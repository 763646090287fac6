"""``flows.commands.benchmark``: how many batches each batch size is timed on, and what a row reports."""
from __future__ import annotations

import numpy as np
import pytest

from flows.commands.benchmark import passes, time_batch_size
from tasks.eval.retrieve import Hits


@pytest.mark.parametrize("n_texts, batch_size, repeat, min_batches, expected", [
    (256, 256, 1, 5, 5),    # one batch a pass: five passes
    (256, 1, 1, 5, 1),      # 256 batches in one pass already
    (256, 64, 1, 5, 2),     # 4 a pass: two passes give 8
    (256, 256, 7, 5, 7),    # repeat asks for more
    (10, 4, 1, 1, 1),
])
def test_passes_time_at_least_min_batches(n_texts, batch_size, repeat, min_batches, expected):
    assert passes(n_texts, batch_size, repeat, min_batches) == expected


class _Counting:
    """A retriever that counts its calls and reports one part."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def search(self, batch: list[str], k: int) -> Hits:
        self.calls.append(len(batch))
        return Hits(doc_idx=np.full((len(batch), k), -1), scores=np.zeros((len(batch), k)), parts={"work": 0.001})


def test_a_row_counts_the_timed_batches_and_averages_parts_per_query():
    retriever = _Counting()
    row = time_batch_size(retriever, [f"q{i}" for i in range(8)], 8, 10, 1, min_batches=5)
    # warm-up + 5 timed batches + one untraced pass for the allocation peak
    assert row["batches"] == 5 and retriever.calls == [8] * 7
    assert row["work_ms"] == pytest.approx(5 * 1.0 / 40)
    assert row["ms_per_query_p50"] <= row["ms_per_query_p95"] <= row["ms_per_query_p99"]
