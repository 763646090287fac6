"""Tests for tasks.llm.cache: stable request keys and a cache shared by several processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tasks.llm.cache import ResponseCache, cache_key

SAMPLING = {"temperature": 0.0, "max_tokens": 10, "seed": 0, "response_format": None}


def test_cache_key_is_stable_and_ignores_other_params() -> None:
    msgs = [{"role": "system", "content": "sys ü"}, {"role": "user", "content": "Question: x?"}]
    # pinned: a changed key would silently orphan every cached reply
    assert cache_key("m", msgs, SAMPLING) == "848c96ff86deb948a5727d77f47cd34b04aa4259e76f23ee3ade6ac941e821d5"
    assert cache_key("m", msgs, {**SAMPLING, "timeout": 3}) == cache_key("m", msgs, SAMPLING)
    assert cache_key("m", msgs, {**SAMPLING, "seed": 1}) != cache_key("m", msgs, SAMPLING)
    assert cache_key("m2", msgs, SAMPLING) != cache_key("m", msgs, SAMPLING)


def test_cache_round_trip_and_missing_file(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path / "sub" / "c.duckdb")
    assert cache.get_many(["k"]) == {}  # no file yet
    cache.put_many({"k": ("text", 3, 4)}, "m")
    assert cache.get_many(["k", "k", "other"]) == {"k": ("text", 3, 4)}


def test_cache_is_process_safe(tmp_path: Path) -> None:
    path = tmp_path / "shared.duckdb"
    script = (
        "import sys; from tasks.llm.cache import ResponseCache\n"
        "c = ResponseCache(sys.argv[1]); tag = sys.argv[2]\n"
        "for i in range(8):\n"
        "    c.put_many({f'{tag}-{i}': ('t', 1, 2)}, 'm'); c.get_many([f'{tag}-{i}'])\n"
    )
    root = Path(__file__).resolve().parents[3]
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), tag], cwd=root)
             for tag in ("p", "q", "r")]
    assert [p.wait(timeout=50) for p in procs] == [0, 0, 0]
    keys = [f"{t}-{i}" for t in "pqr" for i in range(8)]
    assert len(ResponseCache(path).get_many(keys)) == 24
