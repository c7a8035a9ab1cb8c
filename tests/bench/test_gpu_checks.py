"""bench/gpu_checks.py (the GPU check script) runs off GPU."""

from __future__ import annotations

import pytest


@pytest.mark.slow  # 8 s of the default suite's 10-minute budget: it runs in the slow step (make test-slow)
def test_gpu_checks_script_runs_off_gpu(tmp_path):
    """The GPU check script (bench/gpu_checks.py) in --quick mode on the CPU: sections run, failures are
    recorded rather than raised, and every attention path but compiled Pallas agrees with float64."""
    import json

    from ivhl_jax.bench import gpu_checks

    assert gpu_checks.main(["--quick", "--out", str(tmp_path), "--only", "ceilings", "--only", "attention_ok"]) == 0
    doc = json.loads((tmp_path / "gpu_checks.json").read_text())
    assert doc["sections"]["ceilings"]["matmul_bf16"]["tflops"] > 0
    recs = doc["sections"]["attention_ok"]["results"]
    assert {r["impl"] for r in recs} == {"xla", "cudnn", "chunked", "pallas"}
    for r in recs:
        if r["impl"] == "pallas" and r["masking"] == "causal":  # compiled Pallas needs a GPU: recorded, run goes on
            assert not r["ok"] and "error" in r
        else:  # (a boolean mask sends "pallas" to the chunked path, which runs anywhere)
            assert r["ok"], r


@pytest.mark.slow  # every section in CI-sized form: a few minutes on 2 cores
def test_every_gpu_check_section_runs_quick_on_cpu(tmp_path, capsys):
    """``--quick`` runs every section on the CPU, so the script cannot rot between GPU runs: no section fails
    as a whole, every family section reports a summary, and one table closes the run."""
    import json

    from ivhl_jax.bench import gpu_checks

    assert gpu_checks.main(["--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpu_checks.json").read_text())
    assert list(doc["sections"]) == list(gpu_checks.SECTIONS)
    failed = {name: res["error"] for name, res in doc["sections"].items() if "error" in res}
    assert not failed, failed
    for name in (*gpu_checks.FAMILY_SECTIONS, "steppers"):
        assert doc["sections"][name].get("summary"), name
    steppers = doc["sections"]["steppers"]
    assert {"fields", "condensate", "gft", "cdt", "mera", "adaptive", "gru"} <= set(steppers)
    for family in ("fields", "condensate", "gft", "cdt", "mera", "adaptive", "gru"):
        assert steppers[family].get("finite") is True, (family, steppers[family])
    for name in ("fields", "cdt", "mera", "adaptive"):  # every timed kernel as a fraction of the run's roofline
        assert _rooflines(doc["sections"][name]), name
    out = capsys.readouterr().out
    assert "section" in out and "steppers" in out.split("section", 1)[1]


_LIMITS = {"copy_gbps": 10.0, "matmul_f32_tflops": 0.1, "matmul_bf16_tflops": 0.1}


def _rooflines(node):
    """Every ``roofline`` record under ``node`` (``rooflines`` mappings included)."""
    if isinstance(node, dict):
        found = [node["roofline"]] if "roofline" in node else []
        found += list(node.get("rooflines", {}).values())
        return found + [r for k, v in node.items() if k not in ("roofline", "rooflines") for r in _rooflines(v)]
    if isinstance(node, list):
        return [r for v in node for r in _rooflines(v)]
    return []


def test_cost_records_become_rooflines_of_the_run_limits():
    """A timed kernel's ``cost`` (and each of a ``costs`` mapping), nested anywhere in a section's result, gets the
    roofline ivhl_jax.run.measure computes from the compiled program (the same numbers as ``measure.roofline``)."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.bench import gpu_checks
    from ivhl_jax.run import measure as tune

    x = jnp.ones((256, 256), jnp.float32)
    compiled = jax.jit(lambda a: a @ a + 1.0).lower(x).compile()
    res = {"results": [{"cost": tune.cost_record(compiled, 1e-3)}, {"costs": {"64": tune.cost_record(compiled, 2e-3)}}]}
    gpu_checks._add_fractions("fields", res, _LIMITS)
    want = tune.roofline(compiled, 1e-3, _LIMITS)
    assert want["flops"] >= 2 * 256**3 and want["fraction"] > 0
    assert res["results"][0]["roofline"] == want
    assert res["results"][1]["rooflines"]["64"] == tune.roofline(compiled, 2e-3, _LIMITS)
    assert res["limits_of_this_run"]["copy_gbps"] == 10.0


@pytest.mark.slow  # the four families' CPU-sized checks: about a minute on 2 cores
def test_family_sections_report_each_timed_kernel_as_a_roofline_fraction():
    """fields, cdt, mera and adaptive (CPU-sized) record XLA's flops and bytes of every timed compiled call, and
    gpu_checks turns them into fractions of the run's limits with ivhl_jax.run.measure's roofline."""
    from ivhl_jax.bench import gpu_checks, ops_adaptive, ops_cdt, ops_fields, ops_tn

    fields = ops_fields.gpu_check(quick=True)
    gpu_checks._add_fractions("fields", fields, _LIMITS)
    for rec in fields["results"]:
        assert set(rec["rooflines"]) == set(rec["chunks_ms"])  # one per timed block size
        assert all(r["flops"] > 0 and r["fraction"] > 0 for r in rec["rooflines"].values())
    cdt = ops_cdt.gpu_check(quick=True, engines=("jax",))
    gpu_checks._add_fractions("cdt", cdt, _LIMITS)
    assert all(r["roofline"]["bytes"] > 0 and r["roofline"]["fraction"] > 0 for r in cdt["rows"])
    import jax.numpy as jnp

    mera = {"sweeps": [ops_tn._time_sweeps(ops_tn._sweep_shape(2), jnp.float32, 1, 1)]}
    gpu_checks._add_fractions("mera", mera, _LIMITS)
    assert mera["sweeps"][0]["roofline"]["flops"] > 0 and mera["sweeps"][0]["roofline"]["fraction"] > 0
    adaptive = ops_adaptive.gpu_check(True)
    gpu_checks._add_fractions("adaptive", adaptive, _LIMITS)
    assert adaptive["record"]["roofline"]["fraction"] > 0
    assert adaptive["limits_of_this_run"]["copy_gbps"] == 10.0
    for r in _rooflines([fields, cdt, mera, adaptive]):
        assert r["bound"] in ("memory", "compute") and r["seconds"] > 0
