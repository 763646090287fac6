"""Every command in the ```bash blocks of README.md and docs/**/*.md works as printed, in a new shell, from the
repository root.

Each command is checked without running it: the program exists (``.venv/bin/dagrag`` and its subcommand,
a ``make`` target, ``.venv/bin/prefect server start`` and its flags), every Hydra override names a config
group or key, the config builds (``flows.runtime.config.load_config``), and every ``PREFECT_*`` variable it sets is
a Prefect setting. The quick ones (``dagrag evaluate|index`` with ``method=bm25`` on the generated sample
dataset, no LLM) are then run for real in a subprocess, with ``artifacts_dir`` and ``PREFECT_HOME`` under
a temp dir. The others are listed and skipped with the reason (an LLM endpoint, ``../shared/datasets``, a
user's own files, minutes of work, a long-lived server, an install).

``.venv/bin/dagrag`` is run as it is when the checkout has one (a ``make``-installed checkout); otherwise
as ``python -m flows.cli``, the module that console script calls, and ``test_console_script_entry_point``
checks that pyproject declares exactly that.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from flows.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]  # the README and every page of the docs site
CONF = REPO / "conf"

PLACEHOLDERS = {"[overrides]"}          # the synopsis lines' stand-in for any overrides
HYDRA_FLAGS_OFFLINE = {"-m", "--multirun"}  # checked in-process; any other flag is checked by the CLI itself
CHEAP_METHODS = {"bm25"}               # seconds on the sample dataset (dense embeds: minutes on 2 cores)
CHEAP_PASSAGES = 1000
LAST_LINE = {"evaluate": "metrics", "index": "index", "update": "update", "benchmark": "benchmark"}


@dataclass(frozen=True)
class Command:
    """One command line of a ```bash block of the README or a docs page."""

    line: int                      # 1-based line in its page
    text: str                      # as printed, comment removed
    argv: tuple[str, ...]          # after the leading VAR=value assignments
    env: tuple[tuple[str, str], ...] = ()       # leading VAR=value assignments
    block_env: tuple[str, ...] = ()             # variables exported earlier in the same block
    synopsis: bool = False         # had a placeholder such as [overrides]
    page: str = "README.md"        # the file it is in, relative to the repository root

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


@dataclass
class Plan:
    """What the check decided for one command: the argv to run it with, or why it is not run."""

    run: list[str] | None = None
    before: list[str] | None = None  # run first (dagrag query: the index it opens)
    prefix: str | None = None      # the last line's prefix when it runs (None: a plain answer, exit 0 checked)
    skip: str | None = None
    notes: list[str] = field(default_factory=list)


class ReadmeCommandError(AssertionError):
    """A README command names a program, subcommand, flag, config group or key that does not exist."""


def readme_commands(text: str, page: str = "README.md") -> list[Command]:
    """The command lines of the ```bash blocks (comments stripped, ``\\`` continuations joined)."""
    out: list[Command] = []
    in_block, pending, start, exported = False, "", 0, []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            in_block, exported = stripped == "```bash" and not in_block, []
            continue
        if not in_block:
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line, pending = pending + stripped, ""
        tokens = shlex.split(line, comments=True)
        if not tokens:
            continue
        synopsis = any(t in PLACEHOLDERS for t in tokens)
        tokens = [t for t in tokens if t not in PLACEHOLDERS]
        env = []
        while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
            env.append(tuple(tokens.pop(0).split("=", 1)))
        text_ = " ".join(shlex.quote(t) for t in [*(f"{k}={v}" for k, v in env), *tokens])
        out.append(Command(start, text_, tuple(tokens), tuple(env), tuple(exported), synopsis, page))
        if tokens and tokens[0] == "export":
            exported += [t.split("=", 1)[0] for t in tokens[1:]]
    return out


def dagrag_argv() -> list[str]:
    """How to run ``.venv/bin/dagrag`` here: the script itself when installed, else its module."""
    script = REPO / ".venv" / "bin" / "dagrag"
    return [str(script)] if script.exists() else [sys.executable, "-m", "flows.cli"]


@cache
def prefect_settings() -> frozenset[str]:
    """Every environment variable name Prefect reads as a setting."""
    from prefect.settings import Settings
    from prefect.settings.legacy import _get_valid_setting_names

    return frozenset(_get_valid_setting_names(Settings))


@cache
def prefect_server_start_help() -> str:
    out = subprocess.run([sys.executable, "-m", "prefect", "server", "start", "--help"], capture_output=True,
                         text=True, timeout=120, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (REPO / "Makefile").read_text(), flags=re.M))


def check_env_names(names: list[str], where: str) -> None:
    unknown = [n for n in names if n.startswith("PREFECT_") and n not in prefect_settings()]
    if unknown:
        raise ReadmeCommandError(f"{where}: {unknown} are not Prefect settings")


def composed_configs(overrides: list[str]) -> list[dict]:
    """The resolved config of every job the overrides describe (a sweep expands to its jobs); raises on an
    unknown group, key or malformed override, as the command would."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from omegaconf import OmegaConf

    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for ov in parsed:
        if ov.is_sweep_override():
            if ov.type != OverrideType.CHANGE:
                raise ReadmeCommandError(f"{ov.input_line}: only plain sweeps are checked")
            choices.append([f"{ov.get_key_element()}={v}" for v in ov.sweep_string_iterator()])
        else:
            choices.append([ov.input_line])
    jobs = list(itertools.product(*choices))
    out = []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for job in jobs:
            cfg = compose("config", overrides=list(job))
            out.append(OmegaConf.to_container(cfg, resolve=True))
    return out


def plan_dagrag(cmd: Command, sub: str, args: list[str]) -> Plan:
    from flows.runtime.config import load_config

    if sub not in COMMANDS:
        raise ReadmeCommandError(f"{cmd.where}: `dagrag {sub}` is not a command ({sorted(COMMANDS)})")
    if sub == "schedule":  # its own config (conf/schedule.yaml); it serves until stopped
        return Plan(skip="a long-lived process serving scheduled runs (needs `prefect server start`)")
    questions: list[str] = []
    if sub == "query" and "--" in args:  # the questions after `--` are not overrides
        at = args.index("--")
        args, questions = args[:at], args[at + 1:]
        if not questions:
            raise ReadmeCommandError(f"{cmd.where}: `dagrag query … --` names no question")
    flags = [a for a in args if a.startswith("-")]
    overrides = [a for a in args if not a.startswith("-")]
    other_flags = [f for f in flags if f not in HYDRA_FLAGS_OFFLINE]
    if other_flags:  # the command's own parser decides (nothing runs with --cfg job)
        out = subprocess.run([*dagrag_argv(), sub, *args, "--cfg", "job"], capture_output=True, text=True,
                             timeout=120, cwd=REPO)
        if out.returncode != 0:
            raise ReadmeCommandError(f"{cmd.where}: {cmd.text}\n{out.stderr[-2000:]}")
    try:
        configs = composed_configs(overrides)
        for cfg in configs:
            load_config(cfg)
    except ReadmeCommandError:
        raise
    except Exception as err:  # noqa: BLE001 - Hydra's and the config's own errors, reported with the line
        raise ReadmeCommandError(f"{cmd.where}: {cmd.text}\n{type(err).__name__}: {err}") from err
    cfg = configs[0]
    method, dataset, llm = cfg["method"]["name"], cfg["dataset"], cfg["llm"]["provider"]
    if cmd.synopsis:
        return Plan(skip="a synopsis: [overrides] stands for any overrides")
    if llm != "none":
        return Plan(skip=f"needs an LLM endpoint (llm={llm})")
    if cmd.block_env:
        return Plan(skip=f"needs the environment exported above it ({', '.join(cmd.block_env)})")
    if set(flags) & HYDRA_FLAGS_OFFLINE:
        sweeper = next((o for o in overrides if o.startswith("hydra/sweeper=")), None)
        return Plan(skip=f"an Optuna sweep ({sweeper}: many trials, minutes)" if sweeper else
                    f"a sweep of {len(configs)} jobs (method={method}: minutes)")
    if sub == "report":
        return Plan(skip="reads the evaluate runs of a catalog (made by `dagrag compare` or `dagrag evaluate` first)")
    if sub == "serve":
        return Plan(skip="a long-lived server (runs until stopped; tests/flows/serving/test_serve_http.py runs it)")
    if sub == "mcp":
        return Plan(skip="a long-lived MCP server (runs until stopped; tests/flows/integrations/test_mcp.py runs it)")
    if sub == "loadtest":
        return Plan(skip="minutes of load on every setup's server (needs their indexes)")
    if dataset["kind"] == "hipporag":
        return Plan(skip=f"needs ../shared/datasets ({dataset['name']})")
    if dataset["kind"] != "sample":
        return Plan(skip=f"needs the user's own files (dataset.path={dataset.get('path')})")
    if dataset["n_passages"] > CHEAP_PASSAGES:
        return Plan(skip=f"a long run (dataset.n_passages={dataset['n_passages']})")
    if sub in {"compare", "scale", "growth"}:
        return Plan(skip=f"a long run (dagrag {sub}: every method in turn, minutes on 2 cores)")
    if method not in CHEAP_METHODS or sub not in {"evaluate", "index", "query"}:
        return Plan(skip=f"a long run (dagrag {sub} method={method}: minutes on 2 cores)")
    if sub == "query":  # its index first, in the same artifacts_dir; then the questions
        return Plan(run=[*dagrag_argv(), sub, *args, "--", *questions], before=[*dagrag_argv(), "index", *args],
                    prefix=None if questions else "query")
    return Plan(run=[*dagrag_argv(), sub, *args], prefix=LAST_LINE[sub])


@cache  # once per command: test_readme_command_is_valid and test_readme_command_runs both ask (a failed check is
# not cached, so it raises again)
def plan(cmd: Command) -> Plan:
    """Check ``cmd`` (raises :class:`ReadmeCommandError`) and decide whether it runs here."""
    check_env_names([k for k, _ in cmd.env], f"{cmd.where}")
    argv = list(cmd.argv)
    prog = argv[0]
    if prog == "export":
        check_env_names([a.split("=", 1)[0] for a in argv[1:]], f"{cmd.where}")
        return Plan(skip="shell set-up for the commands after it")
    if prog == "make":
        targets = [a for a in argv[1:] if "=" not in a and not a.startswith("-")]
        missing = sorted(set(targets) - make_targets())
        if missing:
            raise ReadmeCommandError(f"{cmd.where}: no make target {missing}")
        args = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
        if "run" in targets:  # make run ARGS="…" = dagrag evaluate …
            plan_dagrag(cmd, "evaluate", shlex.split(args.get("ARGS", "")))
        return Plan(skip="installs .venv (minutes); `make run` also indexes with the default method")
    if prog == ".venv/bin/dagrag":
        if len(argv) < 2:
            raise ReadmeCommandError(f"{cmd.where}: dagrag needs a command")
        return plan_dagrag(cmd, argv[1], argv[2:])
    if prog == ".venv/bin/python" and argv[1:3] == ["-m", "tasks.data.longdocs"]:  # the development set's builder
        helped = subprocess.run([sys.executable, "-m", "tasks.data.longdocs", "--help"], capture_output=True,
                                text=True, timeout=120, cwd=REPO)
        if helped.returncode != 0:
            raise ReadmeCommandError(f"{cmd.where}: python -m tasks.data.longdocs --help failed: {helped.stderr}")
        return Plan(skip="builds the long-document development set (a minute; reads Debian's PDF manuals where "
                         "installed); tests/tasks/data/test_longdocs.py builds one")
    if prog == ".venv/bin/python" and argv[1:2] == ["-m"] and len(argv) > 2:
        modules = {m: name for name, (m, _) in COMMANDS.items()}
        if argv[2] not in modules:
            raise ReadmeCommandError(f"{cmd.where}: {argv[2]} is not a command module ({sorted(modules)})")
        return plan_dagrag(cmd, modules[argv[2]], argv[3:])
    if prog == ".venv/bin/prefect":
        if argv[1:3] != ["server", "start"]:
            raise ReadmeCommandError(f"{cmd.where}: only `prefect server start` is checked")
        help_text = prefect_server_start_help()
        unknown = [a.split("=")[0] for a in argv[3:] if a.startswith("--") and
                   not re.search(rf"(?<![\w-]){re.escape(a.split('=')[0])}(?![\w-])", help_text)]
        if unknown:
            raise ReadmeCommandError(f"{cmd.where}: prefect server start has no {unknown}")
        return Plan(skip="a long-lived server (runs until stopped)")
    raise ReadmeCommandError(f"{cmd.where}: `{prog}` does not work as printed in a new shell from the "
                             "repository root (use .venv/bin/dagrag, .venv/bin/python, .venv/bin/prefect or make)")


COMMANDS_IN_DOCS = [c for page in PAGES for c in readme_commands(page.read_text(), page.relative_to(REPO).as_posix())]
COMMANDS_IN_README = [c for c in COMMANDS_IN_DOCS if c.page == "README.md"]


def _id(cmd: Command) -> str:
    return f"{cmd.page}:L{cmd.line}:{cmd.text[:70]}"


def test_readme_has_commands_and_a_quick_one():
    assert len(COMMANDS_IN_README) >= 5 and len(COMMANDS_IN_DOCS) >= 50
    runs = [c for c in COMMANDS_IN_README if plan(c).run]
    assert runs, "no README command is quick enough to run: add one on the sample dataset with method=bm25"


@pytest.mark.parametrize("cmd", COMMANDS_IN_DOCS, ids=_id)
def test_readme_command_is_valid(cmd: Command):
    plan(cmd)


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("prefect-home"))


@dataclass
class StoreRuns:
    """Each distinct command line (argv and environment) run once per module, in a fresh store of its own.

    Pages repeat commands (README.md's ``dagrag evaluate method=bm25`` is docs/commands.md's too), and every
    ``dagrag query`` line, like the Python examples, needs the index ``dagrag index method=bm25 dataset=sample``
    builds: a second test of the same line checks the same finished run (its output and its store) instead of
    running it again. A test that goes on to write gets a copy of the store (:meth:`copy`)."""

    root: Path
    done: dict[tuple, tuple[subprocess.CompletedProcess, Path]] = field(default_factory=dict)

    def run(self, argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, Path]:
        """``argv`` with ``artifacts_dir=`` a fresh store (before any ``--``): its finished process and store."""
        # pytest names the running test in the environment (PYTEST_CURRENT_TEST): not part of the command
        key = (tuple(argv), tuple(sorted((k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST")))
        if key not in self.done:
            store = self.root / f"store{len(self.done)}" / "artifacts"
            at = argv.index("--") if "--" in argv else len(argv)
            out = subprocess.run([*argv[:at], f"artifacts_dir={store}", *argv[at:]], capture_output=True, text=True,
                                 timeout=600, cwd=REPO, env=env)
            self.done[key] = out, store
        return self.done[key]

    @staticmethod
    def copy(store: Path, to: Path) -> Path:
        shutil.copytree(store, to)
        return to


@pytest.fixture(scope="module")
def store_runs(tmp_path_factory) -> StoreRuns:
    return StoreRuns(tmp_path_factory.mktemp("runs"))


def command_env(cmd_env: dict[str, str], prefect_home: str) -> dict[str, str]:
    """A new shell's environment for a README command: no API named (the command starts its own temporary
    Prefect server), Prefect's home under the test's temp dir."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(cmd_env, PREFECT_HOME=prefect_home)
    return env


@pytest.mark.parametrize("cmd", COMMANDS_IN_DOCS, ids=_id)
def test_readme_command_runs(cmd: Command, tmp_path, prefect_home, store_runs):
    p = plan(cmd)
    if p.run is None:
        pytest.skip(p.skip)
    env = command_env(dict(cmd.env), prefect_home)
    run = list(p.run)
    at = run.index("--") if "--" in run else len(run)
    if p.before:  # the index it opens, built once for every line that needs it; a copy, since a query may write
        first, built = store_runs.run(p.before, env)
        assert first.returncode == 0, first.stderr[-3000:]
        store = StoreRuns.copy(built, tmp_path / "artifacts")
        out = subprocess.run([*run[:at], f"artifacts_dir={store}", *run[at:]], capture_output=True, text=True,
                             timeout=600, cwd=REPO, env=env)
    else:
        out, store = store_runs.run(run, env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    if p.prefix is None:  # dagrag query: one block (or JSON line) per question, every one answered
        asked = run[at + 1:]
        jsonl = "query.format=jsonl" in run
        shown = [json.loads(x)["question"] for x in out.stdout.splitlines()] if jsonl else \
            [ln.split("  ", 1)[1] for ln in out.stdout.splitlines() if re.match(r"Q\d+  ", ln)]
        assert shown == asked, out.stdout[-2000:]
        return
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{p.prefix}: "), last
    payload = json.loads(last.split(": ", 1)[1])
    assert payload["method"] == next(a.split("=", 1)[1] for a in cmd.argv if a.startswith("method="))
    assert (store / "catalog.duckdb").exists()


def test_readme_synopsis_lists_every_command():
    """The synopsis block (`dagrag COMMAND [overrides]`, docs/commands.md) names each command of `flows.cli`, and
    only those."""
    listed = [c.argv[1] for c in COMMANDS_IN_DOCS if c.synopsis and c.argv[0] == ".venv/bin/dagrag"]
    assert sorted(set(listed)) == sorted(COMMANDS), f"docs synopsis {listed} against flows.cli {sorted(COMMANDS)}"


# `dagrag SUB --cfg job` for every SUB, one after the other in one child interpreter through `flows.cli.main` (the
# function the console script calls, test_console_script_entry_point): each runs its module as `__main__` as a
# process of its own would, and the child pays Prefect's and Hydra's imports once instead of once per command
DISPATCH_ALL = """
import contextlib, io, json, sys
from flows import cli
seen = {}
for sub, args in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([sub, "--cfg", "job", *args])
    seen[sub] = {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(seen), file=sys.__stdout__)
"""


def dispatch_args(sub: str) -> list[str]:
    # schedule's config (conf/schedule.yaml) has no method
    return [] if sub == "schedule" else ["method=bm25"]


@pytest.fixture(scope="module")
def dispatched() -> dict[str, dict]:
    """What `dagrag SUB --cfg job method=bm25` printed and returned, for every SUB of ``flows.cli``."""
    out = subprocess.run([sys.executable, "-c", DISPATCH_ALL, json.dumps({s: dispatch_args(s) for s in COMMANDS})],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("sub", sorted(COMMANDS))
def test_every_subcommand_dispatches(sub, dispatched):
    """`dagrag SUB --cfg job` reaches the command's Hydra entry point (it prints the config, runs nothing)."""
    # schedule's entries show that its own config was composed
    shown = "entries:" if sub == "schedule" else "name: bm25"
    got = dispatched[sub]
    assert got["rc"] == 0, got["stderr"][-2000:]
    assert shown in got["stdout"]


@pytest.mark.parametrize("line, error", [
    (".venv/bin/dagrag evalute method=bm25", "is not a command"),
    (".venv/bin/dagrag evaluate method=nosuch", "nosuch"),
    (".venv/bin/dagrag evaluate method.no_such_key=1", "no_such_key"),
    (".venv/bin/dagrag evaluate -m method=bm25 method.no_such_key=1,2", "no_such_key"),
    (".venv/bin/dagrag evaluate --no-such-flag method=bm25", "no-such-flag"),
    (".venv/bin/python -m flows.evalute method=bm25", "is not a command module"),
    ("python -m flows.commands.evaluate method=bm25", "does not work as printed"),
    ("dagrag evaluate method=bm25", "does not work as printed"),
    ("make runn", "no make target"),
    ('make run ARGS="method.no_such_key=1"', "no_such_key"),
    (".venv/bin/prefect server start --no-such-flag", "no-such-flag"),
    ("export PREFECT_NO_SUCH_SETTING=1", "not Prefect settings"),
])
def test_the_check_rejects_a_broken_command(line, error):
    (cmd,) = readme_commands(f"```bash\n{line}\n```\n")
    with pytest.raises(ReadmeCommandError, match=re.escape(error)):
        plan(cmd)


def test_parser_reads_blocks_comments_continuations_and_exports():
    text = ("```bash\nmake run   # x\n```\n\n```python\nnot = 'a command'\n```\n"
            "```bash\nexport PREFECT_API_URL=http://h/api\n.venv/bin/dagrag index \\\n  method=bm25  # c\n```\n"
            "```bash\nPREFECT_UI_API_URL=u .venv/bin/prefect server start [overrides]\n```\n")
    cmds = readme_commands(text)
    assert [c.argv for c in cmds] == [("make", "run"), ("export", "PREFECT_API_URL=http://h/api"),
                                      (".venv/bin/dagrag", "index", "method=bm25"),
                                      (".venv/bin/prefect", "server", "start")]
    assert cmds[2].block_env == ("PREFECT_API_URL",) and cmds[2].line == 10
    assert cmds[3].env == (("PREFECT_UI_API_URL", "u"),) and cmds[3].block_env == () and cmds[3].synopsis


def test_console_script_entry_point():
    """pyproject installs `dagrag` = flows.cli:main, the function the fallback above runs."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dagrag"] == "flows.cli:main"
    from flows import cli

    assert cli.main(["--help"]) == 0
    assert cli.main(["no-such-command"]) == 2
    assert cli.main([]) == 2


def test_dagrag_freezes_the_heap_once_its_command_is_done_and_the_exit_hooks_still_run():
    """After the command, ``flows.cli.main`` exempts every object from the full collection that ends the
    interpreter (``gc.freeze``; that collection took 1-2 s at exit). Exit hooks registered before still run."""
    code = ("import atexit, gc\n"
            "from flows import cli\n"
            "atexit.register(lambda: print('exit hook ran', flush=True))\n"
            "before = gc.get_freeze_count()\n"
            "rc = cli.main(['index', '--cfg', 'job'])\n"
            "print('rc', rc, 'frozen', before, gc.get_freeze_count() > before, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rc 0 frozen 0 True" in out.stdout, out.stdout[-2000:]
    assert out.stdout.rstrip().endswith("exit hook ran")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line, code) of each ```python block."""
    return [(text[:m.start()].count("\n") + 2, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.M | re.S)]


def test_readme_python_examples_run(tmp_path, prefect_home, store_runs):
    """Each ```python block of the README and the docs runs as printed, in a fresh interpreter in a folder of its
    own, after the README's `dagrag index method=bm25 dataset=sample` has built the index it opens (a copy of
    the one built for the README's commands)."""
    blocks = [(f"{page.relative_to(REPO)} line {line}", code) for page in PAGES
              for line, code in python_blocks(page.read_text())]
    assert any(where.startswith("README.md ") for where, _ in blocks), "the README shows no Python example"
    built, store = store_runs.run([*dagrag_argv(), "index", "method=bm25", "dataset=sample"],
                                  command_env({}, prefect_home))
    assert built.returncode == 0, built.stderr[-2000:]
    StoreRuns.copy(store, tmp_path / "artifacts")
    for line, code in blocks:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        assert out.returncode == 0, f"{line}:\n{out.stderr[-2000:]}"
        assert out.stdout.strip(), f"{line} printed nothing"
