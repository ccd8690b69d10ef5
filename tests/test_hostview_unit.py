"""The warden's copies of the host's counters (warden/hostview.py), made where this test runs: no Docker."""

from __future__ import annotations

import os

import pytest

from air.sandbox.warden import hostview


def test_the_page_block_walk_is_never_read_and_shows_empty(monkeypatch):
    """/proc/pagetypeinfo walks every page block of the host's memory under the zone's lock: the snapshot shows it
    empty without reading it, and reads the other counter files (the same reader, so the probe can see a read)."""
    if not os.path.isfile("/proc/pagetypeinfo"):
        pytest.skip("this kernel has no /proc/pagetypeinfo")
    read: list[str] = []
    real = hostview._read
    monkeypatch.setattr(hostview, "_read", lambda path: read.append(path) or real(path))
    view = hostview.snapshot(1 << 30)
    assert "/proc/pagetypeinfo" not in read and view.entries["/proc/pagetypeinfo"] == {"": b""}
    assert "/proc/zoneinfo" in read and view.entries["/proc/zoneinfo"][""]  # the control: counters are read
