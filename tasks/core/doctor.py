"""The store's full check and its repair (``dagrag doctor``): every recorded file against its hash.

A run makes only the cheap check before it trusts a file (:func:`tasks.core.files.file_problem`); this reads
every byte. It finds:

* **damaged** files: a stage output or row-cache part whose size or content hash differs from the one recorded
  when it was written, or (recorded before hashes were) that no longer decodes;
* **incomplete** stage records: a stage whose record lacks an output the stage declared, or beside which lies an
  output file of its fingerprint that it does not name (a run killed while recording it, before records were made
  in one transaction);
* **dangling** catalog rows: a stage output or part the catalog names that is gone;
* **orphans**: stage-output files the catalog does not name (no run trusts them, so they are reported and left
  alone) and temp files of killed writes (repair removes those untouched for 15 minutes);
* a catalog that **cannot be read**.

With ``repair`` it quarantines damaged files (moved into ``_quarantine/``, never deleted) and removes the
catalog rows of every stage with an incomplete record or a damaged or missing file (the next run computes that
stage again; the unrecorded outputs of an incomplete record are quarantined), records
the hash of files written before hashes were (once they decode), and rebuilds an unreadable catalog: the old
one is quarantined, a new one made, and every row-cache part that decodes registered in it. Stage outputs are
not registered again (the catalog alone knew which files make one stage's whole output): the next run
computes those stages again, their per-row work coming back from the row caches.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from tasks.core.catalog import CatalogDamaged
from tasks.core.files import CATALOG, QUARANTINE, ROWS, file_digest, file_problem, parquet_problem, quarantine
from tasks.core.store import Store, incomplete

# a stage output's name (<name>-<fp>.<ext>) and a killed write's temp file (.<file>.<uuid>.tmp)
_STAGE_FILE = re.compile(r"^.+-[0-9a-f]{16}\.(parquet|npy|bin|tar)$|^\..+\.[0-9a-f]{32}\.tmp$")
# top-level folders that hold no stage outputs: run folders, reports, sweeps, growth's own corpora and stores
_NOT_DATASETS = frozenset({"runs", "multirun", "reports", "growth", "scale"})


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found: what, where, what is wrong, what repair did ("" when nothing)."""

    kind: str      # "catalog", "stage record", "stage output", "row part", "orphan"
    path: str
    problem: str
    action: str = ""
    damage: bool = True  # whether it keeps the store from being healthy until repaired

    @property
    def unrepaired(self) -> bool:
        return self.damage and not self.action


def verify(path: str, size: int | None, digest: str | None, rows: int | None = None) -> str | None:
    """What a full check finds wrong with a recorded file (every byte against its recorded hash; a file
    recorded without one must decode), or None."""
    problem = file_problem(path, size, rows)
    if problem is not None:
        return problem
    if digest is not None:
        return None if file_digest(path)[1] == digest else "has content that differs from its recorded hash"
    if path.endswith(".parquet"):
        broken = parquet_problem(path)
        return None if broken is None else f"is unreadable ({broken})"
    return None


def catalog_problem(store: Store) -> str | None:
    """Why the catalog cannot be read whole, or None (every table is scanned, so every block is read)."""
    try:
        with store.catalog() as con:
            tables = [t for (t,) in con.execute("SELECT table_name FROM information_schema.tables WHERE "
                                                "table_catalog = current_database() AND table_type = 'BASE TABLE'"
                                                ).fetchall()]
            for table in tables:
                con.execute(f'SELECT * FROM "{table}"').fetchall()
    except CatalogDamaged as err:
        return f"cannot be read ({err.reason})"
    return None


def rebuild_catalog(root: Path) -> Path:
    """Quarantine an unreadable catalog (and its write-ahead log) and make a new, empty one; returns where the
    old one went. The parts of the row caches are registered again by :func:`part_findings`."""
    moved = quarantine(root / CATALOG, root)
    wal = root / f"{CATALOG}.wal"
    if wal.exists():
        quarantine(wal, root)
    with Store(root).catalog():  # creates the tables
        pass
    return moved


def stage_findings(store: Store, repair: bool) -> tuple[list[Finding], int]:
    """Every stage's record checked against what the stage declared (:func:`tasks.core.store.incomplete`) and
    every recorded stage output checked in full; with ``repair`` the damaged quarantined, the unrecorded outputs
    that would complete a broken record quarantined, and the rows of each stage with an incomplete record or a
    damaged or missing file removed (the next run computes that stage again). Returns the findings and the number
    of files checked."""
    with store.catalog() as con:
        rows = con.execute("SELECT stage, fp, path, rows, bytes, digest, name, outputs FROM stages").fetchall()
    findings, broken = [], set()
    records: dict[tuple[str, str], list[tuple[str, str, str | None]]] = {}
    for stage, fp, path, _, _, _, name, declared in rows:
        records.setdefault((stage, fp), []).append((name, path, declared))
    for (stage, fp), record in records.items():
        gap = incomplete(fp, record)
        if gap is None:
            continue
        broken.add((stage, fp))
        recorded = {path for _, path, _ in record}
        strays = sorted(str(p) for folder in {Path(path).parent for _, path, _ in record} if folder.is_dir()
                        for p in folder.glob(f"*-{fp}.*") if not p.name.startswith(".") and str(p) not in recorded)
        findings.append(Finding("stage record", f"{stage} [{fp}]", gap, "record removed" if repair else ""))
        findings += [Finding("orphan", path, f"an output of {stage} [{fp}] its incomplete record lost",
                             f"quarantined to {_rel(quarantine(path, store.root), store.root)}" if repair else "")
                     for path in strays]
    for stage, fp, path, n, size, digest, _, _ in rows:
        problem = verify(path, size, digest, n if path.endswith(".parquet") else None)
        if problem is None and digest is None:
            action = ""
            if repair:
                with store.writing() as con:
                    con.execute("UPDATE stages SET bytes = ?, digest = ? WHERE path = ?", [*file_digest(path), path])
                action = "hash recorded"
            findings.append(Finding("stage output", path, "no hash recorded (written before hashes were)",
                                    action, damage=False))
        elif problem is not None:
            broken.add((stage, fp))
            missing = problem == "is missing"
            action = ""
            if repair:
                action = "row removed" if missing else f"quarantined to {_rel(quarantine(path, store.root), store.root)}"
            findings.append(Finding("stage output", path, "dangling catalog row: the file is missing" if missing
                                    else problem, action))
    if repair and broken:
        with store.writing() as con:
            for stage, fp in sorted(broken):
                con.execute("DELETE FROM stages WHERE stage = ? AND fp = ?", [stage, fp])
    return findings, len(rows)


def part_findings(store: Store, repair: bool) -> tuple[list[Finding], int]:
    """Every row-cache part checked in full: against its recorded hash, or (not registered) by decoding it;
    with ``repair`` the damaged quarantined, the dangling rows removed, the sound unregistered ones registered."""
    with store.catalog() as con:
        recorded = {p: (b, d) for p, b, d in con.execute("SELECT path, bytes, digest FROM row_parts").fetchall()}
    files = sorted(str(p) for p in (store.root / ROWS).glob("*/*/part-*.parquet"))
    findings = []
    for path in files:
        size, digest = recorded.get(path, (None, None))
        problem = verify(path, size, digest)
        if problem is not None:
            action = f"quarantined to {_rel(quarantine(path, store.root), store.root)}" if repair else ""
            findings.append(Finding("row part", path, problem, action))
            if repair and path in recorded:
                with store.writing() as con:
                    con.execute("DELETE FROM row_parts WHERE path = ?", [path])
        elif path not in recorded:
            if repair:
                store.record_part(Path(path))
            findings.append(Finding("row part", path, "not registered (written before parts were, or its run was "
                                    "killed before registering it); it decodes", "registered" if repair else "",
                                    damage=False))
    gone = sorted(set(recorded) - set(files))
    for path in gone:
        findings.append(Finding("row part", path, "dangling catalog row: the file is missing",
                                "row removed" if repair else ""))
    if repair and gone:
        with store.writing() as con:
            con.executemany("DELETE FROM row_parts WHERE path = ?", [[p] for p in gone])
    return findings, len(files)


# a temp file untouched this long is a killed write's, not one being written now (a write renames its temp file the
# moment it is done; the longest part or output write seen here takes seconds), so repair may remove it even beside
# a running command (beyond the papers: a store-keeping choice)
STALE_TEMP_S = 15 * 60


def orphan_findings(store: Store, repair: bool = False) -> list[Finding]:
    """Stage-output files the catalog does not name (left alone: no run trusts them), and temp files of killed
    writes (with ``repair``, those untouched for :data:`STALE_TEMP_S` are removed)."""
    with store.catalog() as con:
        known = {p for (p,) in con.execute("SELECT path FROM stages").fetchall()}
    found, temps = [], []
    for dataset in sorted(p for p in store.root.iterdir() if p.is_dir()):
        if dataset.name.startswith(("_", ".")) or dataset.name in _NOT_DATASETS:
            continue
        for path in sorted(dataset.glob("*/*")):
            if not (path.is_file() and _STAGE_FILE.match(path.name)):
                continue
            if path.name.endswith(".tmp"):
                temps.append(path)
            elif str(path) not in known:
                found.append(Finding("orphan", str(path), "no catalog row names it: no run trusts it (remove it "
                                     "if you need the space)", damage=False))
    temps += sorted((store.root / ROWS).glob("*/*/.*.tmp"))
    now = time.time()
    for path in temps:
        try:
            stale = now - path.stat().st_mtime >= STALE_TEMP_S
        except FileNotFoundError:  # its write finished (renamed) meanwhile
            continue
        action = ""
        if repair and stale:
            path.unlink(missing_ok=True)
            action = "removed"
        found.append(Finding("orphan", str(path), "a killed write's temp file" + (
            "" if stale else f" or one being written now (touched under {STALE_TEMP_S // 60} minutes ago)"),
            action, damage=False))
    return found


def examine(root: Path, repair: bool) -> tuple[list[Finding], dict[str, int]]:
    """The doctor's whole pass over the store at ``root``: the catalog, every stage output and row-cache part,
    orphans; repairs as it goes when ``repair``. Returns the findings and how many files each kind had."""
    store = Store(root)
    findings = []
    problem = catalog_problem(store)
    if problem is not None:
        if not repair:
            return [Finding("catalog", str(root / CATALOG), problem)], {}
        moved = rebuild_catalog(root)
        findings.append(Finding("catalog", str(root / CATALOG), problem,
                                f"rebuilt (the old one quarantined to {_rel(moved, root)})"))
        store = Store(root)
    stages, n_stage = stage_findings(store, repair)
    parts, n_parts = part_findings(store, repair)
    named = {f.path for f in stages}
    findings += stages + parts + [f for f in orphan_findings(store, repair) if f.path not in named]
    return findings, {"stage outputs": n_stage, "row parts": n_parts}


def quarantined(root: Path) -> int:
    """How many files the quarantine holds."""
    return sum(len(files) for _, _, files in os.walk(root / QUARANTINE))


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
