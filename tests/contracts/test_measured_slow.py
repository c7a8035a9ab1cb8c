"""tests/measured_slow.txt names tests that exist: each entry's file holds the test function it names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _entries() -> list[tuple[str, str]]:
    """(seconds, node id) of every entry of tests/measured_slow.txt."""
    lines = (ROOT / "tests" / "measured_slow.txt").read_text().splitlines()
    return [tuple(line.split(maxsplit=1)) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_every_measured_slow_entry_names_an_existing_test():
    stale = []
    for seconds, nodeid in _entries():
        assert float(seconds) > 0, (seconds, nodeid)
        path, _, name = nodeid.partition("::")
        func = re.sub(r"\[.*\]$", "", name)
        src = ROOT / path
        if not src.is_file() or not re.search(rf"^\s*def {re.escape(func)}\(", src.read_text(), re.MULTILINE):
            stale.append(nodeid)
    assert not stale, f"tests/measured_slow.txt names tests that no longer exist (remove them): {stale}"


def test_measured_slow_entries_outside_tests_are_slow_when_their_files_run_alone():
    """`make test-slow` runs each file in its own process; a study file run alone never loads tests/conftest.py, so
    the mark must come from the repository's conftest.py, or the file's slow tests are deselected and pytest exits 5."""
    outside = sorted({nodeid.strip() for _, nodeid in _entries() if not nodeid.startswith("tests/")})
    assert outside, "no entry outside tests/: this test guards nothing; point it at another folder"
    files = sorted({e.partition("::")[0] for e in outside})
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "slow", "-q", "--collect-only", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    collected = {line.strip() for line in out.stdout.splitlines() if "::" in line}
    missing = [e for e in outside if e not in collected]
    assert not missing, f"not slow when their files run alone: {missing}\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
