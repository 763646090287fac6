"""Shared fixtures for the test suite."""
from __future__ import annotations

import os

import pytest

# stage tasks called via ``.fn`` log outside any flow run: nothing to send to an API
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")

from hypothesis import settings  # noqa: E402

from tasks.core.stage import RunContext  # noqa: E402

pytest_plugins = ["tests.llm_server"]  # its llm_server fixture, for every test

# Property tests draw the same examples on every run (`make test`, CI): a run passes or fails for the code, not
# the draw. `HYPOTHESIS_PROFILE=explore make test` draws new ones, as a search for counter-examples.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture
def ctx(tmp_path) -> RunContext:
    """A run context over a fresh, empty artifacts dir under ``tmp_path``."""
    return RunContext(str(tmp_path / "artifacts"), "ds", "run1")


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory):
    """``mkdocs build --strict`` of the repository's docs, run once per session for the tests that read the built
    site (tests/test_docs.py, tests/test_docs_offline.py): ``(the finished build, the site folder)``."""
    pytest.importorskip("material", reason="mkdocs-material is in the test extra: pip install -e '.[test]'")
    from tests.test_docs import REPO, mkdocs_build

    site = tmp_path_factory.mktemp("docs") / "site"
    return mkdocs_build(REPO / "mkdocs.yml", site), site
