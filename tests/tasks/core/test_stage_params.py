"""Every registered stage's params are its fingerprint's config part, and nothing else of the config is.

For each composed config (every method, paper and beyond_paper, and the LLM variants) and every stage
registered with ``@stage`` (tasks.core.stage.STAGES):

* replacing one config leaf by a marker changes the stage's projected params exactly where a field reads that
  leaf, and leaves them equal otherwise;
* changing any fingerprinted field of its params changes its fingerprint; a run setting does not;
* every field that is not wired by a flow reads some leaf of some config (a misspelt name would silently
  keep its default).
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from flows.methods import NAMES as METHOD_NAMES
from flows.runtime.config import load_config
from tasks.core.stage import STAGES, StageParams, stage_fingerprint

ROOT = Path(__file__).resolve().parents[3]
VARIANTS = [(m, "paper", ()) for m in METHOD_NAMES] + [(m, "beyond_paper", ()) for m in METHOD_NAMES] + [
    ("archrag", "paper", ("kg=llm", "llm=openai")),  # the paper's KG extraction and LLM community reports
    ("erarag", "paper", ("llm=local",)),  # LLM summaries
    ("zoomrag", "paper", ("ner=llm", "llm=openai")),  # LLM NER
    ("bm25", "paper", ("dataset=hipporag",)),
    ("bm25", "paper", ("dataset=jsonl", "dataset.path=corpus.jsonl")),
    ("bm25", "paper", ("dataset=folder", "dataset.path=corpus")),
]


def _registered() -> dict[type, object]:
    for m in METHOD_NAMES:
        importlib.import_module(f"flows.methods.{m}")
    importlib.import_module("flows.commands.evaluate")  # the evidence stage
    return dict(STAGES)


@pytest.fixture(scope="module")
def configs():
    out = {}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for method, experiment, extra in VARIANTS:
            raw = compose("config", overrides=[f"method={method}", f"experiment={experiment}", *extra])
            out[(method, experiment, extra)] = load_config(OmegaConf.to_container(raw, resolve=True))
    return out


class Marker:
    """A value no config holds."""

    def __repr__(self) -> str:
        return "<marker>"


def leaves(config):
    """(group name, field name) of every leaf of the config's groups (top-level strings included)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from ((f.name, g.name) for g in dataclasses.fields(value))
        elif f.name != "raw":
            yield (f.name, None)


def with_marker(config, group, name, marker):
    if name is None:
        return dataclasses.replace(config, **{group: marker})
    changed = copy.copy(getattr(config, group))
    object.__setattr__(changed, name, marker)  # validation skipped on purpose: the projection only reads fields
    return dataclasses.replace(config, **{group: changed})


def wiring(cls) -> dict:
    """A value for every wired field (the flows pass them; here any fixed value does)."""
    return {f.name: (f.default if f.default is not dataclasses.MISSING else "wired")
            for f in dataclasses.fields(cls) if f.metadata.get("stage", {}).get("role") == "wired"}


def relevant(cls, config) -> dict | None:
    """The stage's field values from this config, or None where the config lacks a field it needs (another
    method's stage)."""
    try:
        return cls.values_of(config, **wiring(cls))
    except TypeError as err:
        if "has no value" in str(err):
            return None
        raise


def test_stages_are_registered():
    names = {s.name for s in _registered().values()}
    assert {"ingest", "evidence", "chunk", "embed", "ner", "doc_doc_graph", "global_block", "bm25_index",
            "serag_graph", "erarag_hierarchy", "archrag_hierarchy", "archrag_chnsw"} <= names


def test_a_config_leaf_changes_a_stage_params_exactly_where_a_field_reads_it(configs):
    fed: dict[tuple[type, str], int] = {}
    for key, config in configs.items():
        for cls in _registered():
            base = relevant(cls, config)
            if base is None:
                continue
            for group, name in leaves(config):
                marker = Marker()
                got = cls.values_of(with_marker(config, group, name, marker), **wiring(cls))
                reading = {k for k, v in got.items() if v is marker}
                for k in reading:
                    fed[(cls, k)] = fed.get((cls, k), 0) + 1
                rest = {k: v for k, v in got.items() if k not in reading}
                assert rest == {k: v for k, v in base.items() if k not in reading}, (key, cls.__name__, group, name)
    for cls in _registered():
        assert any(relevant(cls, c) is not None for c in configs.values()), f"no config gives {cls.__name__}"
        for f in dataclasses.fields(cls):
            if f.metadata.get("stage", {}).get("role") != "wired":
                assert fed.get((cls, f.name)), f"{cls.__name__}.{f.name} reads no leaf of any config"


def test_a_params_field_changes_the_fingerprint_and_a_run_setting_does_not(configs):
    for cls in _registered():
        config = next(c for c in configs.values() if relevant(cls, c) is not None)
        params = cls.of(config, **wiring(cls))
        fp = stage_fingerprint(params, {"in": "f0"})
        assert stage_fingerprint(params, {"in": "f1"}) != fp
        for f in dataclasses.fields(cls):
            changed = copy.copy(params)
            object.__setattr__(changed, f.name, Marker().__repr__() + f.name)
            same = f.metadata.get("stage", {}).get("role") == "run" or f.name in params.unused()
            assert (stage_fingerprint(changed, {"in": "f0"}) == fp) == same, (cls.__name__, f.name)


def test_a_field_its_values_leave_unread_is_not_fingerprinted(configs):
    """An embed without a template ignores ``doc_template``; ZoomRAG's doc-doc block under the paper's rule (no cap)
    ignores the cap's search settings, and an exact search the inverted file's: each is fingerprinted exactly
    where the stage reads it."""
    from tasks.methods.zoomrag.params import DocDocParams
    from tasks.text.embed import EmbedParams

    config = configs[("zoomrag", "paper", ())]

    def moves(params, **changed) -> bool:
        return stage_fingerprint(dataclasses.replace(params, **changed), {}) != stage_fingerprint(params, {})

    plain, templated = (EmbedParams.of(config, id_col="doc_id", use_template=t) for t in (False, True))
    assert not moves(plain, doc_template="{text}") and moves(templated, doc_template="{text}")
    capped = DocDocParams.of(config)
    assert capped.doc_doc_max_neighbors > 0 and capped.doc_doc_search == "auto"
    paper = dataclasses.replace(capped, doc_doc_max_neighbors=0)
    for name, value in [("doc_doc_stats_sample", 7), ("doc_doc_search", "ivf"), ("doc_doc_exact_max", 9),
                        ("ivf_nlist", 3), ("ivf_nprobe", 2)]:
        assert moves(capped, **{name: value}) and not moves(paper, **{name: value}), name
    exact = dataclasses.replace(capped, doc_doc_search="exact")
    assert not moves(exact, ivf_nlist=3) and not moves(exact, doc_doc_exact_max=9) and moves(exact, doc_doc_stats_sample=7)
    ivf = dataclasses.replace(capped, doc_doc_search="ivf")
    assert moves(ivf, ivf_nlist=3) and not moves(ivf, doc_doc_exact_max=9)


def test_a_stage_refuses_params_of_another_class(tmp_path):
    from tasks.core.stage import RunContext
    from tasks.methods.zoomrag.params import GlobalBlockParams
    from tasks.methods.zoomrag.stages import doc_doc_graph

    with pytest.raises(TypeError, match="takes DocDocParams params, got GlobalBlockParams"):
        doc_doc_graph.fn(RunContext(str(tmp_path), "ds", "r"), GlobalBlockParams(True, True, "nonzero_mean"), None)


def test_no_stage_fingerprints_a_slice_of_its_own():
    """Stages reach the catalog through run_stage / run_row_stage with their params: no hand-written slice."""
    named = re.compile(r"\brun_named_(row_)?stage\(")
    offenders = [str(p.relative_to(ROOT)) for folder in ("tasks", "flows") for p in (ROOT / folder).rglob("*.py")
                 if p.name != "stage.py" and named.search(p.read_text())]
    assert offenders == []
    assert all(issubclass(cls, StageParams) for cls in _registered())
