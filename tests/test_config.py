"""Every YAML file under ``conf/`` composes with Hydra and builds typed params whose fields == its keys."""
from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from flows.runtime.config import TOP_LEVEL_KEYS, Config, ConfigError, check_values, load_config, params_classes
from flows.methods import METHODS
from tasks.core.limits import in_interval, limits_of

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUP_FILES = sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml") if p.parent.name != "experiment")
EXPERIMENTS = sorted(p.stem for p in CONF.glob("experiment/*.yaml"))  # global diffs (``experiment=NAME``)


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
    # every value reaches the params (lists become tuples; a method list left null is every method)
    for key, value in raw[group].items():
        got = getattr(params, key)
        if key == "methods" and value is None:
            value = list(METHODS)
        if dataclasses.is_dataclass(got):  # a nested group (dataset.split): its fields, one by one
            got = dataclasses.asdict(got)
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


def test_a_top_level_key_the_config_lacks_is_refused_with_a_suggestion():
    """Hydra lets ``+artifact_dir=…`` through (the ``+`` adds a key); it would configure nothing."""
    assert set(_compose([])) == TOP_LEVEL_KEYS  # every key conf/config.yaml has is known, and no other
    with pytest.raises(ConfigError, match=r"'artifact_dir' \(did you mean 'artifacts_dir'\?\)"):
        load_config(_compose(["+artifact_dir=/tmp/elsewhere"]))
    with pytest.raises(ConfigError, match=r"unknown top-level key\(s\) 'zzz';"):
        load_config(_compose(["+zzz=1"]))


def test_llm_ner_without_an_llm_fails_before_any_stage_runs():
    with pytest.raises(ConfigError, match="ner=llm .*llm=local"):
        load_config(_compose(["ner=llm"]))
    assert load_config(_compose(["ner=llm", "llm=local"])).ner.backend == "llm"


# ---- types and ranges: every value is checked against its dataclass before any stage runs -----------------

@pytest.mark.parametrize("overrides, message", [
    (["method.alpha=abc"], "method.alpha='abc' is not a float in [0, 1]"),
    (["method.alpha=1.5", "method.steps=0"],
     "method.alpha=1.5 is not a float in [0, 1]; method.steps=0 is not an int in [1, inf)"),
    (["method.top_k=10.0"], "method.top_k=10.0 is not an int in [1, inf)"),
    (["method.rescale=median"], "method.rescale='median' is not one of ['nonzero_mean', 'all_mean']"),  # a Literal
    (["method.walk_dtype=float16"], "method.walk_dtype='float16' is not one of ['float32', 'float64']"),
    (["method.fine_stage=yes"], "method.fine_stage='yes' is not a bool (true or false)"),
    (["method.keep_ratio=0"], "method.keep_ratio=0 is not a float in (0, 1]"),
    (["eval.ks=[2,x]"], "eval.ks=[2, 'x'] is not a list of ints in [1, inf)"),
    (["eval.max_questions=0"], "eval.max_questions=0 is not an int in [1, inf) or null"),
    (["llm=local", "llm.timeout_s=0"], "llm.timeout_s=0 is not a float in (0, inf)"),
    (["embedder.query_runtime=tf"], "embedder.query_runtime='tf' is not one of ['onnxruntime', 'torch']"),
    (["method=bm25", "method.b=nan"], "method.b=nan is not a float in [0, 1]"),
    (["method=hybrid", "method.k=0"], "method.k=0 is not a float in (0, inf)"),
    (["method=hybrid", "method.k=-60"], "method.k=-60 is not a float in (0, inf)"),
    (["method=hybrid", "method.dense_depth=0", "method.bm25_weight=-1"],
     "method.dense_depth=0 is not an int in [1, inf); method.bm25_weight=-1 is not a float in [0, inf)"),
    (["method=archrag", "method.k_per_layer=[5,-1]"], "method.k_per_layer=[5, -1] is not a list of ints in [0, inf)"),
    (["dataset=jsonl"], "dataset.path must be set: add dataset.path=..."),
])
def test_a_bad_value_is_named_with_what_is_allowed(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(_compose(overrides))
    assert str(err.value) == message


def test_values_hydra_types_loosely_are_accepted():
    conf = load_config(_compose(["method.alpha=1", "eval.ks=5", "dataset=hipporag", "dataset.name=2021",
                                 "eval.max_questions=null"]))
    assert conf.method.alpha == 1 and conf.eval.ks == (5,) and conf.eval.max_questions is None
    assert conf.dataset.name == "2021"  # Hydra reads 2021 as an int; the field is a string
    assert load_config(_compose(["method=archrag", "method.k_per_layer=3"])).method.k_per_layer == (3,)


def test_a_dataclass_check_still_runs_and_names_its_group():
    with pytest.raises(ConfigError, match=r"^method: need 2 <= segment_min <= segment_avg"):
        load_config(_compose(["method=erarag", "method.segment_min=11"]))
    with pytest.raises(ConfigError, match=r"^method: dense_weight \+ bm25_weight must be > 0"):
        load_config(_compose(["method=hybrid", "method.dense_weight=0", "method.bm25_weight=0"]))


def test_every_default_lies_within_its_own_limits():
    """Limits are field metadata; a default outside its limit would refuse a config nobody changed."""
    checked = 0
    for group, classes in params_classes().items():
        for cls in classes:
            defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
            for key, limit in limits_of(cls).items():
                assert isinstance(limit, tuple) or in_interval(0.5, limit) in (True, False), (cls.__name__, key)
            check_values(cls, group, {k: v for k, v in defaults.items() if k in limits_of(cls)})  # raises if not
            checked += len(limits_of(cls))
    assert checked > 200  # every method's, every group's


def test_in_interval_ends():
    assert in_interval(0, "[0, 1]") and in_interval(1, "[0, 1]") and not in_interval(1.01, "[0, 1]")
    assert not in_interval(0, "(0, inf)") and in_interval(1e-9, "(0, inf)") and in_interval(1e300, "[1, inf)")
    assert not in_interval(1, "(0, 1)") and not in_interval(float("nan"), "[-inf, inf]")
    with pytest.raises(ValueError):
        in_interval(0, "0..1")


def _experiment_keys(method: str, experiment: str) -> dict:
    """The method keys an experiment sets: its global file's and its per-method file's, where one exists."""
    keys = dict(_yaml("experiment", experiment).get("method") or {})
    per_method = CONF / "experiment_method" / experiment / f"{method}.yaml"
    if per_method.exists():
        keys.update(OmegaConf.to_container(OmegaConf.load(per_method))["method"])
    return keys


@pytest.mark.parametrize("method", ["zoomrag", "linearrag", "serag"])
def test_beyond_paper_experiment_changes_exactly_its_keys(method):
    assert {"paper", "beyond_paper"} <= set(EXPERIMENTS)
    paper = load_config(_compose([f"method={method}"]))
    assert paper == load_config(_compose([f"method={method}", "experiment=paper"]))  # the paper is the default
    beyond = load_config(_compose([f"method={method}", "experiment=beyond_paper"]))
    keys = _experiment_keys(method, "beyond_paper")
    assert {"graph_linking", "query_linking"} <= set(keys)
    changed = {f.name for f in dataclasses.fields(paper.method)
               if getattr(paper.method, f.name) != getattr(beyond.method, f.name)}
    assert changed == set(keys)
    assert all(getattr(beyond.method, k) == v for k, v in keys.items())
    assert (paper.method.graph_linking, paper.method.query_linking) == ("ner", "ner")


@pytest.mark.parametrize("method", ["dense", "bm25", "hybrid", "archrag", "erarag"])
def test_beyond_paper_experiment_is_the_paper_for_other_methods_under_its_label(method):
    paper = load_config(_compose([f"method={method}"]))
    beyond = load_config(_compose([f"method={method}", "experiment=beyond_paper"]))
    assert beyond.method == paper.method and beyond.embedder == paper.embedder and beyond.ner == paper.ner
    assert (paper.eval.experiment, beyond.eval.experiment) == ("paper", "beyond_paper")
    assert dataclasses.replace(beyond.eval, experiment="paper") == paper.eval
    with pytest.raises(ConfigError, match="apply to method=zoomrag, linearrag and serag only"):
        load_config(_compose([f"method={method}", "+method.graph_linking=gazetteer"]))


def test_the_three_beyond_paper_parts_link_entities_the_same_way():
    from tasks.text.linking import LinkingParams

    linking = {f.name for f in dataclasses.fields(LinkingParams)}
    parts = [{k: v for k, v in _experiment_keys(m, "beyond_paper").items() if k in linking}
             for m in ("zoomrag", "linearrag", "serag")]
    assert parts[0] == parts[1] == parts[2] and parts[0]["graph_linking"] == "gazetteer"


def test_title_walk_needs_the_gazetteer_graph():
    with pytest.raises(ConfigError, match="graph_linking=gazetteer"):
        load_config(_compose(["method=linearrag", "method.title_edge_weight=5"]))


def test_relation_gate_needs_the_title_walk():
    with pytest.raises(ConfigError, match="relation_gate_temperature > 0 gates the title walk"):
        load_config(_compose(["method=zoomrag", "method.relation_gate_temperature=0.5"]))
    with pytest.raises(ConfigError, match="relation_gate_temperature"):
        load_config(_compose(["method=zoomrag", "method.relation_gate_temperature=-1"]))
    conf = load_config(_compose(["method=zoomrag", "experiment=beyond_paper", "method.relation_gate_temperature=0.5"]))
    assert conf.method.relation_gate_temperature == 0.5


@pytest.mark.parametrize("method", ["linearrag", "zoomrag"])
def test_lowercase_name_weight_is_part_of_the_title_walk(method):
    with pytest.raises(ConfigError, match="graph_linking=gazetteer"):
        load_config(_compose([f"method={method}", "method.lowercase_name_weight=0.1"]))
    conf = load_config(_compose([f"method={method}", "experiment=beyond_paper", "method.lowercase_name_weight=0.1"]))
    assert conf.method.title_walk and conf.method.lowercase_name_weight == 0.1


def test_a_method_is_declared_once_and_every_list_of_methods_derives_from_it():
    """flows/methods/<name>.py's METHOD is the method; the registry lists it once; compare, scale and growth take every
    method by default, in the registry's order; a name not in the registry is refused with the list."""
    from flows.methods import METHODS, NAMES

    flows_dir = Path(__file__).resolve().parents[1] / "flows" / "methods"
    declared = sorted(p.stem for p in flows_dir.glob("*.py") if "\nMETHOD = Method(" in p.read_text())
    assert declared == sorted(NAMES) == sorted(METHODS)
    assert all(METHODS[n].name == n for n in NAMES)
    conf = load_config(_compose([]))
    assert conf.compare.methods == conf.scale.methods == conf.growth.methods == NAMES
    assert load_config(_compose(["compare.methods=[bm25,dense]"])).compare.methods == ("bm25", "dense")
    with pytest.raises(ConfigError, match=r"compare.methods=\['graphrag'\] is not a list of one of \['dense'"):
        load_config(_compose(["compare.methods=[graphrag]"]))


def _in_fresh_python(code: str) -> None:
    """Run ``code`` in a new interpreter (nothing imported yet) from the repository root; it must print ``ok``."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_config_check_imports_only_the_method_it_checks():
    """The limits table is keyed by class path: checking a dense config imports no other method's module
    (bm25s and numba, SeRAG's, ArchRAG's stages), and an out-of-range value of a method is still named."""
    code = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "from omegaconf import OmegaConf\n"
        "from flows.runtime.config import ConfigError, load_config\n"
        f"with initialize_config_dir(config_dir={str(CONF)!r}, version_base='1.3'):\n"
        "    dense = compose('config', overrides=['method=dense'])\n"
        "    arch = compose('config', overrides=['method=archrag', 'method.clustering=kmeans'])\n"
        "assert load_config(OmegaConf.to_container(dense, resolve=True)).method.name == 'dense'\n"
        "heavy = {'bm25s', 'numba', 'tasks.methods.bm25.stages', 'tasks.methods.serag.stages', 'tasks.methods.erarag.stages',\n"
        "         'tasks.methods.archrag.stages', 'tasks.methods.zoomrag.stages', 'tasks.methods.linearrag.algorithm'}\n"
        "assert not heavy & set(sys.modules), sorted(heavy & set(sys.modules))\n"
        "try:\n"
        "    load_config(OmegaConf.to_container(arch, resolve=True))\n"
        "except ConfigError as err:\n"
        "    assert \"method.clustering='kmeans' is not one of ['leiden', 'spectral']\" in str(err), err\n"
        "    print('ok')\n")
    _in_fresh_python(code)


def test_a_command_imports_its_own_method_only_and_names_its_stage_tasks():
    """``METHODS[name]`` imports ``flows.methods.<name>`` when first read: a dense update does not import bm25s and
    numba, nor ArchRAG's modules; each method still maps to its own flow
    module, and the stage tasks it imports get their readable task-run names."""
    code = (
        "import sys, flows.commands.update, flows.commands.evaluate, flows.commands.index, flows.commands.benchmark\n"
        "from flows.runtime import observe\n"
        "from flows.methods import METHODS\n"
        "assert not {'flows.methods.dense', 'flows.methods.archrag', 'bm25s', 'numba'} & set(sys.modules), sorted(sys.modules)\n"
        "dense = METHODS['dense']\n"
        "assert 'flows.methods.dense' in sys.modules and not {'flows.methods.archrag', 'numba'} & set(sys.modules)\n"
        "assert dense.params.__name__ == 'DenseParams' and dense.index is sys.modules['flows.methods.dense'].index\n"
        "assert observe.name_task_runs() > 0 and observe.name_task_runs() == 0\n"
        "arch = METHODS['archrag']\n"
        "assert arch.answer is sys.modules['flows.methods.archrag'].answer and METHODS['zoomrag'].evidence_units\n"
        "assert observe.name_task_runs() > 0\n"
        "print('ok')\n")
    _in_fresh_python(code)


def test_a_command_line_may_choose_a_defaults_only_group():
    """``experiment=beyond_paper`` names a config group, not a key of the composed config: the check of a command
    line's top-level keys lets it through, and still refuses a mistyped key."""
    from flows.runtime.config import ConfigError, DEFAULTS_ONLY_GROUPS, check_top_level_keys, override_keys

    groups = {p.name for p in (Path(__file__).resolve().parents[1] / "conf").iterdir() if p.is_dir()}
    assert DEFAULTS_ONLY_GROUPS <= groups
    check_top_level_keys(override_keys(["method=zoomrag", "experiment=beyond_paper", "dataset.name=x"]))
    with pytest.raises(ConfigError, match="did you mean 'method'"):
        check_top_level_keys(override_keys(["experiment=beyond_paper", "methd=zoomrag"]))
