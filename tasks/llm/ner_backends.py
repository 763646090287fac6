"""The ``ner`` stage and the query recogniser, by the configured backend: spaCy (:mod:`tasks.text.ner`) or the
chat model (:mod:`tasks.llm.ner`, ``ner=llm``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.core.code_identity import code_version
from tasks.core.stage import RunContext, stage, wired
from tasks.core.store import ArtifactRef
from tasks.llm import ner as llm_ner
from tasks.llm.client import LLMClient, ledger_rows, make_client
from tasks.llm.params import LLMDryRun, LLMParams, LLMReplyParams, llm_identity
from tasks.text.ner import (
    NERParams,
    SpacyNERParams,
    is_numeric_label,
    load_ner,
    normalize_entity,
    mention_rows,
    spacy_ner_stage,
)


def ner_client(params: NERParams, llm: LLMParams | None, artifacts_dir: str) -> LLMClient | None:
    """The LLM client ``backend=llm`` needs (None for spaCy); a clear error when no LLM is configured."""
    return llm_ner_client(llm, artifacts_dir) if params.backend == "llm" else None


def llm_ner_client(llm: LLMParams | None, artifacts_dir: str) -> LLMClient:
    """The client ``ner=llm`` extracts with; a clear error when no LLM is configured."""
    if llm is None or llm.provider == "none":
        raise ValueError("ner=llm extracts entities with the chat model: configure one with llm=local "
                         "(llm.base_url=...) or llm=openai, or use ner=spacy")
    return make_client(llm, Path(artifacts_dir) / "llm_cache.duckdb")


class QueryRecogniser:
    """Entity surface strings of questions, by the configured backend (the corpus's own NER)."""

    def __init__(self, params: NERParams, llm: LLMParams | None, artifacts_dir: str) -> None:
        self.params = params
        self.client = ner_client(params, llm, artifacts_dir)
        if self.client is None:
            load_ner(params.model, params.matmul)

    def __call__(self, questions: list[str]) -> list[list[tuple[str, str]]]:
        """``(surface, label)`` of every entity in each question, unfiltered."""
        if self.client is None:
            docs = load_ner(self.params.model, self.params.matmul).pipe(questions, batch_size=max(len(questions), 1))
            return [[(e.text, e.label_) for e in doc.ents] for doc in docs]
        spans = llm_ner.llm_recognise(self.client, questions, self.params.keep_numeric, max_empty_fraction=1.0,
                                      stage=llm_ner.QUERY_NER_STAGE).spans
        out: list[list[tuple[str, str]]] = [[] for _ in questions]
        for i, surface, label in zip(spans["text_idx"], spans["surface"], spans["label"]):
            out[i].append((surface, label))
        return out

    def names(self, questions: list[str]) -> list[list[str]]:
        """Normalised entity strings per question, with the corpus's label and length filters."""
        p = self.params
        return [list(dict.fromkeys(n for s, label in ents if (p.keep_numeric or not is_numeric_label(label))
                                   and len(n := normalize_entity(s)) >= p.min_chars))
                for ents in self(questions)]


@dataclass(frozen=True)
class LLMNERParams(LLMReplyParams):
    """The NER stage with the chat model (``ner.backend=llm``): which mentions are kept, the empty-reply limit,
    and what in the ``llm`` group changes a reply (:func:`llm_identity`: never the endpoint or key)."""

    SOURCES = ("ner",)
    keep_numeric: bool
    min_chars: int
    max_empty_fraction: float
    id_col: str = wired()


def ner_params(config: Any, id_col: str) -> "LLMNERParams | SpacyNERParams":
    """The NER stage's params for ``config.ner.backend`` (the chat model's or spaCy's), over ``id_col`` rows: the
    projection a flow hands :func:`ner`, as ``Params.of`` is for one stage."""
    return (LLMNERParams if config.ner.backend == "llm" else SpacyNERParams).of(config, id_col=id_col)


def ner(ctx: RunContext, params: "LLMNERParams | SpacyNERParams", table: ArtifactRef, llm: LLMParams | None = None,
        submit: bool = False):
    """The NER stage these params are for (:func:`ner_params`) over ``table``'s texts; the chat model's needs the
    ``llm`` service (``submit``: as a future)."""
    if isinstance(params, LLMNERParams):
        if llm is None:
            raise TypeError("the LLM NER stage needs the llm group's settings: ner(ctx, params, table, cfg.llm)")
        run, args = llm_ner_stage, (ctx, params, table, llm)
    else:
        run, args = spacy_ner_stage, (ctx, params, table)
    return run.submit(*args) if submit else run(*args)


@stage("ner", params=LLMNERParams)
def llm_ner_stage(ctx: RunContext, params: LLMNERParams, table: ArtifactRef, llm: LLMParams
                  ) -> dict[str, ArtifactRef]:
    """Stage: the mentions of :func:`spacy_ner_stage`, extracted by the chat model ``llm`` (a service: its
    reply-changing settings are in ``params``). Row-incremental likewise; the calls go to the run's ledger."""
    client = llm_ner_client(llm, ctx.artifacts_dir)

    def spans_of(texts: list[str]) -> pd.DataFrame:
        if ctx.llm_dry_run:
            msgs = [llm_ner.ner_messages(t, params.keep_numeric) for t in texts]
            raise LLMDryRun(llm_ner.NER_STAGE, client.dry_run_estimate(msgs, llm.max_tokens))
        return llm_ner.llm_recognise(client, texts, params.keep_numeric, params.max_empty_fraction).spans

    # the prompt, keep_numeric (it changes the prompt) and the model name a row
    row_params = {"backend": "llm", "llm": llm_identity(params), "keep_numeric": params.keep_numeric,
                  "code": code_version(llm_ner.llm_recognise, llm_ner.ner_messages)}
    with ledger_rows(ctx.store, ctx.run_id, client, llm_ner.NER_STAGE):
        return mention_rows(ctx, params, table, spans_of, row_params)
