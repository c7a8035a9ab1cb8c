"""bench/gpu_checks.py (the GPU check script) runs off GPU."""

from __future__ import annotations

import math

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


def test_plan_packs_sections_into_six_minute_calls_with_tune_first(tmp_path, capsys):
    """The planner: every section in exactly one call, each call's estimate within the limit, ``ivhl tune --quick``
    alone at the head of the first call; a budget leaves whole calls out (named); an estimate over a call gets a
    call of its own; earlier wall times replace the estimates."""
    from ivhl_jax.bench import gpu_checks as g

    plan = g.plan_calls(g.SECTIONS)
    assert plan["calls"][0]["tune"] and not any(c["tune"] for c in plan["calls"][1:])
    placed = [s for c in plan["calls"] for s in c["sections"]]
    assert sorted(placed) == sorted(s for s in g.SECTIONS if s != "tune")  # each once; tune is the CLI call
    assert all(c["estimate_s"] <= g.CALL_LIMIT_S for c in plan["calls"])
    assert all(c["sections"] == sorted(c["sections"], key=g.SECTIONS.index) for c in plan["calls"])
    total = sum(g.PLAN_MARGIN * g.SECTION_COSTS[s].estimate_s for s in placed) + g.PLAN_MARGIN * g.TUNE_ESTIMATE_S
    assert len(plan["calls"]) >= math.ceil(total / (g.CALL_LIMIT_S - g.CALL_OVERHEAD_S))
    assert plan["estimate_s"] == pytest.approx(sum(c["estimate_s"] for c in plan["calls"]), abs=0.2)

    cut = g.plan_calls(g.SECTIONS, budget_s=2 * g.CALL_LIMIT_S)
    assert len(cut["calls"]) == 2 and cut["estimate_s"] <= 2 * g.CALL_LIMIT_S
    kept = {s for c in cut["calls"] for s in c["sections"]}
    assert set(cut["left_out"]) == set(placed) - kept and cut["left_out"]

    big = g.plan_calls(["env", "gp", "fields"], with_tune=False, costs={"gp": 500.0}, call_limit_s=200.0)
    assert big["over_limit"] == ["gp"] and ["gp"] in [c["sections"] for c in big["calls"]]
    assert not any(c["tune"] for c in big["calls"])
    with pytest.raises(ValueError, match="sections: unknown"):
        g.plan_calls(["env", "nope"])
    with pytest.raises(ValueError, match="budget_s"):
        g.plan_calls(["env"], budget_s=0)

    assert g.main(["--plan", "--budget", "900", "--out", str(tmp_path), "--name", "b.json"]) == 0
    assert not (tmp_path / "b.json").exists()  # --plan prints only
    assert "call 1" in capsys.readouterr().out
    cmds = g.plan_commands(plan, "OUT")
    assert cmds[0].startswith("timeout ") and "ivhl_jax.cli tune --quick" in cmds[0]
    for k, (c, cmd) in enumerate(zip(plan["calls"], cmds, strict=True), 1):
        if c["sections"]:
            assert f"--sections {','.join(c['sections'])}" in cmd and f"gpu_checks_call{k}.json" in cmd
        assert sum(int(p.split()[1]) for p in cmd.split(" ; ")) <= g.CALL_LIMIT_S  # the timeouts fit the call
    script = g.plan_commands(plan, "OUT", script=True)
    assert "TUNE_TIMEOUT=" in script[0] and all("SKIP_TUNE=1" in cmd for cmd in script[1:])
    for c, cmd in zip(plan["calls"][1:], script[1:], strict=True):
        assert f"--sections {','.join(c['sections'])}" in cmd and cmd.endswith("bash bench/gpu_tune_and_check.sh")


@pytest.mark.slow  # a CPU run of two quick sections and the limits: 15-50 s on 2 shared cores
def test_budget_runs_the_first_planned_call_and_merge_lists_figures_and_fractions(tmp_path, capsys):
    """``--quick --budget`` on the CPU prints the plan and its commands, runs the first call's sections into a
    file whose ``figures`` give each section's figure and its fractions of the run's limits; ``--merge`` of two
    calls' files keeps every section once, in section order."""
    import json

    from ivhl_jax.bench import gpu_checks as g

    args = ["--quick", "--no-tune", "--out", str(tmp_path), "--sections", "gp_rounding,ceilings", "--budget", "900"]
    assert g.main([*args, "--name", "a.json"]) == 0
    out = capsys.readouterr().out
    assert "plan: 1 call(s)" in out and "--sections ceilings,gp_rounding" in out
    a = json.loads((tmp_path / "a.json").read_text())
    assert list(a["sections"]) == ["ceilings", "gp_rounding"] == a["plan"]["calls"][0]["sections"]
    assert a["sections"]["ceilings"]["matmul_bf16"]["tflops"] > 0
    assert "matmul_bf16" in a["figures"]["ceilings"]["figure"]
    assert a["figures"]["gp_rounding"]["fraction_of_limits"] is None  # it times nothing against the limits
    b = {"limits": _LIMITS, "sections": {"env": {"section_wall_s": 1.0}, "gp_rounding": {"section_wall_s": 2.0}}}
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert g.main(["--merge", str(tmp_path / "b.json"), str(tmp_path / "a.json"), "--out", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "gpu_checks.json").read_text())
    assert list(merged["sections"]) == ["env", "ceilings", "gp_rounding"]
    assert merged["sections"]["gp_rounding"]["section_wall_s"] != 2.0  # the later call's run wins
    assert [c["file"] for c in merged["calls"]] == ["b.json", "a.json"] and "provenance" in merged


def test_figures_collect_every_fraction_of_the_limits():
    """A section's fractions: roofline fractions, attention over the bf16 matmul rate, GP over the copy
    bandwidth and transformer MFU, wherever nested; the limits themselves are not counted."""
    from ivhl_jax.bench import gpu_checks as g

    doc = {
        "sections": {
            "gp": {"results": [{"fraction_of_copy_bandwidth_ideal": 0.5}, {"roofline": {"fraction": 0.25}}]},
            "transformer": {"results": [{"mfu_vs_measured_peak": 0.6}], "limits_of_this_run": {"fraction": 9.0}},
            "env": {"report": "x"},
        }
    }
    f = g.figures(doc)
    assert f["gp"]["figure"] == {"gp": "no summary"}
    assert f["transformer"]["figure"].startswith("no figure: KeyError")  # a record without the fields it reads
    assert f["gp"]["fraction_of_limits"] == {"min": 0.25, "median": 0.375, "max": 0.5, "kernels": 2}
    assert f["transformer"]["fraction_of_limits"]["max"] == 0.6
    assert f["env"]["fraction_of_limits"] is None


@pytest.mark.slow  # the Pallas field kernel in the interpreter, f32 and bf16 storage: ~80 s on 2 shared cores
def test_fields_section_times_the_pallas_kernel_beside_the_default(monkeypatch):
    """The fields section times each other kernel (the Pallas one, which ivhl tune races on GPUs) at float32 and
    bf16 storage beside the default: its error against float64 (of the bf16-rounded inputs at bf16 storage), its
    ratio to the default and its roofline; on a CPU it is left out unless asked for (it would be interpreted)."""
    from ivhl_jax.bench import gpu_checks, ops_fields
    from ivhl_jax.physics import fields_pallas

    monkeypatch.setattr(ops_fields, "QUICK_SIZES", ((300, 12),))
    assert ops_fields.gpu_check(quick=True)["results"][0]["kernels"] == {}
    doc = ops_fields.gpu_check(quick=True, kernels=("pallas",))
    kernels = doc["results"][0]["kernels"]
    assert set(kernels) == {"pallas", "pallas_bf16_storage"}, kernels
    assert kernels["pallas"]["err_vs_f64"] <= fields_pallas.STATED_ERROR
    assert kernels["pallas_bf16_storage"]["err_vs_f64"] <= 2.0**-7  # the bf16 rounding of Re/Im only
    assert all(k["ms"] > 0 and k["over_default"] > 0 for k in kernels.values())
    gpu_checks._add_fractions("fields", doc, _LIMITS)
    assert all(k["roofline"]["fraction"] > 0 for k in kernels.values())
    assert "pallas" in doc["summary"][0]
