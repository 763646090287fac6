"""The ``ner`` stage and the query recogniser, by the configured backend: spaCy (:mod:`tasks.text.ner`) or the
chat model (:mod:`tasks.llm.ner`, ``ner=llm``)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.core.code_identity import code_version
from tasks.core.row_cache import text_key
from tasks.core.stage import RunContext, input_fps, run_row_stage
from tasks.core.store import ArtifactRef
from tasks.llm import ner as llm_ner
from tasks.llm.client import LLMClient, ledger_rows, make_client
from tasks.llm.params import LLMDryRun, LLMParams, llm_identity
from tasks.text.ner import (
    NERParams,
    entity_mentions,
    is_numeric_label,
    load_ner,
    normalize_entity,
    recognise,
    recognise_windows,
)


def ner_client(params: NERParams, llm: LLMParams | None, artifacts_dir: str) -> LLMClient | None:
    """The LLM client ``backend=llm`` needs (None for spaCy); a clear error when no LLM is configured."""
    if params.backend != "llm":
        return None
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


@task(name="ner", cache_policy=NO_CACHE)
def ner(ctx: RunContext, table: ArtifactRef, id_col: str, params: NERParams,
        llm: LLMParams | None = None) -> dict[str, ArtifactRef]:
    """Stage: entity mentions ``(id, surface, label, start, end, entity)`` of every text in ``table``.

    Row-incremental: the recogniser (spaCy, or the LLM for ``backend=llm``) runs only on texts (by
    content) it has not seen with this model.
    """
    frame = ctx.store.read(table, [id_col, "text"])
    keys = frame["text"].map(text_key)
    client = ner_client(params, llm, ctx.artifacts_dir)

    def spans_of(texts: list[str]) -> pd.DataFrame:
        if client is None:
            return recognise_windows(texts, params)
        if ctx.llm_dry_run:
            msgs = [llm_ner.ner_messages(t, params.keep_numeric) for t in texts]
            raise LLMDryRun(llm_ner.NER_STAGE, client.dry_run_estimate(msgs, llm.max_tokens))
        return llm_ner.llm_recognise(client, texts, params.keep_numeric, params.max_empty_fraction).spans

    def compute_rows(missing: list[str]) -> pa.Table:
        first = frame.assign(key=keys).drop_duplicates("key").set_index("key").loc[missing]
        spans = spans_of(first["text"].tolist())
        grouped = spans.groupby("text_idx")
        lists = {c: grouped[c].apply(list) for c in ["surface", "label", "start", "end"]}
        out = pd.DataFrame({"key": missing})
        for c, s in lists.items():
            out[c] = [s.get(i, []) for i in range(len(missing))]
        return pa.Table.from_pandas(out, preserve_index=False)

    def assemble(rows: pa.Table) -> dict[str, pd.DataFrame]:
        cached = rows.to_pandas().set_index("key")
        spans = cached.loc[keys.tolist()].reset_index(drop=True)
        spans[id_col] = frame[id_col].to_numpy()
        spans = spans.explode(["surface", "label", "start", "end"]).dropna(subset=["surface"])
        spans = spans.rename_axis("text_idx").reset_index()
        mentions = entity_mentions(spans, params).drop(columns="text_idx")
        mentions = mentions.astype({"start": "int32", "end": "int32"})
        return {"mentions": mentions[[id_col, "surface", "label", "start", "end", "entity"]]}

    if client is None:  # not recognise_windows: it changes no row a text under the window gave before (a longer
        # one failed), so every cached row stays valid
        row_params = {"model": params.model, "matmul": params.matmul, "code": code_version(recognise, load_ner)}
    else:  # the prompt, keep_numeric (it changes the prompt) and the model name a row
        row_params = {"backend": "llm", "llm": llm_identity(llm), "keep_numeric": params.keep_numeric,
                      "code": code_version(llm_ner.llm_recognise, llm_ner.ner_messages)}
    with ledger_rows(ctx.store, ctx.run_id, client, llm_ner.NER_STAGE):
        return run_row_stage(ctx, "ner", code_version(ner), params, row_params,
                             input_fps(table=table), keys, compute_rows, "key", assemble)
