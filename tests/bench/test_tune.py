"""`ivhl tune` end to end on tiny sizes (IVHL_TUNE_TINY=1), and its bad inputs: one line, the table stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ivhl(*args, env_extra=None, timeout=300):
    env = {**os.environ, "IVHL_TUNE_TINY": "1", "IVHL_TUNING": "cache", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "ivhl_jax.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_tune_one_area_end_to_end_then_info_shows_it(tmp_path):
    out = _ivhl("tune", "--quick", "--only", "fields", "--export", str(tmp_path / "t.json"),
                env_extra={"IVHL_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[tune] fields.superpose 512 x 8" in out.stdout  # progress on the console
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["provenance"]["command"].startswith("ivhl tune") and doc["provenance"]["versions"]["jax"]
    assert doc["fingerprint_of_this_machine"]["versions"]["jax"]
    (key, entry), = doc["entries"].items()
    assert key == "fields.superpose|2^12" and entry["winner"] in entry["candidates"]
    # every timed candidate was checked against the table default first, and has its statistics
    timed = {n: c for n, c in entry["candidates"].items() if "median_s" in c}
    assert "table" in timed and len(timed) >= 3
    assert all(c["max_rel_diff_vs_default"] <= 2e-5 and c["n"] == 5 and c["iqr_s"] >= 0 for c in timed.values())
    assert entry["roofline"]["flops"] > 0 and entry["roofline"]["fraction"] > 0
    assert doc["limits"]["copy_gbps"] > 0 and doc["limits"]["matmul_f32_tflops"] > 0
    cache = json.loads(open(doc["cache"]).read())
    assert cache["entries"][key]["settings"] == entry["settings"]
    info = _ivhl("info", env_extra={"IVHL_CACHE_DIR": str(tmp_path)})
    assert info.returncode == 0, info.stderr
    line = next(x for x in info.stdout.splitlines() if "fields_pair_budget@fields.superpose[2^12]" in x)
    assert "tuning cache: measured" in line and doc["cache"] in line


@pytest.mark.parametrize("only", ["nope", "fields,nope"])
def test_unknown_area_is_one_line(only, tmp_path):
    out = _ivhl("tune", "--only", only, env_extra={"IVHL_CACHE_DIR": str(tmp_path)}, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert "unknown tuning area(s) ['nope']" in out.stderr and "fields" in out.stderr


def test_unwritable_cache_folder_is_one_line(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    out = _ivhl("tune", "--quick", "--only", "fields", env_extra={"IVHL_CACHE_DIR": str(blocker)}, timeout=120)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "not_a_folder" in out.stderr and "IVHL_CACHE_DIR" in out.stderr
    assert "table" in out.stderr


def test_gpu_script_is_valid_bash_and_names_existing_entry_points():
    script = os.path.join(ROOT, "bench", "gpu_tune_and_check.sh")
    assert subprocess.run(["bash", "-n", script], capture_output=True, timeout=30).returncode == 0
    text = open(script, encoding="utf-8").read()
    from ivhl_jax.bench import gpu_checks

    assert "-m ivhl_jax.cli tune ${TUNE_ARGS:---quick}" in text and "-m ivhl_jax.bench.gpu_checks --out" in text
    assert "--skip tune" in text and "tune" in gpu_checks.SECTIONS
