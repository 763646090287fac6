"""``dagrag doctor [artifacts_dir=…] [doctor.repair=true]``: the store's full check, and its repair.

Every recorded file is read whole and checked against its hash (:mod:`tasks.core.doctor`); a table lists what is
wrong. Exit status 0: healthy (or everything found was repaired); 1: damage left unrepaired; 2: no store there.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from flows.runtime.config import load_config
from tasks.core.doctor import examine, quarantined
from tasks.core.catalog import REBUILD_HINT
from tasks.core.files import CATALOG, QUARANTINE

EXIT_DAMAGED = 1


def doctor(root: Path, repair: bool) -> int:
    """Check (and with ``repair`` repair) the store at ``root``, print the table and a last line; exit status."""
    findings, counts = examine(root, repair)
    if findings and findings[0].kind == "catalog" and findings[0].unrepaired:  # nothing else can be checked
        print(f"error: the catalog {findings[0].path} {findings[0].problem}: "
              f"{REBUILD_HINT.format(root=root)}", file=sys.stderr)
        return EXIT_DAMAGED
    if findings:
        print(table([[f.kind, _rel(f.path, root), f.problem, f.action or "-"] for f in findings],
                    ["kind", "file", "problem", "repair"]))
    left = [f for f in findings if f.unrepaired]
    damaged = [f for f in findings if f.damage]
    checked = ", ".join(f"{n} {what}" for what, n in counts.items())
    if left:
        print(f"{len(left)} damaged or dangling item(s) left: run `dagrag doctor doctor.repair=true "
              f"artifacts_dir={root}` to repair them", file=sys.stderr)
    elif damaged:
        print(f"repaired {len(damaged)} item(s) ({checked} checked); the next run computes again what was "
              f"removed, and {root / QUARANTINE} keeps the files moved aside ({quarantined(root)})")
    else:
        print(f"healthy: {checked} checked against their recorded hashes")
    summary = {"healthy": not left, "repaired": len(damaged) - len(left) if repair else 0, "left": len(left),
               "orphans": sum(f.kind == "orphan" for f in findings), **counts}
    print("doctor: " + json.dumps(summary), flush=True)
    return EXIT_DAMAGED if left else 0


def table(rows: list[list[str]], columns: list[str]) -> str:
    """A plain table, every column left-aligned (its cells are text)."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    return "\n".join(lines + ["-" * len(lines[0])] + ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()
                                                      for r in rows])


def _rel(path: str, root: Path) -> str:
    return str(Path(path).relative_to(root)) if Path(path).is_relative_to(root) else path


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: ``artifacts_dir`` names the store, ``doctor.repair`` repairs."""
    from flows.runtime.exits import USER_ERRORS, discard_job_folder, fail_before_flow
    from flows.runtime.preflight import PreflightError

    plain = OmegaConf.to_container(cfg, resolve=True)
    root = Path(plain["artifacts_dir"]).resolve()
    try:
        conf = load_config(plain)
        if not (root / CATALOG).exists() and not (root / "_rows").is_dir():
            raise PreflightError(f"no store at {root} (no {CATALOG}, no _rows/): fix artifacts_dir")
    except USER_ERRORS as err:
        fail_before_flow(err, cfg, plain.get("artifacts_dir"))
    status = doctor(root, conf.doctor.repair)
    discard_job_folder(str(root))  # the doctor leaves no run folder behind
    sys.exit(status)


if __name__ == "__main__":
    main()
