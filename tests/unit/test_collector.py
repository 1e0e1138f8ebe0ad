"""The collector's passes deferred while a command starts, and back at its first remote
command (launcher/core/collector.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.core import collector
from launcher.transport.connection import Connection
from launcher.transport.endpoint import Endpoint


@pytest.fixture(autouse=True)
def _thresholds_kept() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    collector.resume()
    gc.unfreeze()  # this test process's objects back where the collector scans them
    gc.set_threshold(*before)


def test_defer_raises_the_young_threshold_until_resume() -> None:
    before = gc.get_threshold()
    collector.defer()
    assert gc.get_threshold() == (collector.START_THRESHOLD, before[1], before[2])
    collector.defer()  # twice: the saved thresholds stay the first ones
    assert gc.isenabled()  # only thresholds change
    collector.resume()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() > 0  # what the start made is never scanned again


def test_resume_without_defer_changes_nothing() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    collector.resume()
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen


def test_the_first_remote_command_resumes(tmp_path: Path) -> None:
    """Connection.runners() is where every remote command starts: the start is over there."""
    before = gc.get_threshold()
    collector.defer()
    endpoint = Endpoint(
        name="h",
        hostname="192.0.2.1",
        port=22,
        user="root",
        identity_files=(),
        known_hosts=tmp_path / "known_hosts",
        accept_new=False,
        jump=None,
        connect_timeout=5.0,
        command_timeout=5.0,
    )
    Connection(endpoint).runners()
    assert gc.get_threshold() == before
