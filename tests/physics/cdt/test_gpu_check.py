"""The CDT section of bench.gpu_checks runs in its CPU-sized form, so it cannot rot between GPU runs."""

from __future__ import annotations

import pytest

from ivhl_jax.bench import ops_cdt
from ivhl_jax.physics.cdt import host as cdt_host


def _check(doc: dict, engines: tuple[str, ...]) -> None:
    assert {r["engine"] for r in doc["rows"]} == set(engines)
    for r in doc["rows"]:
        assert r["N2"] == 128 and not r["overflow"]
        assert 0.0 < r["acceptance"] <= 1.0 and r["accepted_per_s_aggregate"] > 0
        assert r["accepted_per_s_per_chain"] * r["chains"] == pytest.approx(r["accepted_per_s_aggregate"])
    for e in engines:
        assert doc["summary"][f"{e}_accepted_per_s"] > 0 and doc["summary"][f"{e}_best_chains"] >= 1


def test_gpu_check_quick_jax_engine():
    _check(ops_cdt.gpu_check(quick=True, engines=("jax",)), ("jax",))


@pytest.mark.slow  # the host kernel compiles on a cold numba cache
@pytest.mark.skipif(not cdt_host.available(), reason="needs numba")
def test_gpu_check_quick_both_engines():
    doc = ops_cdt.gpu_check(quick=True)
    _check(doc, ("jax", "host"))
    assert set(doc["summary"]) >= {"jax_accepted_per_s", "host_accepted_per_s", "jax_accepted_per_s_per_chain"}
