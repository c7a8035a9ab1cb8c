"""The CDT defaults give the right answer: the stepper built with only the required arguments, and every CDT code
example of README.md and docs/guide/cdt.md run as written, against the exact answer where one exists.

The exact answer is the transfer matrix (``cdt.exact_mean_length``: ⟨l_t⟩ on a torus of T slices in the
grand-canonical ensemble) or, with volume fixing, the exact fixed-volume law at the measurements at the target.
Error bars are honest: per chain the autocorrelation-corrected error of the mean (Sokal's window,
``numerics.statistics.mean_with_error``), combined over independent chains, and never smaller than the scatter of
the chain means. Tolerance: ``Z_MAX`` standard errors.
"""

from __future__ import annotations

import math
import re
import textwrap
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest

from ivhl_jax import cdt, trajectory
from ivhl_jax.numerics import statistics
from ivhl_jax.physics.cdt import host as cdt_host

ROOT = Path(__file__).resolve().parents[2]
Z_MAX = 4.0  # standard errors: a correct sampler fails a test with probability 6e-5


def mean_length_with_error(lengths) -> tuple[float, float]:
    """⟨l_t⟩ and its standard error from ``lengths`` (chains, measurements, T) of independent chains.

    Each chain's series of slice-averaged lengths gets its autocorrelation-corrected error; the chains combine
    as independent means; the error is the larger of that and the standard error of the chain means."""
    x = np.asarray(lengths, np.float64).mean(-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # short series: the spread of chain means covers it
        per_chain = [statistics.mean_with_error(xc) for xc in x]
    means = np.array([m for m, _, _ in per_chain])
    errs = np.array([e for _, e, _ in per_chain])
    c = len(means)
    err = max(math.sqrt(float(np.sum(errs**2))) / c, float(means.std(ddof=1)) / math.sqrt(c))
    return float(means.mean()), err


def run_default(
    lam: float,
    n_slices: int,
    chains: int,
    sweeps: int,
    thermal: int,
    *,
    seed: int = 0,
    length: int = 3,
    capacity: int | None = None,
    engine: str | None = None,
):
    """``sweeps`` measured sweeps (one measurement each, after ``thermal``) of ``chains`` chains of the stepper a
    user builds from ``metropolis(lam)``, started on the regular torus of ``n_slices`` slices of ``length``."""
    st = cdt.metropolis(lam) if engine is None else cdt.metropolis(lam, engine=engine)
    keys = jax.random.split(jax.random.key(seed), chains)
    args = () if capacity is None else (capacity,)
    chains0 = jax.vmap(lambda k: st.init(k, n_slices, length, *args))(keys)

    @jax.jit
    def run(st, c):
        c = jax.vmap(lambda ci: trajectory(st, ci, thermal, save_every=thermal, observe=cdt.observe))(c)[0]
        return jax.vmap(lambda ci: trajectory(st, ci, sweeps, save_every=1, observe=cdt.observe))(c)

    final, obs = run(st, chains0)
    assert not bool(np.any(np.asarray(final.geometry.overflow))), "an insertion hit the capacity"
    return obs


def assert_matches_exact(lengths, lam: float, n_slices: int) -> None:
    mean, err = mean_length_with_error(lengths)
    exact = cdt.exact_mean_length(lam, n_slices)
    z = (mean - exact) / err
    print(f"lam={lam} T={n_slices}: <l> = {mean:.4f} +- {err:.4f}, exact {exact:.4f}, z = {z:+.2f}")
    assert abs(z) < Z_MAX, f"<l> = {mean:.4f} +- {err:.4f} against the exact {exact:.4f} ({z:+.1f} standard errors)"


# --- the default stepper, grand-canonical -----------------------------------------------------------------------


def test_default_sweep_samples_the_exact_slice_length_law():
    """``cdt.metropolis(lam)`` with nothing else: ⟨l_t⟩ at λ = 0.8, T = 3 against the transfer matrix."""
    obs = run_default(0.8, 3, chains=32, sweeps=600, thermal=100)
    assert_matches_exact(obs["lengths"], 0.8, 3)


@pytest.mark.slow
def test_default_sweep_reproduction_64_chains_4000_sweeps():
    """The reproduction of the biased default (64 chains, λ = 0.8, T = 3, 4000 sweeps; 27 standard errors off
    when a sweep was N2 attempts of the state it started from)."""
    obs = run_default(0.8, 3, chains=64, sweeps=4000, thermal=200, seed=1)
    assert_matches_exact(obs["lengths"], 0.8, 3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine", [pytest.param("host", marks=pytest.mark.skipif(not cdt_host.available(), reason="needs numba")), "pallas"]
)
def test_default_sweep_on_the_other_engines(engine):
    """The same default on the host engine (its own default proposals) and the Pallas engine (interpreted here)."""
    chains, sweeps = (32, 600) if engine == "host" else (32, 150)
    obs = run_default(0.8, 3, chains=chains, sweeps=sweeps, thermal=50, engine=engine, seed=2)
    assert_matches_exact(obs["lengths"], 0.8, 3)


@pytest.mark.slow
def test_readme_setup_many_chains_matches_the_transfer_matrix():
    """The README's example (``metropolis(0.8)``, ``init(key, 8, 20, 2000)``) run long on many chains."""
    obs = run_default(0.8, 8, chains=64, sweeps=1500, thermal=200, length=20, capacity=2000, seed=3)
    assert_matches_exact(obs["lengths"], 0.8, 8)


@pytest.mark.slow
def test_default_volume_fixed_sweep_samples_the_exact_fixed_volume_law():
    """``metropolis(ln 2, eps=0.05, target=30)`` with nothing else (sweeps of 30 attempts), measured where
    ``at_target``: ⟨l_t²⟩ against the exact law of the slice lengths at N0 = 15, T = 3
    (``cdt.exact_fixed_volume_distribution``). <l_t> = N0 / T holds by construction; the second moment tests the
    ensemble (``tests/physics/cdt/test_fixed_volume.py`` resolves it to 0.01 %)."""
    exact = cdt.exact_fixed_volume_distribution(3, 15)
    l2 = float(sum(p * np.mean(np.square(v)) for v, p in exact.items()))
    st = cdt.metropolis(cdt.LN2, eps=0.05, target=30)
    chains = jax.vmap(lambda k: st.init(k, 3, 3))(jax.random.split(jax.random.key(4), 128))
    run = jax.jit(jax.vmap(lambda s, c: trajectory(s, c, 600, save_every=1, observe=cdt.observe), in_axes=(None, 0)))
    final, obs = run(st, chains)
    at = np.asarray(obs["at_target"])[:, 100:]
    np.testing.assert_array_equal(at, np.asarray(obs["n2"])[:, 100:] == 30)
    assert int(np.asarray(final.geometry.missed_target).sum()) == 0  # sweeps are never extended
    sq = cdt.at_target_mean(np.asarray(obs["lengths"], np.float64)[:, 100:] ** 2, at, axis=(1, 2))  # per chain
    mean, err = float(sq.mean()), float(sq.std(ddof=1)) / math.sqrt(len(sq))
    print(f"<l_t^2> at N2 = 30 ({at.mean():.2f} of the sweeps): {mean:.3f} +- {err:.3f}, exact {l2:.3f}")
    assert abs(mean - l2) < Z_MAX * err


# --- the code examples of README.md and docs/guide/cdt.md, run as written ----------------------------------------


def _cdt_blocks(page: str) -> list[str]:
    text = (ROOT / page).read_text(encoding="utf-8")
    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "cdt." in b]


def _run_block(page: str, marker: str) -> dict:
    blocks = [b for b in _cdt_blocks(page) if marker in b]
    assert len(blocks) == 1, f"{page}: expected one CDT example containing {marker!r}, found {len(blocks)}"
    namespace: dict = {}
    exec(compile(blocks[0], page, "exec"), namespace)  # noqa: S102 - the project's own documented example
    return namespace


def test_every_cdt_example_is_covered():
    """A new CDT example in the README or the guide must be added here (with its exact answer where one exists)."""
    assert len(_cdt_blocks("README.md")) == 1
    assert len(_cdt_blocks("docs/guide/cdt.md")) == 4


@pytest.mark.slow
def test_guide_2plus1_jax_engine_example_runs_eight_valid_chains():
    """The guide's JAX-engine example as written (8 vmapped chains, 2 sweeps of 500 attempts): every final
    triangulation passes the full invariant check, the chains differ (their own keys), and each measurement's
    slice volumes sum to the recorded N(3,1) / 2 (one spatial triangle per (3,1) and per (1,3) pair)."""
    from ivhl_jax.physics.cdt import d3_checks

    ns = _run_block("docs/guide/cdt.md", 'engine="jax"')
    final, obs = ns["final"], ns["obs"]
    geo = final.geometry
    bufs = np.asarray(geo.buf)
    assert bufs.shape[0] == 8
    for b in bufs:
        d3_checks.check(b, geo.tetra_capacity, geo.n_slices)
    assert len({d3_checks.canonical(b, geo.tetra_capacity, geo.n_slices) for b in bufs}) == 8
    np.testing.assert_array_equal(2 * np.asarray(obs["slice_volumes"]).sum(-1), np.asarray(obs["n31"]))


@pytest.mark.slow
def test_guide_2plus1_example_reproduces_its_quoted_figures():
    """The guide's 2+1D example as written (k0 = 5, target N(3,1) = 500, T = 16, the reference's measurement rule):
    every measurement at the target, the slices carrying it, ⟨N22⟩/⟨N31⟩ within four combined errors of both runs
    of the same settings the guide quotes (bench/results/cdt3_vs_reference*.json), and a one-blob de Sitter fit.
    The fitted s is not compared: at this run length it scatters by more than its error (the guide says so)."""
    import json

    ns = _run_block("docs/guide/cdt.md", "cdt.metropolis_3d(5.0")
    obs = ns["obs"]
    assert bool(np.all(np.asarray(obs["at_target"])))
    np.testing.assert_array_equal(np.asarray(obs["slice_volumes"]).sum(-1), 500)
    np.testing.assert_array_equal(np.asarray(obs["n31"]), 1000)
    for name in ("cdt3_vs_reference.json", "cdt3_vs_reference_seed2.json"):
        quoted = json.loads((ROOT / "bench" / "results" / name).read_text())["ours"]
        r = quoted["n22_over_n31"]
        assert abs(ns["ratio"] - r["value"]) < 4 * math.hypot(ns["ratio_err"], r["error"]), (ns["ratio"], r)
    fit = ns["fit"]
    assert fit.s > 0 and fit.dof >= 2 and fit.chi2 / fit.dof < 3, fit


def test_readme_example_runs_and_relaxes_to_the_exact_volume(capsys):
    """The README's first example (λ = 0.8, T = 8 from slices of 20, one chain, 100 sweeps) as written: the
    volume leaves the starting N2 = 320 for the exact 2 T <l_t> of the transfer matrix (about 76); the precise
    check of these settings is the slow test above."""
    ns = _run_block("README.md", "ivhl.trajectory(st, chain")
    assert capsys.readouterr().out.strip().startswith("[")
    n2 = np.asarray(ns["obs"]["n2"], np.float64)
    exact = 2 * 8 * cdt.exact_mean_length(0.8, 8)
    assert n2.shape == (10,) and not bool(ns["chain"].geometry.overflow)
    assert abs(n2[5:].mean() - exact) < 0.35 * exact, (n2, exact)


@pytest.mark.slow
def test_guide_lambda_batch_example_matches_the_transfer_matrix():
    """The guide's batch over λ (16 chains per λ by vmap, defaults otherwise): ⟨l_t⟩ per λ against the exact
    value quoted next to it."""
    ns = _run_block("docs/guide/cdt.md", "cdt.metropolis(lams)")
    lengths = np.asarray(ns["obs"]["lengths"])[:, :, 50:]
    assert lengths.shape == (3, 16, 450, 3)
    assert not bool(np.any(np.asarray(ns["chains"].geometry.overflow)))
    for lam, per_lam in zip(np.asarray(ns["lams"]).tolist(), lengths):
        assert_matches_exact(per_lam, lam, 3)
    np.testing.assert_allclose(np.asarray(ns["means"]), lengths.mean((1, 2, 3)), rtol=1e-5)


@pytest.mark.slow
def test_guide_volume_fixed_example_measures_at_the_target():
    """The guide's first example (volume fixing at N2 = 512, 32 chains, 200 sweeps) as written: ``at_target`` marks
    exactly the measurements at N2 = 512, about a sixth of them (the volume term's width 1/sqrt(2 eps) = 5), their
    mean profile sums to N0 = 256 (⟨l_t⟩ = 512 / (2 T) = 16 exactly), no sweep extended, no overflow."""
    ns = _run_block("docs/guide/cdt.md", "target=512")
    n2, at = np.asarray(ns["obs"]["n2"]), np.asarray(ns["obs"]["at_target"])
    assert n2.shape == (32, 100)
    np.testing.assert_array_equal(at, n2 == 512)
    assert 0.08 < at.mean() < 0.3
    np.testing.assert_allclose(np.asarray(ns["profile"]).mean(), 16.0, rtol=1e-6)
    assert int(np.asarray(ns["chains"].geometry.missed_target).sum()) == 0
    assert not bool(np.any(np.asarray(ns["chains"].geometry.overflow)))
