"""The per-backend defaults table (ivhl_jax.core.backend)."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from ivhl_jax.core import backend

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_platform_has_a_row_and_unknown_ones_get_the_portable_row():
    for name in backend.PLATFORMS:
        assert isinstance(backend.TABLE[name], backend.Defaults)
    assert backend.defaults("some-new-plugin") == backend.TABLE["portable"]
    # the portable row is never the CPU-only choice
    assert backend.TABLE["portable"].fields_chunking == "memory"
    assert backend.TABLE["portable"].cdt_engine != "host"
    assert not backend.TABLE["portable"].host_fft


def test_defaults_follow_the_current_platform():
    assert backend.defaults() == backend.TABLE.get(backend.platform(), backend.TABLE["portable"])


def test_override_is_scoped_and_validated():
    before = backend.defaults()
    with backend.override(fields_pair_budget=1024) as row:
        assert row.fields_pair_budget == 1024
        assert backend.defaults().fields_pair_budget == 1024
        assert any(r["setting"] == "fields_pair_budget" and r["source"] == "override()" for r in backend.describe())
    assert backend.defaults() == before
    with pytest.raises(ValueError, match="unknown backend setting"):
        with backend.override(fields_chunk=3):
            pass
    with pytest.raises(ValueError, match="fields_chunking"):
        with backend.override(fields_chunking="fast"):
            pass


def test_configure_sets_one_platform_until_reset():
    try:
        row = backend.configure("gpu", fields_memory_fraction=0.1)
        assert row.fields_memory_fraction == 0.1
        assert backend.defaults("gpu").fields_memory_fraction == 0.1
        assert backend.defaults("cpu") == backend.TABLE["cpu"]
        with pytest.raises(ValueError, match="fields_memory_fraction"):
            backend.configure("gpu", fields_memory_fraction=2.0)
    finally:
        backend.reset()
    assert backend.defaults("gpu") == backend.TABLE["gpu"]


def test_every_measured_setting_names_an_existing_results_file():
    settings = {f.name for f in dataclasses.fields(backend.Defaults)}
    assert set(backend.EVIDENCE) <= settings
    for setting, per_platform in backend.EVIDENCE.items():
        for name, source in per_platform.items():
            assert name in backend.PLATFORMS, (setting, name)
            assert "../" not in source and "git show" not in source, f"{setting}/{name}: cite files in this repository"
            if source.startswith("unmeasured"):  # a choice never timed on this platform says so
                continue
            path = source.split(" ")[0]
            assert "—" in source, f"{setting}/{name}: say the command that made {path}"
            assert (ROOT / path).exists(), f"{setting}/{name}: {path} is missing"


def test_describe_lists_every_setting():
    rows = backend.describe("cpu")
    # every table setting, then (on the CPU) the XLA flags the tuning cache may hold
    assert [r["setting"] for r in rows] == [f.name for f in dataclasses.fields(backend.Defaults)] + ["xla_flags"]
    assert all(r["source"] for r in rows)


def test_describe_shows_what_runs_where_an_optional_package_is_missing(monkeypatch):
    """Without numba the CDT engine that runs is jax, without ducc0 no host FFT: `ivhl info` says so and why."""
    import sys

    monkeypatch.setitem(sys.modules, "numba", None)
    monkeypatch.setitem(sys.modules, "ducc0", None)
    rows = {r["setting"]: r for r in backend.describe("cpu")}
    assert backend.TABLE["cpu"].cdt_engine == "host" and backend.TABLE["cpu"].host_fft is True
    assert rows["cdt_engine"]["value"] == "'jax'" and "numba is not installed" in rows["cdt_engine"]["source"]
    assert "ivhl_jax[cpu-kernels]" in rows["cdt_engine"]["source"]
    assert rows["host_fft"]["value"] == "False" and "ivhl_jax[cpu-fft]" in rows["host_fft"]["source"]


def test_fft_ducc_without_ducc0_is_a_one_line_error_naming_the_extra(monkeypatch):
    import sys

    from ivhl_jax.numerics import spectral

    monkeypatch.setitem(sys.modules, "ducc0", None)
    with pytest.raises(ValueError, match=r"fft='ducc' needs the ducc0 package.*ivhl_jax\[cpu-fft\]"):
        spectral.check_backend("ducc")
