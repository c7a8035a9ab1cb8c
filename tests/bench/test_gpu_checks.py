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
    out = capsys.readouterr().out
    assert "section" in out and "steppers" in out.split("section", 1)[1]
