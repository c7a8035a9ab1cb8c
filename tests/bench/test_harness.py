"""The benchmark harness: record layout, interleaved peers, FLOPs fallback, registry."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.bench import harness


def _case():
    a = jnp.ones((64, 64), jnp.float32)

    def numpy_peer():
        an = np.ones((64, 64), np.float32)
        return lambda: an @ an

    def broken_peer():
        raise RuntimeError("peer exploded")

    return harness.BenchCase(
        op="tiny_matmul",
        size="small",
        fn=lambda x: x @ x,
        args=(a,),
        params={"n": 64},
        peers={"numpy": numpy_peer, "broken": broken_peer},
        items_per_call=64,
    )


def test_run_case_record():
    rec = harness.run_case(_case(), repeats=5, warmup=1)
    assert rec["jit"]["n"] == 5 and len(rec["jit"]["samples_s"]) == 5
    assert rec["jit"]["min_s"] <= rec["jit"]["median_s"] and rec["compile_s"] > 0
    assert rec["op_by_op"]["n"] >= 1 and rec["speedup_jit_vs_op_by_op"] > 0
    peer = rec["peers"]["numpy"]
    assert peer["n"] == 5 and peer["peer_over_jit"] > 0 and "peer_over_jit_per_round_median" in peer
    assert "RuntimeError" in rec["peers"]["broken"]["error"]  # a failing peer never hides our numbers
    # No analytic count given: XLA's cost analysis supplies 2·n³ for the matmul.
    assert rec["flops_source"] == "xla_cost_analysis"
    np.testing.assert_allclose(rec["flops_per_call"], 2 * 64**3, rtol=0.05)
    assert rec["throughput"]["per_s"] > 0


def test_registry_names_are_unique_and_sizes_checked():
    ops = harness.registry()
    assert {
        "superpose",
        "gp_step",
        "tn_contract",
        "cdt_sweeps",
        "transformer_train_step",
        "adaptive_train",
        "matmul_peak_f32",
        "parallel_dp_step",
    } <= set(ops)
    with pytest.raises(ValueError, match="size must be one of"):
        harness.run(["superpose"], ["huge"], log=lambda s: None)
    with pytest.raises(ValueError, match="unknown bench op"):
        harness.run(["no_such_op"], ["small"], log=lambda s: None)


def test_interleaved_rounds_times_each_call_once_per_round_in_turn():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    wall, cpu = harness.interleaved_rounds(calls, 3, pause_s=0.0, cpu=True)
    assert order == ["a", "b"] * 3
    assert {k: len(v) for k, v in wall.items()} == {"a": 3, "b": 3} == {k: len(v) for k, v in cpu.items()}
    assert all(t >= 0 for v in wall.values() for t in v)
    assert harness.interleaved_rounds(calls, 1)[1] == {"a": [], "b": []}  # cpu times only when asked
    with pytest.raises(ValueError, match="rounds"):
        harness.interleaved_rounds(calls, 0)


def test_before_after_pairs_the_rounds_and_module_at_loads_a_revision(tmp_path):
    wall = {"k old": [1.0, 2.0, 4.0], "k new": [2.0, 2.0, 2.0]}
    rec = harness.before_after(wall, {"k": {"steps": 3}})["k"]
    assert rec["old_median_s"] == 2.0 and rec["new_median_s"] == 2.0 and rec["steps"] == 3
    assert rec["ratio_new_over_old_per_round"] == {"median": 1.0, "q1": 0.75, "q3": 1.5}  # ratios 2, 1, 0.5
    mod = harness.module_at("HEAD", "ivhl_jax/numerics/fastmath.py", "fastmath_at_head", str(tmp_path))
    assert mod.__name__ == "fastmath_at_head" and callable(mod.sincos)


def test_before_after_study_times_summarises_and_writes(tmp_path, capsys):
    import json

    calls = {"k old": lambda: None, "k new": lambda: None}
    out = tmp_path / "r.json"
    res = harness.before_after_study(calls, {"k": {"steps": 2}}, rounds=3, against="HEAD", out=str(out))
    assert set(res) == {"k"} and res["k"]["steps"] == 2 and "ratio_new_over_old_per_round" in res["k"]
    doc = json.loads(out.read_text())
    assert doc["against"] == "HEAD" and doc["rounds"] == 3 and doc["results"] == res
    assert "k {" in capsys.readouterr().out


def test_calls_per_sample_fills_the_window():
    assert harness.calls_per_sample(0.004, 0.0) == 1  # no window: one call per sample
    assert harness.calls_per_sample(0.004, 0.5) == 125
    assert harness.calls_per_sample(0.3, 0.5) == 2  # at least the window, never shorter
    assert harness.calls_per_sample(0.9, 0.5) == 1


def test_time_in_windows_repeats_the_call_to_fill_each_sample():
    import time

    n = [0]

    def call():
        n[0] += 1
        time.sleep(0.002)

    samples, k = harness.time_in_windows(call, repeats=3, window_s=0.02)
    assert 1 <= k <= 10 and n[0] == 1 + 3 * k  # one sizing call (>= 2 ms), then k calls per sample
    assert len(samples) == 3 and all(x >= 0.002 for x in samples)  # seconds per call, not per sample
    assert harness.time_in_windows(call, repeats=2, window_s=0.0)[1] == 1
    with pytest.raises(ValueError, match="repeats"):
        harness.time_in_windows(call, repeats=0, window_s=0.1)


def test_write_results_puts_the_provenance_header_first(tmp_path):
    import json
    import os
    import pathlib
    import subprocess

    import jax

    import ivhl_jax

    path = tmp_path / "r.json"
    harness.write_results(path, {"provenance": "stale", "results": [1, 2]}, command="ivhl bench --op superpose")
    doc = json.loads(path.read_text())
    assert list(doc) == ["provenance", "results"] and doc["results"] == [1, 2]
    h = doc["provenance"]
    assert h["command"] == "ivhl bench --op superpose"
    repo = pathlib.Path(harness.__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (an sdist has no git history: commit and dirty are then None)
        assert h["commit"] == head.stdout.strip() and isinstance(h["dirty"], bool)
    assert h["machine"]["platform"] == jax.default_backend() and h["machine"]["cpu_cores"] == os.cpu_count()
    assert h["versions"]["ivhl_jax"] == ivhl_jax.__version__ and h["versions"]["jax"] == jax.__version__
    assert "jaxlib" in h["versions"]
    with pytest.raises(TypeError, match="doc must be a dict"):
        harness.write_results(tmp_path / "bad.json", [1, 2])


def test_invocation_is_the_command_to_run_again(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "argv", ["/somewhere/.venv/bin/ivhl", "bench", "--op", "a b"])
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)
    assert harness.invocation() == "ivhl bench --op 'a b'"
    spec = type("Spec", (), {"name": "ivhl_jax.bench.ops_fields"})()
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", spec)
    monkeypatch.setattr(sys, "argv", ["/x/ops_fields.py", "--out", "f.json"])
    assert harness.invocation() == "python -m ivhl_jax.bench.ops_fields --out f.json"


def test_run_checks_runs_every_check_and_records_a_failing_one_without_stopping():
    calls = []

    def ok():
        calls.append("ok")
        return {"n": 3}

    def broken():
        calls.append("broken")
        raise MemoryError("x" * 1000)

    def after():
        calls.append("after")
        return {"n": 4}

    doc = harness.run_checks(
        {
            "ok": (ok, lambda r: f"ok {r['n']}"),
            "broken": (broken, lambda r: "never"),
            "after": (after, lambda r: f"after {r['n']}"),
        }
    )
    assert calls == ["ok", "broken", "after"]
    assert list(doc["results"]) == ["ok", "broken", "after"] and doc["device"]
    assert doc["results"]["ok"] == {"n": 3}
    assert doc["results"]["broken"]["error"] == "MemoryError: " + "x" * 300
    assert doc["summary"] == ["ok 3", "broken: MemoryError: " + "x" * 300, "after 4"]


def test_gpu_check_main_writes_the_doc_with_its_command_and_prints_the_summary(tmp_path, capsys):
    import json

    out = tmp_path / "check.json"
    seen = {}

    def gpu_check(quick=False):
        seen["quick"] = quick
        return {"results": {"a": {"x": 1}}, "summary": ["a: 1", "b: 2"]}

    assert harness.gpu_check_main("ops_example", gpu_check, ["--out", str(out), "--quick"]) == 0
    doc = json.loads(out.read_text())
    assert seen == {"quick": True}
    assert doc["provenance"]["command"] == f"python -m ivhl_jax.bench.ops_example --out {out} --quick"
    assert doc["results"] == {"a": {"x": 1}}
    assert capsys.readouterr().out.splitlines()[-2:] == ["a: 1", "b: 2"]


def test_run_says_once_that_a_missing_peer_package_is_skipped(monkeypatch):
    """A peer whose package is not installed is skipped with one console line naming the package and the extra,
    said once for the whole run, not per op; the JSON records the skip per op."""

    def missing_torch_peer():
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    def factory(size):
        a = jnp.ones((8, 8), jnp.float32)
        return harness.BenchCase(
            op="tiny",
            size=size,
            fn=lambda x: x @ x,
            args=(a,),
            peers={"torch_eager": missing_torch_peer},
            op_by_op=False,
        )

    monkeypatch.setattr(harness, "registry", lambda: {"tiny_a": factory, "tiny_b": factory})
    lines: list[str] = []
    doc = harness.run(["tiny_a", "tiny_b"], ["small"], repeats=1, log=lines.append)
    said = [ln for ln in lines if "skipped" in ln]
    assert len(said) == 1 and "torch" in said[0] and "pip install '.[peers]'" in said[0], lines
    assert all("torch" in r["peers"]["torch_eager"]["skipped"] for r in doc["results"])
