"""Open a built index and ask it questions: the one loading path of ``dagrag query``, ``dagrag serve`` and Python.

>>> from flows.serving import open_index
>>> index = open_index("method=bm25", "dataset=sample")          # the overrides that built it
>>> [p.title for p in index.retrieve(["Who founded the Vell Guild?"], k=3)[0]]

:func:`open_index` composes ``conf/`` with the overrides (as a command does), then *resolves* the index: the
method's index DAG is walked with every stage looked up in the catalog by its fingerprint and none computed
(:attr:`tasks.core.stage.RunContext.resolve_only`): the ``index`` flow's own :func:`flows.runtime.pipeline.build_index`,
(:func:`flows.runtime.dag.build_index`), its stages called as plain functions (:class:`tasks.core.stage.StageTask`: no Prefect run, no server). The
refs it finds are exactly the ones ``dagrag index`` with the same overrides would reuse, so a retriever opened
here is the one ``dagrag evaluate`` ranks with. A stage that is missing raises :class:`IndexNotBuilt`, whose
message is the ``dagrag index …`` command that builds it; ``build=True`` builds it instead (a flow run).
"""
from __future__ import annotations

import datetime as dt
import functools
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from flows.runtime.config import Config, load_config
from flows.methods import METHODS
from flows.runtime.preflight import IndexNotBuilt, NoLLM
from tasks.data.corpus import citation, lineage_citation
from tasks.data.ingest import dataset_label
from tasks.core.stage import RunContext, StageNotBuilt
from tasks.core.files import CATALOG
from tasks.core.hashing import short_hash
from tasks.core.memory import release_arrow_memory
from tasks.core.store import ArtifactRef, Store
from tasks.eval.retrieve import Hits


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# overrides that configure the serving side only: they do not name an index, so they are left out of the
# `dagrag index …` command an IndexNotBuilt error prints
SERVING_GROUPS = ("query.", "serve.", "loadtest.", "eval.", "llm", "verbose", "report.", "hydra.")


# ----------------------------------------------------------------------------- configuration

def compose(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """``conf/`` composed with command-line style overrides → the resolved config (a plain dict)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from flows.runtime.config import ConfigError

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose("config", overrides=list(overrides))
    except Exception as err:  # Hydra's own override and missing-group errors
        if type(err).__module__.startswith(("hydra", "omegaconf")):
            raise ConfigError(str(err).strip().splitlines()[0]) from None
        raise
    return OmegaConf.to_container(cfg, resolve=True)


def build_command(overrides: Sequence[str]) -> str:
    """The ``dagrag index …`` command line that builds the index these overrides name."""
    import shlex

    kept = [o for o in overrides if not o.lstrip("+~").startswith(SERVING_GROUPS)]
    return " ".join(["dagrag", "index", *(shlex.quote(o) for o in kept)])


# ----------------------------------------------------------------------------- what a question gets back

@dataclass(frozen=True)
class Passage:
    """One ranked passage: its id, title and text, the method's score and its rank (1 = best), and its lineage
    (``document``, ``source``, ``page``, ``headings``, ``span``, ``citation``; None: the index has none)."""

    doc_id: str
    title: str
    text: str
    score: float
    rank: int
    lineage: dict | None = None

    @property
    def citation(self) -> str:
        """How to cite this passage (:func:`tasks.data.corpus.citation`, the one rule)."""
        return lineage_citation(self.lineage, self.title)

    def to_dict(self) -> dict[str, Any]:
        return {"doc_id": self.doc_id, "title": self.title, "text": self.text, "score": self.score,
                "rank": self.rank, "lineage": self.lineage}


def by_document(passages: Sequence[Passage]) -> list[dict[str, Any]]:
    """Passages grouped by the document they were cut from, documents ranked by their best passage (its score
    and rank), each with its passages in rank order (``group=document``)."""
    groups: dict[str, dict[str, Any]] = {}
    for p in passages:
        lineage = p.lineage or {}
        key = lineage.get("document") or p.doc_id
        if key not in groups:
            groups[key] = {"document": key, "title": p.title, "source": lineage.get("source"),
                           "citation": citation(lineage.get("source"), p.title, None, []), "score": p.score,
                           "rank": len(groups) + 1, "passages": []}
        groups[key]["passages"].append(p.to_dict())
    return list(groups.values())


class Ranked(list):
    """A question's passages, best first (a ``list[Passage]``), with the question and the method's own trace:
    ZoomRAG's kept chunks and seed entities, LinearRAG's activated entities, ArchRAG's communities, …"""

    def __init__(self, question: str, passages: Sequence[Passage], trace: Mapping[str, Any] | None,
                 group: str | None = None) -> None:
        super().__init__(passages)
        self.question = question
        self.trace: dict[str, Any] = plain(dict(trace or {}))
        self.group = group  # "document": to_dict also gives the passages grouped by document

    @property
    def documents(self) -> list[dict[str, Any]]:
        """The passages grouped by their document, best document first (:func:`by_document`)."""
        return by_document(self)

    def to_dict(self) -> dict[str, Any]:
        out = {"question": self.question, "results": [p.to_dict() for p in self], "trace": self.trace}
        if self.group == "document":
            out["documents"] = self.documents
        return out


@dataclass(frozen=True)
class Answer:
    """An LLM's answer to one question, with the passages (or the method's own context) it was given."""

    question: str
    answer: str
    raw: str
    context: list[str]
    passages: Ranked

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "raw": self.raw, "context": self.context,
                "results": [p.to_dict() for p in self.passages], "trace": self.passages.trace}


# the documents table's lineage columns a passage carries (tasks.data.ingest.LINEAGE_COLUMNS)
LINEAGE = ["document", "source", "page", "headings", "char_start", "char_end"]
GROUPS = (None, "passage", "document")


def check_group(group: str | None) -> None:
    """``group`` is a known grouping (None or "passage": passages; "document": grouped by document)."""
    if group not in GROUPS:
        raise ValueError(f"group must be 'passage' or 'document', got {group!r}")


def plain(value: Any) -> Any:
    """A trace value as JSON data: numpy scalars and arrays become Python numbers and lists."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass(frozen=True)
class IndexInfo:
    """What ``GET /index`` shows: which index is served, built when, from which settings."""

    method: str
    dataset: str
    fingerprint: str          # a hash of the fingerprints of the stages the retriever reads
    built_at: str             # when the newest of those stages was written
    n_documents: int
    artifacts_dir: str
    config: dict[str, Any]    # the method's, embedder's and NER's settings
    loaded_at: str = field(default_factory=lambda: dt.datetime.now().isoformat(timespec="seconds"))
    load_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------- the index

def resolve(conf: Config, overrides: Sequence[str] = ()) -> tuple[dict[str, ArtifactRef], dict[str, ArtifactRef]]:
    """(data refs, index refs) of the built index ``conf`` names, from the catalog alone; nothing computed."""
    root = Path(conf.artifacts_dir).resolve()
    how = f"build it with: {build_command(overrides)}"
    if not (root / CATALOG).is_file():
        raise IndexNotBuilt(f"no index in {root} (no {CATALOG} there); {how}")
    from flows.runtime.dag import build_index

    ctx = RunContext(str(root), dataset_label(conf.dataset), "open-index", resolve_only=True)
    try:
        data, index, _ = build_index(ctx, conf)  # the index flow's own stages, each resolved, none computed
    except StageNotBuilt as missing:
        if missing.damage:
            raise IndexNotBuilt(f"the {conf.method.name} index on {ctx.dataset} is damaged (stage {missing.stage!r}: "
                                f"{missing.damage}); rebuild it with: {build_command(overrides)}") from None
        raise IndexNotBuilt(f"the {conf.method.name} index on {ctx.dataset} with these settings is not built "
                            f"(stage {missing.stage!r} is not in {root / CATALOG}); {how}") from None
    return data, index


def index_fingerprint(data: Mapping[str, ArtifactRef], refs: Mapping[str, ArtifactRef]) -> str:
    """One hash of the fingerprints of what the retriever reads: the index's stage outputs and the documents."""
    used = {**refs, "documents": data["documents"]}
    return short_hash(sorted((k, r.fp) for k, r in used.items()))


def built_at(store: Store, refs: Mapping[str, ArtifactRef]) -> str:
    """When the newest of these stage outputs was recorded."""
    fps = sorted({r.fp for r in refs.values()})
    if not fps:
        return ""
    marks = ",".join("?" * len(fps))
    frame = store.query(f"SELECT max(created_at) AS t FROM stages WHERE fp IN ({marks})", fps)
    value = frame["t"].iloc[0]
    return "" if pd.isna(value) else pd.Timestamp(value).isoformat(timespec="seconds")


class Index:
    """A built index, opened: :meth:`retrieve` (and :meth:`answer` with an LLM) over the method's retriever.

    ``retriever.search`` is not safe to call from two threads at once; :meth:`search` serialises callers
    (``dagrag serve`` calls it from one worker anyway).
    """

    def __init__(self, conf: Config, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef],
                 retriever: Any, load_seconds: float) -> None:
        self.conf, self.data, self.refs, self.retriever = conf, data, index, retriever
        docs = Store.read(data["documents"])
        row = pd.Series(np.arange(len(docs)), index=pd.Index(docs["doc_id"]))
        self._title = docs["title"].to_numpy(dtype=object)
        self._text = docs["text"].to_numpy(dtype=object)
        self._lineage = docs[LINEAGE].reset_index(drop=True) if set(LINEAGE) <= set(docs.columns) else None
        # the retriever's doc positions → rows of the documents table, once
        self._doc_rows = row.loc[retriever.doc_ids].to_numpy()
        self._lock = threading.Lock()
        raw = conf.raw
        self.info = IndexInfo(
            method=conf.method.name, dataset=dataset_label(conf.dataset),
            fingerprint=index_fingerprint(data, index),
            built_at=built_at(Store(conf.artifacts_dir), {**index, "documents": data["documents"]}),
            n_documents=len(docs), artifacts_dir=str(Path(conf.artifacts_dir).resolve()),
            config={k: raw.get(k) for k in ("method", "dataset", "embedder", "ner")}, load_seconds=round(load_seconds, 3))

    @property
    def default_k(self) -> int:
        return int(self.conf.method.top_k)

    def search(self, questions: list[str], k: int) -> Hits:
        """The retriever's batched ``search`` (one call for the whole batch), one caller at a time."""
        with self._lock:
            return self.retriever.search(list(questions), k)

    def ranked(self, questions: Sequence[str], hits: Hits) -> list[Ranked]:
        """A batch's :class:`Hits` → one :class:`Ranked` per question."""
        out = []
        for i, question in enumerate(questions):
            keep = hits.doc_idx[i] >= 0
            rows = self._doc_rows[hits.doc_idx[i][keep]]
            scores = hits.scores[i][keep]
            passages = [Passage(str(self.retriever.doc_ids[d]), str(self._title[r]), str(self._text[r]),
                                float(s), rank, self.lineage(r))
                        for rank, (d, r, s) in enumerate(zip(hits.doc_idx[i][keep], rows, scores), start=1)]
            out.append(Ranked(question, passages, hits.trace[i] if hits.trace else None))
        return out

    def lineage(self, row: int) -> dict[str, Any] | None:
        """The lineage of the documents table's row ``row`` as ``Passage.lineage`` gives it."""
        if self._lineage is None:
            return None
        document, source, page, headings, start, end = self._lineage.iloc[int(row)]
        source = None if source is None or pd.isna(source) else str(source)
        page = None if page is None or pd.isna(page) else int(page)
        headings = [str(h) for h in (headings if headings is not None else [])]
        span = None if start is None or pd.isna(start) else [int(start), int(end)]
        return {"document": str(document), "source": source, "page": page, "headings": headings, "span": span,
                "citation": citation(source, str(self._title[row]), page, headings)}

    def retrieve(self, questions: Sequence[str] | str, k: int | None = None,
                 group: str | None = None) -> list[Ranked]:
        """Ranked passages for each question (one batched search), ``k`` deep (default: ``method.top_k``);
        ``group="document"`` also groups them by document (``Ranked.documents``)."""
        batch = [questions] if isinstance(questions, str) else list(questions)
        check_questions(batch)
        check_group(group)
        k = self.default_k if k is None else int(k)
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if not batch:
            return []
        ranked = self.ranked(batch, self.search(batch, k))
        for r in ranked:
            r.group = group
        return ranked

    def llm_client(self):  # -> tasks.llm.client.LLMClient
        """The configured LLM (cache, ledger and retries of :mod:`tasks.llm`), or an error naming the setting."""
        client = _client(self.conf.llm, str(Path(self.conf.artifacts_dir).resolve() / "llm_cache.duckdb"))
        if client is None:
            raise NoLLM("no LLM is configured (llm=none): add llm=local llm.base_url=http://HOST:PORT/v1 "
                        "or llm=openai (key from OPENAI_API_KEY) to answer")
        return client

    def answer(self, questions: Sequence[str] | str, k: int | None = None) -> list[Answer]:
        """Retrieve, then answer each question with the configured LLM (:meth:`answer_ranked`)."""
        self.llm_client()  # no LLM: refused before anything is retrieved
        return self.answer_ranked(self.retrieve(questions, k))

    def answer_ranked(self, ranked: list[Ranked]) -> list[Answer]:
        """Answer each retrieved question with the configured LLM from what was retrieved: the top
        ``eval.context_passages`` passages (ZoomRAG: its kept chunks) within ``eval.max_context_tokens``, through
        the shared reader prompt; a method with its own generation (ArchRAG's adaptive filtering) uses it."""
        client = self.llm_client()
        if not ranked:
            return []
        own = METHODS[self.conf.method.name].answer
        if own is not None:
            predictions, contexts = self._own_answers(own, client, ranked)
        else:
            from tasks.llm.generate import extract_answer, read

            contexts = reader_contexts(ranked, self.conf.eval.context_passages)
            replies = read(client, [r.question for r in ranked], contexts, self.conf.eval.max_context_tokens,
                           stage="answer")
            predictions = [(extract_answer(x), x or "") for x in replies]
        return [Answer(r.question, a, raw, c, r) for r, (a, raw), c in zip(ranked, predictions, contexts)]

    def _own_answers(self, own: Any, client: Any, ranked: list[Ranked]) -> tuple[list[tuple[str, str]], list[list[str]]]:
        """A method's own generation (``Method.answer``) over these questions and their traces."""
        import json

        qids = [f"q{i}" for i in range(len(ranked))]
        questions = pd.DataFrame({"qid": qids, "question": [r.question for r in ranked],
                                  "answers": [[] for _ in ranked]})
        traces = pd.DataFrame([{"qid": q, **{k: json.dumps(v) if isinstance(v, (list, dict)) else v
                                             for k, v in r.trace.items()}} for q, r in zip(qids, ranked)])
        table, _ = own(client, self.data, self.refs, self.conf, questions, traces, False)
        return list(zip(table["prediction"], table["raw"])), [[] for _ in ranked]


@functools.lru_cache(maxsize=4)
def _client(llm: Any, cache_path: str):
    from tasks.llm.client import make_client

    return make_client(llm, cache_path)


def reader_contexts(ranked: list[Ranked], n_passages: int) -> list[list[str]]:
    """What the shared reader is given for each question: ``evaluate``'s own rule
    (:func:`tasks.llm.generate.contexts_for`) over these passages and traces."""
    import json

    from tasks.llm.generate import contexts_for

    qids = [f"q{i}" for i in range(len(ranked))]
    hits = pd.DataFrame([(q, p.rank, p.doc_id) for q, r in zip(qids, ranked) for p in r],
                        columns=["qid", "rank", "doc_id"])
    docs = pd.DataFrame([(p.doc_id, p.title, p.text) for r in ranked for p in r],
                        columns=["doc_id", "title", "text"]).drop_duplicates("doc_id")
    traces = pd.DataFrame({"qid": qids, "kept_chunks": [json.dumps(r.trace.get("kept_chunks") or []) for r in ranked]})
    contexts = contexts_for(hits, docs, traces, n_passages)
    return [contexts.get(q, []) for q in qids]


def check_questions(questions: Sequence[Any]) -> None:
    """Every question is a non-empty string."""
    for i, q in enumerate(questions):
        if not isinstance(q, str):
            raise ValueError(f"question {i + 1} is a {type(q).__name__}, not a string")
        if not q.strip():
            raise ValueError(f"question {i + 1} is empty")


def open_index(*overrides: str, config: Mapping[str, Any] | None = None, build: bool = False) -> Index:
    """Open the index that ``dagrag index <overrides>`` builds (or ``config``, an already resolved one).

    Raises :class:`IndexNotBuilt` (its message: the command that builds it) when it is not in the store, unless
    ``build=True``, which builds it first as an ``index`` flow run. Nothing else is computed or written.
    """
    cfg = dict(config) if config is not None else compose(overrides)
    conf = load_config(cfg)
    if config is not None and not overrides:
        overrides = tuple(config_overrides())
    t0 = time.perf_counter()
    try:
        data, refs = resolve(conf, overrides)
    except IndexNotBuilt:
        if not build:
            raise
        from flows.runtime.dag import plan_run

        print(f"building the index first: {plan_run(conf).text()}", file=sys.stderr, flush=True)  # dagrag plan's
        run_index_flow(cfg)
        data, refs = resolve(conf, overrides)
    from flows.runtime.dag import spacy_without_torch

    spacy_without_torch(cfg.get("ner") or {})  # the query NER's spaCy without torch's 1.4 s import, as commands do
    retriever = METHODS[conf.method.name].retriever(data, refs, conf)
    release_arrow_memory()
    return Index(conf, data, refs, retriever, time.perf_counter() - t0)


def run_index_flow(cfg: Mapping[str, Any]) -> None:
    """Build the index ``cfg`` names: the ``index`` flow, run as ``dagrag index`` runs it."""
    from flows.runtime.api_server import ensure_api
    from flows.runtime.config import with_runner
    from flows.runtime.pipeline import index_flow

    ensure_api()
    with_runner(index_flow, cfg)(dict(cfg))


def config_overrides() -> list[str]:
    """The overrides of this Hydra job as typed, when it is one (for the build command an error prints)."""
    from flows.runtime.provenance import job_overrides

    return [f"{k}={v}" for k, v in job_overrides().items()]
