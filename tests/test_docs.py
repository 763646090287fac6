"""The docs site builds, and every code reference in README.md and docs/**/*.md resolves.

- ``mkdocs build --strict`` (mkdocs.yml) fails on a broken link, a missing anchor or a page left out of the nav;
  it runs offline (no web fonts, no plugin that fetches).
- Inline code that names a repository path (``flows/serving/index.py``, ``conf/method/zoomrag.yaml``) must name
  one that exists; one that names a module or a symbol (``tasks.core.stage.run_stage``, ``flows.cli:main``) must
  import. Placeholders (``flows/<method>.py``, ``conf/experiment_method/NAME/METHOD.yaml``) are not references.
- The README's relative links name files that exist.
"""
from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
ROOTS = ("flows", "tasks", "tests", "conf", "notebooks", "docs")
PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(ROOTS)})/[\w./<>*{{}}…-]*)")
DOTTED = re.compile(r"(?<![\w/.-])((?:flows|tasks)(?:\.\w+)+(?::\w+(?:\.\w+)*)?)")
# not references: <method>, a glob, an upper-case stand-in (conf/NAME.yaml, flows.COMMAND), the how-to's example
PLACEHOLDER = re.compile(r"[<>*{}…]|(?:^|[/.])(?:[A-Z]|NAME|METHOD|COMMAND|DIR|PATH|ID)(?:$|[/.])|mymethod")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, cwd=config.parent,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)})


def test_mkdocs_builds_strict(docs_site):
    out, site = docs_site  # tests/conftest.py: built once per session
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (site / "methods" / "zoomrag" / "index.html").exists()
    assert "fonts.googleapis" not in (site / "index.html").read_text()  # offline: theme.font false


def test_mkdocs_strict_fails_on_a_broken_link(tmp_path):
    """The check can fail: the same site with one link to a page that does not exist does not build."""
    pytest.importorskip("material", reason="mkdocs-material is in the test extra: pip install -e '.[test]'")
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md)\n")
    out = mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0 and "no-such-page.md" in out.stdout + out.stderr


def inline_code(text: str) -> list[tuple[int, str]]:
    """(line, span) of each inline code span outside fenced blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out += [(number, m.group(2)) for m in re.finditer(r"(`+)(.+?)\1", line)]
    return out


def references(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The path references and the dotted references of a page's inline code."""
    paths, dotted = [], []
    for line, span in inline_code(text):
        paths += [(line, p.rstrip(".,;:")) for p in PATH.findall(span)]
        dotted += [(line, d) for d in DOTTED.findall(span)]
    return [(n, p) for n, p in paths if not PLACEHOLDER.search(p)], [(n, d) for n, d in dotted
                                                                     if not PLACEHOLDER.search(d)]


def resolves(reference: str) -> bool:
    """``a.b.c`` or ``a.b:c.d``: the longest importable module prefix, then attributes."""
    module, _, attrs = reference.partition(":")
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        try:
            for name in [*parts[cut:], *(attrs.split(".") if attrs else [])]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def path_exists(ref: str) -> bool:
    file, _, test = ref.partition("::")
    target = REPO / file
    if not target.exists():
        return False
    return not test or re.search(rf"\bdef {re.escape(test.split('::')[-1])}\b", target.read_text()) is not None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_code_references_resolve(page):
    paths, dotted = references(page.read_text())
    broken = [f"line {n}: {p} (no such file or folder)" for n, p in paths if not path_exists(p)]
    broken += [f"line {n}: {d} (does not import)" for n, d in dotted if not resolves(d)]
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_reference_check_can_fail():
    paths, dotted = references("see `flows/no_such.py`, `tasks.core.stage.no_such_name` and `flows/<method>.py`")
    assert paths == [(1, "flows/no_such.py")] and dotted == [(1, "tasks.core.stage.no_such_name")]
    assert not path_exists("flows/no_such.py") and not resolves("tasks.core.stage.no_such_name")
    assert resolves("tasks.core.stage.run_stage") and resolves("flows.cli:main") and path_exists("flows/cli.py")


def test_readme_links_name_files_that_exist():
    text = (REPO / "README.md").read_text()
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t and not t.startswith("#")]
    missing = [t for t in links if not (REPO / t).exists()]
    assert links and not missing, missing


def diagram_stages(text: str) -> dict[str, set[str]]:
    """``method → stage names`` of each mermaid block opened by ``%% stages of method=NAME``: the first word of each
    solid box (``id["embed: passages"]``); double-edged boxes (``id[["…"]]``) are online steps, not stages."""
    out = {}
    for block in re.findall(r"^```mermaid\n(.*?)^```", text, flags=re.M | re.S):
        named = re.search(r"%% stages of method=(\w+)", block)
        if named:
            out[named.group(1)] = set(re.findall(r"\w+\[\"(\w+)", block))
    return out


def method_diagrams() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for page in sorted((REPO / "docs" / "methods").glob("*.md")):
        for method, stages in diagram_stages(page.read_text()).items():
            assert method not in found, f"two diagrams of method={method}"
            found[method] = stages
    return found


def test_every_method_has_one_stage_diagram():
    from flows.methods import NAMES as METHOD_NAMES

    assert sorted(method_diagrams()) == sorted(METHOD_NAMES)
    assert diagram_stages('```mermaid\nflowchart LR\n  %% stages of method=x\n  a["ingest"] --> b["embed: p"]\n'
                          '  b -.-> c[["search"]]\n```\n') == {"x": {"ingest", "embed"}}


GENERATED = re.compile(r"(<!-- stage diagram of method=(\w+): generated by `dagrag plan method=\2 "
                       r"plan.format=mermaid`, rewritten by tests/test_docs.py; do not edit -->\n)```mermaid\n.*?^```\n",
                       flags=re.M | re.S)


def generated_diagram(method: str, artifacts_dir: Path) -> str:
    """What ``dagrag plan method=<method> plan.format=mermaid`` prints on an empty store (the default config)."""
    from flows.commands.plan import diagram
    from flows.runtime.config import load_config
    from flows.serving.index import compose

    return diagram(load_config(compose([f"method={method}", f"artifacts_dir={artifacts_dir}"])))


def test_stage_diagrams_are_generated(tmp_path):
    """Each method page's stage diagram is the plan's own mermaid output: a page whose drawing differs is rewritten
    (and the test fails once, so the new drawing is committed), so a new stage can never leave a stale drawing."""
    from flows.methods import NAMES as METHOD_NAMES

    seen, stale = set(), []
    for page in sorted((REPO / "docs" / "methods").glob("*.md")):
        text = page.read_text()

        def fresh(match: re.Match) -> str:
            seen.add(match.group(2))
            return f"{match.group(1)}```mermaid\n{generated_diagram(match.group(2), tmp_path / 'store')}\n```\n"

        new = GENERATED.sub(fresh, text)
        if new != text:
            page.write_text(new)
            stale.append(page.relative_to(REPO).as_posix())
    assert seen == set(METHOD_NAMES), f"methods without a generated diagram: {sorted(set(METHOD_NAMES) - seen)}"
    assert not (tmp_path / "store" / "catalog.duckdb").exists()
    assert not stale, f"stage diagrams were stale and are rewritten now (commit them): {stale}"
