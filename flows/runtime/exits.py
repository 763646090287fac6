"""How a command ends on a user error or on Ctrl-C: one line on stderr and a known exit status, nothing left behind.

:func:`fail` is how an entry point ends on a user error: one line on stderr, exit status 2, the
traceback only when asked for (``verbose=true`` or ``HYDRA_FULL_ERROR=1``). An error found before the flow
starts (:func:`fail_before_flow`) also stops the temporary Prefect server unused and removes Hydra's job folder.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

from flows.runtime.config import ConfigError
from flows.runtime.preflight import IndexNotBuilt, PreflightError
from tasks.core.files import StoreError
from tasks.data.ingest import IngestError
from tasks.llm.params import LLMError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
INTERRUPTED = "interrupted: the stages that finished are stored; run the same command again to go on from them"
# what an entry point reports in one line (exit status 2) instead of a traceback (StoreError: a damaged
# file or catalog, a full or read-only disk, a lock held too long; each names the path and the fix)
USER_ERRORS: tuple[type[BaseException], ...] = (ConfigError, IngestError, PreflightError, LLMError, StoreError,
                                                IndexNotBuilt)


def verbose(cfg: Any) -> bool:
    """Whether a user error should show its traceback: ``verbose=true`` or ``HYDRA_FULL_ERROR=1``."""
    flag = cfg.get("verbose", False) if hasattr(cfg, "get") else False
    return flag is True or os.environ.get("HYDRA_FULL_ERROR") == "1"


def fail(err: BaseException, show_traceback: bool = False) -> NoReturn:
    """End the process on a user error: one line on stderr (after the traceback, if asked), exit status 2."""
    if show_traceback:
        traceback.print_exception(err)
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(f"error: {first}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USER_ERROR)


class WithoutUserErrorTraceback(logging.Filter):
    """Drops the traceback from a log record about a user error (Prefect logs a failed task's and flow's
    exception with one, twice); the message line stays, and :func:`fail` prints the error itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], USER_ERRORS):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_user_error_tracebacks(show_traceback: bool) -> None:
    """Unless a traceback was asked for, keep Prefect's run loggers to one line about a user error."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if not show_traceback and not any(isinstance(f, WithoutUserErrorTraceback) for f in logger.filters):
            logger.addFilter(WithoutUserErrorTraceback())


def fail_before_flow(err: BaseException, cfg: Any, artifacts_dir: str | None) -> NoReturn:
    """:func:`fail` for an error found before the flow starts: the temporary server ``dagrag`` launched early
    (:mod:`flows.runtime.api_server`) is stopped unused, and Hydra's job folder removed, so nothing is left behind."""
    from flows.runtime.api_server import stop_api

    stop_api()
    discard_job_folder(artifacts_dir)
    fail(err, verbose(cfg))


def interrupted() -> NoReturn:
    """End the process after Ctrl-C (SIGINT): one line on stderr, exit status 130. Every stage that finished is in
    the store (each writes atomically), so the same command goes on from them."""
    print(INTERRUPTED, file=sys.stderr, flush=True)
    raise SystemExit(EXIT_INTERRUPTED)


def discard_job_folder(artifacts_dir: str | None) -> None:
    """Remove the folder Hydra made for this job before it started, if it holds only Hydra's own files
    (``.hydra/`` and the job log), then the parents that are left empty, up to ``artifacts_dir``."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return
        hc = HydraConfig.get()
    except Exception:  # noqa: BLE001 - not under Hydra
        return
    out = Path(hc.runtime.output_dir).resolve()
    own = {str(hc.output_subdir), f"{hc.job.name}.log"}
    if not out.is_dir() or any(p.name not in own for p in out.iterdir()):
        return
    shutil.rmtree(out, ignore_errors=True)
    stop = Path(artifacts_dir).resolve() if artifacts_dir else out.parent
    for parent in out.parents:
        if parent == stop or stop not in parent.parents:
            break
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break
