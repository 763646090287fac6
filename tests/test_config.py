"""Every YAML file under ``conf/`` composes with Hydra and builds typed params whose fields == its keys."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from flows.config import Config, ConfigError, load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUP_FILES = sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml"))


def _compose(overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=True)


def _yaml(group: str, name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"))


def _overrides(group: str, name: str) -> list[str]:
    """Select the file, fill its mandatory (``???``) values, and add what it requires of other groups."""
    missing = [k for k, v in _yaml(group, name).items() if v == "???"]
    needs = ["llm=local"] if (group, name) == ("ner", "llm") else []
    return [f"{group}={name}"] + [f"{group}.{k}=x" for k in missing] + needs


def test_every_group_is_covered():
    groups = {g for g, _ in GROUP_FILES}
    assert {"dataset", "method", "embedder", "ner", "llm", "runner", "eval", "benchmark"} <= groups
    assert {f.name for f in dataclasses.fields(Config)} >= groups


def test_default_config_builds():
    config = load_config(_compose([]))
    assert isinstance(config, Config)
    assert config.dataset.kind == config.raw["dataset"]["kind"] and config.method.name == config.raw["method"]["name"]
    assert config.eval.ks == tuple(config.raw["eval"]["ks"])


@pytest.mark.parametrize("group, name", GROUP_FILES, ids=[f"{g}={n}" for g, n in GROUP_FILES])
def test_group_file_composes_and_matches_its_params(group, name):
    raw = _compose(_overrides(group, name))
    config = load_config(raw)
    params = getattr(config, group)
    assert dataclasses.is_dataclass(params)
    keys = set(_yaml(group, name))
    fields = {f.name for f in dataclasses.fields(params)}
    assert keys == fields, f"{group}/{name}.yaml: only in YAML {sorted(keys - fields)}, " \
                           f"only in {type(params).__name__} {sorted(fields - keys)}"
    # every value reaches the params (lists become tuples)
    for key, value in raw[group].items():
        got = getattr(params, key)
        assert got == (tuple(value) if isinstance(value, list) else value), (group, key)


def test_unknown_override_key_fails_at_compose_time():
    with pytest.raises(ConfigCompositionException, match="method.nonexistent"):
        _compose(["method.nonexistent=1"])
    with pytest.raises(ConfigCompositionException):
        _compose(["method=no_such_method"])


def test_load_config_rejects_bad_groups():
    base = _compose([])
    bad = copy.deepcopy(base)
    bad["method"]["nonexistent"] = 1
    with pytest.raises(ConfigError, match="nonexistent"):
        load_config(bad)
    bad = copy.deepcopy(base)
    bad["method"]["name"] = "no_such_method"
    with pytest.raises(ConfigError, match="method.name"):
        load_config(bad)
    bad = copy.deepcopy(base)
    bad["dataset"]["kind"] = "csv"
    with pytest.raises(ConfigError, match="dataset.kind"):
        load_config(bad)
    bad = copy.deepcopy(base)
    bad["runner"]["extra"] = 3
    with pytest.raises(ConfigError, match="runner"):
        load_config(bad)


def test_llm_ner_without_an_llm_fails_before_any_stage_runs():
    with pytest.raises(ConfigError, match="ner=llm .*llm=local"):
        load_config(_compose(["ner=llm"]))
    assert load_config(_compose(["ner=llm", "llm=local"])).ner.backend == "llm"
