"""`import ivhl_jax` has no side effect beyond importing, checked in a fresh process: it reads no file of the user's
cache (not even a valid tuning cache holding XLA flags), changes no environment variable and prints nothing, in
every tuning mode; the measured flags reach XLA only through ``ivhl_jax.run.tune.apply()``, which the ``ivhl``
command calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# An audit hook sees every open, listdir and scandir of the process; the child reports those under the sandbox
# folder, and which environment variables the import changed. (On the code that applied the cache at import, the
# child opened the cache file, set XLA_FLAGS and, under IVHL_TUNING=auto, printed a line.)
_CHILD = """
import json, os, sys
box, report_path = sys.argv[1], sys.argv[2]
touched = []

def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if path.startswith(box):
            touched.append(f"{event} {path}")

sys.addaudithook(hook)
import jax  # what jax's own import sets (TF_CPP_MIN_LOG_LEVEL, ...) is not ivhl_jax's doing
before = dict(os.environ)
import ivhl_jax
import ivhl_jax.run.tune
after = dict(os.environ)
changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
sys.addaudithook(lambda *a: None)
with open(report_path, "w") as f:
    json.dump({"touched": list(touched), "changed": changed}, f)
"""


def _cache_with_a_flag(folder) -> str:
    """A valid tuning cache of this machine in ``folder`` holding a measured XLA flag; returns the flag."""
    from ivhl_jax.core import tuning_cache

    old = {k: os.environ.get(k) for k in ("IVHL_CACHE_DIR", "IVHL_TUNING")}
    os.environ.update(IVHL_CACHE_DIR=str(folder), IVHL_TUNING="cache")
    flag = tuning_cache.XLA_FLAG_CANDIDATES[0]
    try:
        tuning_cache.reset()
        entry = {"op": "xla.flags", "bucket": "all", "settings": {"xla_flags": flag}}
        tuning_cache.record("cpu", {"xla.flags|all": entry})
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tuning_cache.reset()
    return flag


@pytest.mark.parametrize("mode", ["cache", "auto", "bogus"])
def test_import_reads_no_file_sets_nothing_prints_nothing(tmp_path, mode):
    box = tmp_path / "box"
    (box / "home").mkdir(parents=True)
    _cache_with_a_flag(box / "cache")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "XDG_CACHE_HOME")}
    env.update(HOME=str(box / "home"), IVHL_CACHE_DIR=str(box / "cache"), IVHL_TUNING=mode)
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(box), str(report)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert (out.stdout, out.stderr) == ("", "")
    doc = json.loads(report.read_text())
    assert doc["touched"] == [] and doc["changed"] == [], doc


def test_the_ivhl_command_applies_the_measured_flags(tmp_path):
    """The entry point is where the flags come into force: `ivhl info` reports them applied."""
    flag = _cache_with_a_flag(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(IVHL_CACHE_DIR=str(tmp_path), IVHL_TUNING="cache")
    out = subprocess.run(
        [sys.executable, "-m", "ivhl_jax.cli", "info"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if "xla_flags" in x)
    assert flag in line and "applied by ivhl_jax.run.tune.apply()" in line, line
