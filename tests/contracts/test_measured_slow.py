"""tests/measured_slow.txt names tests that exist: each entry's file holds the test function it names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_measured_slow_entry_names_an_existing_test():
    stale = []
    for line in (ROOT / "tests" / "measured_slow.txt").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        seconds, nodeid = line.split(maxsplit=1)
        assert float(seconds) > 0, line
        path, _, name = nodeid.partition("::")
        func = re.sub(r"\[.*\]$", "", name)
        src = ROOT / path
        if not src.is_file() or not re.search(rf"^\s*def {re.escape(func)}\(", src.read_text(), re.MULTILINE):
            stale.append(nodeid)
    assert not stale, f"tests/measured_slow.txt names tests that no longer exist (remove them): {stale}"
