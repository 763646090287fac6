"""What a long step shows: a bar only after its delay, and a log line at its start only when it is slow."""
from __future__ import annotations

import logging
import time

from tasks.core import progress


def test_a_bar_appears_only_after_its_delay(capsys, monkeypatch):
    with progress.progress_bar(3, "quick") as bar:
        bar.update(3)
    assert "quick" not in capsys.readouterr().err
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    with progress.progress_bar(3, "slow", unit="text") as bar:
        bar.update(3)
    assert "slow" in capsys.readouterr().err


def test_timed_logs_its_start_only_when_slow(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="dagrag")
    with progress.timed("quick step"):
        pass
    assert [r.getMessage() for r in caplog.records] == [caplog.records[0].getMessage()]
    assert caplog.records[0].getMessage().startswith("quick step: ") and caplog.records[0].getMessage().endswith(" s")
    caplog.clear()
    monkeypatch.setattr(progress, "NOTICE_S", 0.01)
    with progress.timed("slow step"):
        time.sleep(0.3)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "slow step …" and messages[1].startswith("slow step: ") and len(messages) == 2
