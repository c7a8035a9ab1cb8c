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
    return subprocess.run(
        [sys.executable, "-m", "ivhl_jax.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_tune_one_area_end_to_end_then_info_shows_it(tmp_path):
    out = _ivhl(
        "tune",
        "--quick",
        "--only",
        "fields",
        "--export",
        str(tmp_path / "t.json"),
        env_extra={"IVHL_CACHE_DIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[tune] fields.superpose 512 x 8" in out.stdout  # progress on the console
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["provenance"]["command"].startswith("ivhl tune") and doc["provenance"]["versions"]["jax"]
    assert doc["fingerprint_of_this_machine"]["versions"]["jax"]
    ((key, entry),) = doc["entries"].items()
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


_LIMITS = {"copy_gbps": 10.0, "matmul_f32_tflops": 0.1, "matmul_bf16_tflops": 0.1}


def _session(**kw):
    from ivhl_jax.run.tune import Session

    return Session(quick=True, tiny=True, limits=_LIMITS, **kw)


def test_gp_layout_meshes():
    from ivhl_jax.physics import tunables as tune

    assert tune.gp_layout_meshes(1) == []
    assert tune.gp_layout_meshes(8) == ["8", "2x4", "4x2"]
    assert tune.gp_layout_meshes(6) == ["6", "2x3", "3x2"]


def test_gp_area_times_slab_and_pencil_layouts_against_one_device():
    """With several devices (the tests emulate 8 CPU devices) the GP area times the 3-D Strang step on one device
    and on every slab/pencil layout over all devices; each layout's output equals the one-device run."""
    import jax

    from ivhl_jax.physics import tunables as tune

    if jax.device_count() < 2:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (as make test sets)")
    out = tune.tune_gp_layouts(_session())
    n = jax.device_count()
    ((key, entry),) = out.items()
    assert key == f"condensate.layout|{n}dev,8x8x8" and entry["params"]["devices"] == n
    cands = entry["candidates"]
    assert set(cands) == {"one_device"} | {
        f"{'slab' if 'x' not in m else 'pencil'}_{m}" for m in tune.gp_layout_meshes(n)
    }
    timed = {name: c for name, c in cands.items() if "median_s" in c}
    assert {"one_device", f"slab_{n}"} <= set(timed) and any(name.startswith("pencil_") for name in timed), cands
    assert all(c["max_rel_diff_vs_default"] <= 1e-4 and "rejected" not in c for c in timed.values())
    assert entry["winner"] in timed and entry["settings"]["mesh"] in ["1", *tune.gp_layout_meshes(n)]


def test_attention_area_times_chunked_key_blocks_and_says_why_not_pallas_on_cpu():
    import jax

    from ivhl_jax.nn import tunables as tune

    s = _session(area="attention")
    out = tune.tune_attention(s)
    entry = out["attention.chunk_block|all"]
    # T = 32 (tiny): the default block (min(128, T) = 32) and 16; each checked against the default's output
    assert set(entry["candidates"]) == {"block_k_default", "block_k16"}
    assert entry["candidates"]["block_k16"]["max_rel_diff_vs_default"] <= 3e-2
    assert entry["winner"] in entry["candidates"] and entry["roofline"]["flops"] > 0
    if jax.default_backend() != "gpu":
        assert "attention.pallas_blocks|all" not in out
        assert any("Pallas attention block sizes: not timed" in note for note in s.notes["attention"])


def test_quick_leaves_out_the_host_cdt_engine_when_numba_has_not_compiled_it(tmp_path):
    """A cold numba disk cache (an empty NUMBA_CACHE_DIR) would cost minutes of compilation: --quick says so and
    leaves the host engine out (on a CPU, where the table's engine is host, the cdt area then stores nothing)."""
    out = _ivhl(
        "tune",
        "--quick",
        "--only",
        "cdt",
        "--no-save",
        "--export",
        str(tmp_path / "t.json"),
        env_extra={"IVHL_CACHE_DIR": str(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "numba")},
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "not in numba's disk cache" in out.stdout and "ivhl tune --only cdt" in out.stdout
    doc = json.loads((tmp_path / "t.json").read_text())
    assert any("ivhl tune --only cdt" in note for note in doc["notes"]["cdt"]) and not doc["errors"]
    assert all(e["candidates"].get("host") is None for e in doc["entries"].values())
    numba_dir = tmp_path / "numba"
    assert not numba_dir.exists() or not any(numba_dir.rglob("*.nbi"))  # nothing was compiled into the cache


def test_host_kernels_cached_reads_numba_cache_without_compiling(tmp_path):
    code = (
        "from ivhl_jax.physics import tunables as tune; from ivhl_jax.physics.cdt import host_kernels as K; "
        "print(tune.host_kernels_cached(), len(K.run_stream.overloads))"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.split() == ["False", "0"]  # an empty cache folder: cold, and nothing was compiled to find out


def test_numba_cache_check_sees_a_compiled_kernel(tmp_path):
    """The same check on a tiny cache=True kernel: cold before its first call, warm in a later process."""
    (tmp_path / "tiny_kernel.py").write_text(
        "from numba import njit\n\n\n@njit(cache=True)\ndef f(x):\n    return x + 1\n"
    )
    code = (
        "import sys; import tiny_kernel as m; from ivhl_jax.physics import tunables as tune; "
        "print(tune._numba_cached(m.f)); "
        "sys.argv[1:] == ['call'] and m.f(1)"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}

    def cached(*args):
        out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-1000:]
        return out.stdout.strip()

    assert cached("call") == "False"  # cold; this process compiles f and numba writes it to the cache
    assert cached() == "True"


@pytest.mark.slow  # the xla area's two worker processes, then a fresh process for the fields area: about a minute
def test_tune_xla_then_the_rest_prints_one_table_and_writes_only_the_export(tmp_path):
    export = tmp_path / "t.json"
    out = _ivhl(
        "tune",
        "--quick",
        "--only",
        "xla,fields",
        "--export",
        str(export),
        env_extra={"IVHL_CACHE_DIR": str(tmp_path)},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("op [bucket]") == 1, out.stdout  # the child hands its result over; one table
    assert [line for line in out.stdout.splitlines() if line.startswith("wrote ")] == [f"wrote {export}"]
    assert "fields.superpose|2^12" in json.loads(export.read_text())["entries"]


def test_a_busy_host_is_said(monkeypatch, capsys):
    from ivhl_jax.core import host
    from ivhl_jax.run import tune

    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 * host.facts().machine_cores, 0.0, 0.0))
    s = _session()
    tune._load_warning(s)
    assert "the host is busy" in capsys.readouterr().out and "rerun `ivhl tune` on a quiet host" in s.notes["load"][0]
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    s = _session()
    tune._load_warning(s)
    assert s.notes == {}


def test_a_roofline_fraction_above_one_is_explained(capsys):
    from ivhl_jax.run import measure, tune

    rec = measure.roofline_of(0.0, 1e9, 1e-3, _LIMITS)  # 1 GB in 1 ms against a 10 GB/s copy: 100x
    assert rec["fraction"] > 1 and rec["note"] == measure.ABOVE_ONE
    entry = {"winner": "a", "median_s": 1e-3, "spread": 0.1, "roofline": rec}
    tune._summary({"entries": {"x|all": entry}, "errors": {}})
    printed = capsys.readouterr().out
    assert "%*" in printed and measure.ABOVE_ONE in printed


def test_without_numba_the_cdt_area_records_no_one_engine_race(monkeypatch):
    """The JAX engine alone is not a measurement: nothing is recorded, so the table's engine stays and installing
    numba later brings the host engine back."""
    from ivhl_jax.physics import tunables

    monkeypatch.setitem(__import__("sys").modules, "numba", None)
    s = _session(area="cdt")
    assert tunables.tune_cdt(s) == {}
    assert any("numba not installed" in n for n in s.notes["cdt"])
    assert any("only the jax engine is a candidate here: nothing to race" in n for n in s.notes["cdt"])
