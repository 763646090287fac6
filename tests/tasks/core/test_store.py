"""Tests for ``tasks.core.store`` and ``tasks.core.stage``: atomic writes, the catalog, row caches, kills, concurrency."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tasks.core.stage as stage_mod
from tasks.core.files import CATALOG, StoreError, file_digest, write_bytes, write_parquet
from tasks.core.hashing import fingerprint
from tasks.core.row_cache import text_key
from tasks.core.stage import RunContext, input_fps, run_named_stage
from tasks.core.store import ArtifactRef, Store
from tasks.core.vectors import arrow_to_embeddings, current_layout, embedding_width, embeddings_to_arrow

REPO = Path(__file__).resolve().parents[3]


def _frame(values) -> pd.DataFrame:
    return pd.DataFrame({"x": list(values)})


def _stage_rows(store: Store, stage: str) -> pd.DataFrame:
    return store.query("SELECT name, fp, path, rows, rows_computed FROM stages WHERE stage = ?", [stage])


# ----------------------------------------------------------------------------- atomic writes

def test_write_parquet_round_trip_and_no_temp_left(tmp_path):
    path = tmp_path / "a" / "b" / "out.parquet"
    assert write_parquet(_frame([3, 1, 2]), path) == 3
    assert Store.read(path)["x"].tolist() == [3, 1, 2]
    assert write_parquet(pa.table({"x": [7]}), path) == 1  # overwrite in place
    assert Store.read(path)["x"].tolist() == [7]
    assert [p.name for p in path.parent.iterdir()] == ["out.parquet"]


def test_failed_write_leaves_no_file_at_final_path(tmp_path, monkeypatch):
    real = pq.write_table

    def broken(table, where, *a, **k):
        real(table.slice(0, 1), where, *a, **k)  # something reaches the temp file ...
        raise OSError("disk full")                # ... then the write fails

    monkeypatch.setattr(pq, "write_table", broken)
    path = tmp_path / "s" / "out.parquet"
    with pytest.raises(OSError, match="disk full"):
        write_parquet(_frame(range(5)), path)
    assert not path.exists()

    # through a stage: no catalog row, so the next run computes and writes the whole table
    ctx = RunContext(str(tmp_path / "art"), "ds", "run1")
    with pytest.raises(OSError):
        run_named_stage(ctx, "s", "c", {}, {}, lambda: ({"out": _frame(range(5))}, 5))
    assert _stage_rows(ctx.store, "s").empty
    monkeypatch.setattr(pq, "write_table", real)
    refs = run_named_stage(ctx, "s", "c", {}, {}, lambda: ({"out": _frame(range(5))}, 5))
    assert Store.read(refs["out"])["x"].tolist() == list(range(5))
    assert ctx.store.events("run1")["status"].tolist() == ["computed"]


def test_second_output_failing_leaves_stage_untrusted(tmp_path, monkeypatch):
    ctx = RunContext(str(tmp_path / "art"), "ds", "run1")
    real = write_parquet

    def fail_on_b(table, path):
        if path.name.startswith("b-"):
            raise OSError("boom")
        return real(table, path)

    monkeypatch.setattr(stage_mod, "write_parquet", fail_on_b)
    compute = lambda: ({"a": _frame([1]), "b": _frame([2])}, 2)  # noqa: E731
    with pytest.raises(OSError):
        run_named_stage(ctx, "two", "c", {}, {}, compute)
    assert len(list(Path(ctx.artifacts_dir).rglob("a-*.parquet"))) == 1  # written, but not recorded
    monkeypatch.undo()
    refs = run_named_stage(ctx, "two", "c", {}, {}, compute)
    assert set(refs) == {"a", "b"} and Store.read(refs["b"])["x"].tolist() == [2]
    assert ctx.store.events("run1")["status"].tolist() == ["computed"]


def test_write_bytes_atomic(tmp_path):
    path = tmp_path / "x" / "blob.bin"
    write_bytes(b"abc", path)
    assert path.read_bytes() == b"abc" and [p.name for p in path.parent.iterdir()] == ["blob.bin"]


# ----------------------------------------------------------------------------- catalog records

def test_record_lookup_round_trip_and_deleted_file(tmp_path):
    store = Store(tmp_path)
    assert store.lookup("st", "fp1") is None
    p1, p2 = store.path_for("ds", "st", "one", "fp1"), store.path_for("ds", "st", "two", "fp1")
    refs = {"one": ArtifactRef("one", str(p1), "fp1", write_parquet(_frame([1, 2]), p1)),
            "two": ArtifactRef("two", str(p2), "fp1", write_parquet(_frame([3]), p2))}
    recorded = store.record("st", "fp1", "ds", refs, input_fps={"in": "abc"}, params={"k": 1}, rows_computed=2,
                            seconds=0.1, peak_rss_mb=1.0, run_id="r")
    assert recorded == {n: dataclasses.replace(r, digest=file_digest(r.path)[1]) for n, r in refs.items()}
    assert store.lookup("st", "fp1") == recorded
    assert store.lookup("st", "fp2") is None and store.lookup("other", "fp1") is None
    assert store.query('SELECT count(*) AS n FROM "one"')["n"].iloc[0] == 2  # the artifact's view
    # recording the same fingerprint again replaces its rows
    store.record("st", "fp1", "ds", refs, input_fps={}, params={}, rows_computed=0, seconds=0.0,
                 peak_rss_mb=0.0, run_id="r2")
    assert len(_stage_rows(store, "st")) == 2
    p2.unlink()
    assert store.lookup("st", "fp1") is None  # one missing file: the whole stage is untrusted


def test_run_stage_caches_and_recomputes_when_file_deleted(ctx):
    calls = []

    def compute():
        calls.append(1)
        return {"out": _frame([1, 2, 3]), "blob": b"xyz"}, 3

    def run(p):
        return run_named_stage(ctx, "s", "code", {"p": p}, {"in": "f0"}, compute, ext={"blob": "bin"})

    refs = run(1)
    assert refs["blob"].path.endswith(".bin") and Path(refs["blob"].path).read_bytes() == b"xyz"
    assert refs["out"].rows == 3 and refs["blob"].rows == 1
    assert run(1) == refs
    assert len(calls) == 1
    run(2)  # other params: computed
    assert len(calls) == 2
    Path(refs["out"].path).unlink()
    again = run(1)
    assert len(calls) == 3 and again == refs and Store.read(again["out"])["x"].tolist() == [1, 2, 3]
    assert ctx.store.events("run1")["status"].tolist() == ["computed", "cached", "computed", "computed"]


# ----------------------------------------------------------------------------- fingerprints and keys

def test_fingerprint_changes_with_params_inputs_and_code():
    base = fingerprint("s", "c1", {"a": 1, "b": [1, 2]}, {"x": "f1", "y": "f2"})
    assert base == fingerprint("s", "c1", {"b": [1, 2], "a": 1}, {"y": "f2", "x": "f1"})  # key order irrelevant
    others = [fingerprint("t", "c1", {"a": 1, "b": [1, 2]}, {"x": "f1", "y": "f2"}),
              fingerprint("s", "c2", {"a": 1, "b": [1, 2]}, {"x": "f1", "y": "f2"}),
              fingerprint("s", "c1", {"a": 2, "b": [1, 2]}, {"x": "f1", "y": "f2"}),
              fingerprint("s", "c1", {"a": 1, "b": [2, 1]}, {"x": "f1", "y": "f2"}),
              fingerprint("s", "c1", {"a": 1, "b": [1, 2]}, {"x": "f1", "y": "f3"}),
              fingerprint("s", "c1", {"a": 1, "b": [1, 2]}, {"x": "f1"})]
    assert len({base, *others}) == 7
    assert input_fps(a=ArtifactRef("n", "p", "fa", 1), b=None,
                     c={"k": ArtifactRef("n", "p", "fc", 1)}) == {"a": "fa", "c.k": "fc"}
    assert text_key("abc") == text_key("abc") != text_key("abd")


# ----------------------------------------------------------------------------- arrays in Parquet

def test_embeddings_round_trip(tmp_path):
    m = np.random.default_rng(0).standard_normal((7, 5))
    col = embeddings_to_arrow(m)
    assert col.type == pa.binary(20) and embedding_width(col.type) == 5 and len(col) == 7
    path = tmp_path / "e.parquet"
    write_parquet(pa.table({"id": list("abcdefg"), "v": col}), path)
    back = arrow_to_embeddings(Store.read_arrow(path).column("v"))
    assert back.dtype == np.float32 and back.shape == (7, 5)
    np.testing.assert_array_equal(back, m.astype(np.float32))
    chunked = pa.chunked_array([embeddings_to_arrow(m[:3]), embeddings_to_arrow(m[3:])])
    np.testing.assert_array_equal(arrow_to_embeddings(chunked), m.astype(np.float32))
    empty = arrow_to_embeddings(pa.chunked_array([], type=col.type))
    assert empty.shape == (0, 5)
    # a slice (a chunk that starts at an offset) reads its own rows, into a new writable array
    part = arrow_to_embeddings(col.slice(2, 4))
    np.testing.assert_array_equal(part, m[2:6].astype(np.float32))
    assert part.flags.writeable and part.flags.c_contiguous and part.base is None
    zero_width = arrow_to_embeddings(embeddings_to_arrow(np.zeros((3, 0))))
    assert zero_width.shape == (3, 0)
    with pytest.raises(ValueError, match="2-d"):
        embeddings_to_arrow(m[0])
    with pytest.raises(TypeError, match="float32 vectors"):
        embedding_width(pa.list_(pa.float64(), 5))


def legacy_vectors(m: np.ndarray) -> pa.FixedSizeListArray:
    """The vector layout written before FixedSizeBinary: FixedSizeList<float32>[d]."""
    m = np.asarray(m, np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(m.reshape(-1)), m.shape[1])


def test_vectors_are_stored_flat_and_the_older_list_layout_reads_the_same(tmp_path):
    m = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
    new, old = tmp_path / "new.parquet", tmp_path / "old.parquet"
    tags = pa.array([["x"] * (i % 3) for i in range(50)])  # a nested column beside the vectors
    write_parquet(pa.table({"id": [str(i) for i in range(50)], "tags": tags, "emb": embeddings_to_arrow(m)}),
                        new)
    pq.write_table(pa.table({"id": [str(i) for i in range(50)], "tags": tags, "emb": legacy_vectors(m)}), old)
    group = pq.ParquetFile(new).metadata.row_group(0)
    # the vectors are flat fixed-length values (no list levels); every other column is written as any table's is
    assert group.column(2).path_in_schema == "emb" and group.column(2).physical_type == "FIXED_LEN_BYTE_ARRAY"
    assert [group.column(i).compression for i in range(2)] == ["SNAPPY", "SNAPPY"]
    for path in (new, old):
        np.testing.assert_array_equal(arrow_to_embeddings(Store.read_arrow(path).column("emb")), m)
    assert current_layout(Store.read_arrow(old)).equals(Store.read_arrow(new))
    assert embedding_width(pq.read_schema(old).field("emb").type) == 8


def test_a_row_cache_with_parts_of_both_vector_layouts_reads_as_one(tmp_path):
    m = np.random.default_rng(2).standard_normal((9, 4)).astype(np.float32)
    keys = [f"k{i}" for i in range(9)]
    cache = Store(tmp_path).row_cache("embed", "p", "key")
    cache.folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"key": keys[:5], "emb": legacy_vectors(m[:5])}), cache.folder / "part-0.parquet")
    cache.append(pa.table({"key": keys[5:], "emb": embeddings_to_arrow(m[5:])}))
    got = cache.read(keys)
    assert got.column("emb").type == pa.binary(16)
    order = [keys.index(k) for k in got.column("key").to_pylist()]
    np.testing.assert_array_equal(arrow_to_embeddings(got.column("emb")), m[order])
    assert sorted(order) == list(range(9))


# ----------------------------------------------------------------------------- row caches

def test_row_cache_append_read_keys(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(StoreError):
        store.row_cache("st", "p", "key").read(["a"])
    assert store.row_cache("st", "p", "key").keys() == set()
    store.row_cache("st", "p", "key").append(pd.DataFrame({"key": ["a", "b", "b"], "v": [1, 2, 3]}))
    store.row_cache("st", "p", "key").append(pd.DataFrame({"key": ["c"], "v": [4]}))
    assert store.row_cache("st", "p", "key").keys() == {"a", "b", "c"}
    assert store.row_cache("st", "other", "key").keys() == set()
    got = store.row_cache("st", "p", "key").read(["b", "c", "zz"]).to_pandas()
    assert sorted(zip(got["key"], got["v"])) == [("b", 2), ("b", 3), ("c", 4)]  # every row of a key
    # a key computed again in another part: one copy of its rows survives, not both
    store.row_cache("st", "p", "key").append(pd.DataFrame({"key": ["b", "b"], "v": [20, 30]}))
    got = store.row_cache("st", "p", "key").read(["a", "b"]).to_pandas()
    assert got["key"].tolist().count("a") == 1
    assert sorted(got.loc[got["key"] == "b", "v"]) in ([2, 3], [20, 30])


def _read_part_by_part(cache, keys: list[str]) -> pd.DataFrame:
    """The row cache's rule stated plainly: parts in order, each key's rows from the first part holding it."""
    wanted, out = set(keys), []
    for p in cache._parts():
        t = pq.read_table(p).to_pandas()
        t = t[t["key"].isin(wanted)]
        out.append(t)
        wanted -= set(t["key"])
    return pd.concat(out, ignore_index=True)


def test_row_cache_read_and_missing_match_the_part_by_part_rule(tmp_path):
    rng = np.random.default_rng(3)
    cache = Store(tmp_path).row_cache("st", "p", "key")
    universe = [f"k{i}" for i in range(60)]
    for part in range(7):  # keys repeat within a part (several rows of one key) and across parts (re-computed)
        keys = rng.choice(universe[:50], size=int(rng.integers(1, 30)))
        cache.append(pd.DataFrame({"key": keys, "v": part * 1000 + np.arange(keys.size)}))
    for trial in range(20):
        keys = list(rng.choice(universe, size=int(rng.integers(1, 40))))
        if not set(keys) & cache.keys():
            continue
        got = cache.read(keys).to_pandas()
        want = _read_part_by_part(cache, keys)
        assert got["key"].tolist() == want["key"].tolist() and got["v"].tolist() == want["v"].tolist()
        done = cache.keys()
        assert cache.missing(keys) == [k for k in keys if k not in done]
    # a part appended after this instance read the keys is seen by it (each part's keys are read once)
    cache.append(pd.DataFrame({"key": ["k55", "k1"], "v": [-1, -2]}))
    assert cache.missing(["k55", "k59"]) == ["k59"]
    got = cache.read(["k55", "k1"]).to_pandas()
    want = _read_part_by_part(cache, ["k55", "k1"])
    assert got["key"].tolist() == want["key"].tolist() and got["v"].tolist() == want["v"].tolist()
    assert cache.missing([]) == []
    assert Store(tmp_path).row_cache("st", "empty", "key").missing(["a", "b"]) == ["a", "b"]


# ----------------------------------------------------------------------------- a killed run

_KILLED = """
import pathlib, sys, time
import pandas as pd
from tasks.core.stage import RunContext, run_named_stage
from tasks.core.store import Store

art, marker, mode = sys.argv[1:4]

def compute():
    if mode == "compute":
        pathlib.Path(marker).touch()
        time.sleep(30)
    return {"out": pd.DataFrame({"x": [-1]})}, 1  # a wrong value: must never be trusted later

if mode == "record":  # die after the file is in place, before the catalog row
    def stuck(self, *args, **kwargs):
        pathlib.Path(marker).touch()
        time.sleep(30)
    Store.record = stuck

run_named_stage(RunContext(art, "ds", "killed"), "slow", "code-v1", {"p": 1}, {"in": "abc"}, compute)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"subprocess exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("subprocess never reached the marker")
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["compute", "record"])
def test_killed_stage_is_recomputed(tmp_path, mode):
    art, marker = tmp_path / "art", tmp_path / "marker"
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(_KILLED))
    proc = subprocess.Popen([sys.executable, str(script), str(art), str(marker), mode], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(marker, proc)
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    ctx = RunContext(str(art), "ds", "again")
    refs = run_named_stage(ctx, "slow", "code-v1", {"p": 1}, {"in": "abc"}, lambda: ({"out": _frame([1, 2, 3])}, 3))
    assert ctx.store.events("again")["status"].tolist() == ["computed"]
    assert Store.read(refs["out"])["x"].tolist() == [1, 2, 3]
    rows = _stage_rows(ctx.store, "slow")
    assert rows["path"].tolist() == [refs["out"].path] and rows["rows"].tolist() == [3]
    assert ctx.store.events("killed").empty
    finals = sorted(p for p in art.rglob("*.parquet") if not p.name.startswith("."))
    assert finals == [Path(refs["out"].path)]
    # and now it is trusted
    assert run_named_stage(ctx, "slow", "code-v1", {"p": 1}, {"in": "abc"}, lambda: ({"out": _frame([0])}, 1)) == refs


# ----------------------------------------------------------------------------- two processes, one catalog

_WRITER = """
import pathlib, sys, time
import pandas as pd
from tasks.core.files import write_parquet
from tasks.core.store import ArtifactRef, Store

root, tag, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), pathlib.Path(sys.argv[4])
store = Store(root)
while not go.exists():
    time.sleep(0.01)
for i in range(n):
    fp = f"{tag}-{i:03d}"
    path = store.path_for("ds", "conc", "out", fp)
    rows = write_parquet(pd.DataFrame({"tag": [tag], "i": [i]}), path)
    store.record("conc", fp, "ds", {"out": ArtifactRef("out", str(path), fp, rows)}, input_fps={},
                 params={"i": i}, rows_computed=rows, seconds=0.0, peak_rss_mb=0.0, run_id=tag)
"""


def test_two_processes_share_one_catalog(tmp_path):
    art, go = tmp_path / "art", tmp_path / "go"
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(_WRITER))
    procs = [subprocess.Popen([sys.executable, str(script), str(art), tag, "20", str(go)], cwd=REPO, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for tag in ("p1", "p2")]
    time.sleep(0.5)
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
    store = Store(art)
    rows = _stage_rows(store, "conc")
    assert len(rows) == 40 and rows["fp"].is_unique
    assert sorted(rows["fp"]) == sorted(f"{t}-{i:03d}" for t in ("p1", "p2") for i in range(20))
    assert all(store.lookup("conc", fp) is not None for fp in rows["fp"])
    per_run = store.query("SELECT run_id, count(*) AS n FROM stages GROUP BY run_id ORDER BY run_id")
    assert per_run.values.tolist() == [["p1", 20], ["p2", 20]]
    assert store.query('SELECT count(*) AS n FROM "out"')["n"].iloc[0] == 1  # the view is readable


def test_ledger_rows_carry_failed_requests_also_in_an_older_catalog(tmp_path):
    import duckdb

    old = duckdb.connect(str(tmp_path / "catalog.duckdb"))  # a catalog from before the llm_failed column
    old.execute("CREATE TABLE llm_ledger (run_id VARCHAR, stage VARCHAR, llm_calls BIGINT, llm_cache_hits BIGINT, "
                "prompt_tokens BIGINT, completion_tokens BIGINT, seconds DOUBLE, created_at TIMESTAMP)")
    old.close()
    store = Store(tmp_path)
    store.record_ledger("r1", "generate", {"llm_calls": 3, "llm_cache_hits": 1, "prompt_tokens": 30,
                                           "completion_tokens": 9, "seconds": 0.5, "llm_failed": 2})
    row = store.query("SELECT llm_calls, llm_failed FROM llm_ledger WHERE run_id = 'r1'")
    assert row.iloc[0].tolist() == [3, 2]


def test_metrics_rows_carry_overrides_also_in_an_older_catalog(tmp_path):
    import duckdb

    old = duckdb.connect(str(tmp_path / "catalog.duckdb"))  # a catalog from before the overrides column
    old.execute("CREATE TABLE metrics (run_id VARCHAR, kind VARCHAR, method VARCHAR, dataset VARCHAR, "
                "created_at TIMESTAMP, metrics JSON)")
    old.execute("INSERT INTO metrics VALUES ('r0', 'evaluate', 'bm25', 'ds', now(), '{}')")
    old.close()
    store = Store(tmp_path)
    store.record_metrics("r1", "evaluate", "bm25", "ds", {"recall@5": 50.0}, {"method.b": "0.4"})
    rows = store.query("SELECT run_id, overrides FROM metrics ORDER BY run_id")
    assert rows["run_id"].tolist() == ["r0", "r1"]
    assert pd.isna(rows["overrides"].iloc[0]) and json.loads(rows["overrides"].iloc[1]) == {"method.b": "0.4"}


def test_a_catalog_with_columns_added_by_a_newer_version_still_takes_every_record(tmp_path):
    """A newer dagrag may add a column to any catalog table; this version names its columns when it inserts,
    so it keeps writing to such a catalog (an older checkout's run failed on a metrics table with one more)."""
    import duckdb

    with Store(tmp_path).catalog():  # creates the tables
        pass
    con = duckdb.connect(str(tmp_path / "catalog.duckdb"))
    for table in ("stages", "stage_events", "runs", "metrics", "llm_ledger"):
        con.execute(f"ALTER TABLE {table} ADD COLUMN added_later VARCHAR")
    con.close()
    store = Store(tmp_path)
    p = store.path_for("ds", "st", "one", "fp1")
    refs = {"one": ArtifactRef("one", str(p), "fp1", write_parquet(_frame([1]), p))}
    recorded = store.record("st", "fp1", "ds", refs, input_fps={}, params={}, rows_computed=1, seconds=0.1,
                            peak_rss_mb=1.0, run_id="r")
    store.event("r", "st", "fp1", "ds", "computed", rows=1, rows_computed=1, seconds=0.1, peak_rss_mb=1.0)
    store.record_run("r", "evaluate", {})
    store.record_metrics("r", "evaluate", "bm25", "ds", {"recall@5": 50.0})
    assert store.lookup("st", "fp1") == recorded
    for table in ("stage_events", "runs", "metrics"):  # a row each, its new column empty
        assert store.query(f"SELECT count(*) AS n FROM {table}")["n"].iloc[0] == 1


# ----------------------------------------------------------------------------- catalog sessions: attach, detach

_OPEN_FOR_WRITING = """
import sys
import duckdb
con = duckdb.connect(sys.argv[1])  # read-write: refused while any process still has the file attached
print(con.execute("SELECT count(*) FROM stage_events").fetchone()[0])
con.close()
"""


def _open_elsewhere(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _OPEN_FOR_WRITING, str(path)], capture_output=True, text=True,
                          timeout=60)


def test_each_catalog_session_lets_the_file_go_even_when_it_fails_inside_a_transaction(tmp_path):
    """Sessions attach the catalog to a DuckDB that lives as long as the thread; the file's lock must not."""
    store = Store(tmp_path)
    store.event("r", "s", "fp", "ds", "cached", rows=1, rows_computed=0, seconds=0.0, peak_rss_mb=0.0)
    out = _open_elsewhere(tmp_path / CATALOG)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr[-2000:]
    with pytest.raises(RuntimeError, match="mid-session"):
        with store.catalog() as con:
            con.execute("BEGIN TRANSACTION")
            con.execute("INSERT INTO stage_events (run_id, status) VALUES ('r2', 'cached')")
            raise RuntimeError("mid-session")
    out = _open_elsewhere(tmp_path / CATALOG)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr[-2000:]  # rolled back, and let go
    store.event("r3", "s", "fp", "ds", "cached", rows=1, rows_computed=0, seconds=0.0, peak_rss_mb=0.0)
    assert store.events("r3")["status"].tolist() == ["cached"]  # the next session works (on a new host if need be)


def test_threads_and_a_forked_child_use_catalogs_side_by_side(tmp_path):
    """Concurrent sessions from threads on two catalogs, then a child after fork() (which must not use the host
    it was copied with: DuckDB crashes freeing it there)."""
    from concurrent.futures import ThreadPoolExecutor

    stores = [Store(tmp_path / "a"), Store(tmp_path / "b")]

    def log(i: int) -> None:
        stores[i % 2].event(f"r{i % 2}", "s", f"fp{i}", "ds", "cached", rows=1, rows_computed=0, seconds=0.0,
                            peak_rss_mb=0.0)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(log, range(40)))
    assert [len(s.events(f"r{i}")) for i, s in enumerate(stores)] == [20, 20]
    pid = os.fork()
    if pid == 0:  # the child: the parent's host must not be used across fork()
        try:
            log(0)
            os._exit(0 if len(stores[0].events("r0")) == 21 else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(stores[0].events("r0")) == 21


# ----------------------------------------------------------------------------- copies of a store

def _stored(root: Path) -> tuple[Store, dict[str, ArtifactRef]]:
    """A store holding one stage (a table and a blob), a row cache, a run manifest and a metrics row naming it."""
    ctx = RunContext(str(root), "ds", "run1")
    refs = run_named_stage(ctx, "s", "code", {"p": 1}, {"in": "f0"}, lambda: ({"out": _frame([1, 2]), "blob": b"ab"}, 2),
                     ext={"blob": "bin"})
    ctx.store.row_cache("embed", "fp0", "key").append(pd.DataFrame({"key": ["k1"], "v": [1.0]}))
    ctx.store.record_run("run1", "index", {"artifacts_dir": str(ctx.store.root), "out": refs["out"].path})
    ctx.store.record_metrics("run1", "index", "m", "ds", {"artifacts": {"out": refs["out"].path}})
    return ctx.store, refs


def test_a_copy_links_the_files_and_its_catalog_names_its_own(tmp_path):
    src, refs = _stored(tmp_path / "src")
    copy = src.copy_to(tmp_path / "dst")
    moved = copy.lookup("s", refs["out"].fp)
    assert moved["out"].path == str(tmp_path / "dst" / Path(refs["out"].path).relative_to(src.root))
    assert os.stat(moved["out"].path).st_ino == os.stat(refs["out"].path).st_ino  # hard-linked, not copied
    assert os.stat(copy.root / "catalog.duckdb").st_ino != os.stat(src.root / "catalog.duckdb").st_ino
    manifest = json.loads(copy.query("SELECT manifest FROM runs")["manifest"].iloc[0])
    assert manifest == {"artifacts_dir": str(copy.root), "out": moved["out"].path}
    metrics = json.loads(copy.query("SELECT metrics FROM metrics")["metrics"].iloc[0])
    assert metrics["artifacts"]["out"] == moved["out"].path
    assert copy.row_cache("embed", "fp0", "key").keys() == {"k1"}
    assert copy.query("SELECT x FROM out ORDER BY x")["x"].tolist() == [1, 2]  # the view reads the copy's file
    assert not list(tmp_path.glob(".dst.copy-*"))


def test_work_in_a_copy_leaves_the_original_as_it_was(tmp_path):
    src, refs = _stored(tmp_path / "src")
    before = src.query("SELECT stage, fp, path FROM stages ORDER BY stage, name")
    copy = src.copy_to(tmp_path / "dst")
    ctx = RunContext(str(copy.root), "ds", "run2")
    run_named_stage(ctx, "s", "code", {"p": 1}, {"in": "f0"}, lambda: ({"out": _frame([7]), "blob": b"z"}, 1),
              ext={"blob": "bin"})  # the same fingerprint, cached in the copy
    run_named_stage(ctx, "t", "code", {}, {}, lambda: ({"out": _frame([9])}, 1))  # a new stage, only in the copy
    copy.row_cache("embed", "fp0", "key").append(pd.DataFrame({"key": ["k2"], "v": [2.0]}))
    assert src.query("SELECT stage, fp, path FROM stages ORDER BY stage, name").equals(before)
    assert src.row_cache("embed", "fp0", "key").keys() == {"k1"}
    assert Store.read(refs["out"])["x"].tolist() == [1, 2]
    shutil.rmtree(src.root)  # the copy stands alone
    assert Store.read(copy.lookup("s", refs["out"].fp)["out"])["x"].tolist() == [1, 2]


def _cached(ctx: RunContext) -> dict[str, ArtifactRef]:
    """The stage of :func:`_stored` again: it must come from the catalog (a recompute fails the test)."""
    def recompute():
        raise AssertionError("the moved store computed a stage it holds")
    return run_named_stage(ctx, "s", "code", {"p": 1}, {"in": "f0"}, recompute, ext={"blob": "bin"})


def _assert_names_its_own(store: Store, refs: dict[str, ArtifactRef]) -> None:
    assert refs["out"].path == str(store.root / "ds" / "s" / Path(refs["out"].path).name)
    assert Store.read(refs["out"])["x"].tolist() == [1, 2]
    manifest = json.loads(store.query("SELECT manifest FROM runs")["manifest"].iloc[0])
    assert manifest == {"artifacts_dir": str(store.root), "out": refs["out"].path}
    metrics = json.loads(store.query("SELECT metrics FROM metrics")["metrics"].iloc[0])
    assert metrics["artifacts"]["out"] == refs["out"].path
    assert store.query("SELECT x FROM out ORDER BY x")["x"].tolist() == [1, 2]  # the view reads its own file
    assert store.query("SELECT root FROM store_root")["root"].tolist() == [str(store.root)]


def test_a_moved_store_keeps_its_cache(tmp_path):
    src, refs = _stored(tmp_path / "src")
    os.rename(src.root, tmp_path / "moved")  # `mv artifacts elsewhere`
    ctx = RunContext(str(tmp_path / "moved"), "ds", "run2")
    moved = _cached(ctx)
    assert moved["out"].fp == refs["out"].fp
    _assert_names_its_own(ctx.store, moved)
    assert ctx.store.row_cache("embed", "fp0", "key").keys() == {"k1"}


def test_a_store_copied_by_cp_r_names_its_own_files_and_the_original_is_untouched(tmp_path):
    src, refs = _stored(tmp_path / "src")
    shutil.copytree(src.root, tmp_path / "copy")  # `cp -r`: the catalog file still names the original's files
    ctx = RunContext(str(tmp_path / "copy"), "ds", "run2")
    _assert_names_its_own(ctx.store, _cached(ctx))
    again = Store(src.root)
    assert again.lookup("s", refs["out"].fp) == refs
    _assert_names_its_own(again, refs)


def test_a_catalog_from_before_the_recorded_root_is_followed_too(tmp_path):
    src, refs = _stored(tmp_path / "src")
    with src.catalog() as con:  # as catalogs were written before `store_root` existed
        con.execute("DROP TABLE store_root")
    os.rename(src.root, tmp_path / "moved")
    ctx = RunContext(str(tmp_path / "moved"), "ds", "run2")
    _assert_names_its_own(ctx.store, _cached(ctx))


def test_a_rewrite_that_fails_half_way_leaves_the_catalog_as_it_was(tmp_path, monkeypatch):
    src, refs = _stored(tmp_path / "src")
    os.rename(src.root, tmp_path / "moved")
    real = Store._rewrite_root

    def dies_after_rewriting(self, con, old, new):
        real(self, con, old, new)
        raise KeyboardInterrupt  # e.g. Ctrl-C once every path was rewritten, before the root was recorded

    monkeypatch.setattr(Store, "_rewrite_root", dies_after_rewriting)
    with pytest.raises(KeyboardInterrupt):
        Store(tmp_path / "moved").query("SELECT 1")
    monkeypatch.undo()
    with duckdb.connect(str(tmp_path / "moved" / "catalog.duckdb"), read_only=True) as con:
        assert con.execute("SELECT path FROM stages WHERE name = 'out'").fetchone()[0] == refs["out"].path
        assert con.execute("SELECT root FROM store_root").fetchall() == [(str(src.root),)]
    ctx = RunContext(str(tmp_path / "moved"), "ds", "run2")
    _assert_names_its_own(ctx.store, _cached(ctx))


def test_a_store_that_did_not_move_is_left_as_it_is(tmp_path):
    src, refs = _stored(tmp_path / "src")
    with src.catalog() as con:
        con.execute("DROP TABLE store_root")
        before = con.execute("SELECT * FROM stages ORDER BY stage, name").df()
    again = Store(src.root)
    assert again.query("SELECT * FROM stages ORDER BY stage, name").equals(before)
    assert again.query("SELECT root FROM store_root")["root"].tolist() == [str(src.root)]


def test_a_copy_refuses_an_existing_target_and_a_failed_one_leaves_nothing(tmp_path, monkeypatch):
    src, _ = _stored(tmp_path / "src")
    (tmp_path / "taken").mkdir()
    with pytest.raises(StoreError, match="exists"):
        src.copy_to(tmp_path / "taken")
    with pytest.raises(StoreError, match="into itself"):
        src.copy_to(src.root / "inner")

    def broken(self, con):
        raise RuntimeError("disk full")

    monkeypatch.setattr(Store, "_rebase_catalog", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        src.copy_to(tmp_path / "dst")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "taken"]
