"""The opt-in host FFT backend (ivhl_jax.numerics.spectral, fft="ducc") against XLA's FFTs, through the GP solver."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import condensate as C
from ivhl_jax.numerics.rollout import trajectory


def _gp_evolve(psi, system, dt, steps, save_every=1, *, project_norm=None, remat=False, policy=None):
    """``steps`` condensate Strang steps from ψ recording ``condensate.observe`` (builder + trajectory)."""
    st = C.strang(system, dt, project_norm=project_norm, policy=policy)
    return trajectory(st, st.init(psi), steps, save_every=save_every, observe=C.observe, remat=remat)


@pytest.mark.parametrize("shape,omega", [((64,), 0.0), ((12, 12, 12), 0.0), ((24, 24), 0.5)])
def test_host_fft_backend_equals_xla_forward_and_grad(shape, omega):
    pytest.importorskip("ducc0")
    grid = C.Grid.uniform(shape, [8.0] * len(shape))
    x = jnp.asarray(grid.coords[0], jnp.float32).reshape((-1,) + (1,) * (len(shape) - 1))
    psi = C.gaussian(grid) * jnp.exp(0.3j * x)
    systems = {fft: C.GPSystem.create(grid, C.harmonic(grid), 50.0, omega, fft=fft) for fft in ("xla", "ducc")}
    out = {k: jax.jit(lambda p, s=s: _gp_evolve(p, s, 1e-3, 20, 10))(psi) for k, s in systems.items()}
    np.testing.assert_allclose(np.asarray(out["ducc"][0]), np.asarray(out["xla"][0]), atol=2e-6)
    np.testing.assert_allclose(np.asarray(out["ducc"][1]["norm"]), np.asarray(out["xla"][1]["norm"]), rtol=1e-6)

    def loss(c, s):  # gradient through evolve (remat) w.r.t. an imprinted momentum
        q, _ = _gp_evolve(psi * jnp.exp(1j * c * x), s, 1e-3, 10, 10, remat=True)
        return jnp.sum(jnp.real(q) * x)

    ga, gb = (float(jax.grad(loss)(0.2, systems[k])) for k in ("xla", "ducc"))
    assert abs(ga - gb) <= 1e-5 * abs(ga), (ga, gb)


def test_host_fft_backend_vmap_dt_grad_and_errors():
    pytest.importorskip("ducc0")
    grid = C.Grid.uniform((24, 24), 8.0)
    psi = C.gaussian(grid)

    def run(g, fft):
        return _gp_evolve(psi, C.GPSystem.create(grid, C.harmonic(grid), g, fft=fft), 1e-3, 10, 10)[0]

    gs = jnp.array([10.0, 50.0, 100.0])
    np.testing.assert_allclose(
        np.asarray(jax.vmap(lambda g: run(g, "ducc"))(gs)), np.asarray(jax.vmap(lambda g: run(g, "xla"))(gs)), atol=2e-6
    )
    x = jnp.asarray(grid.coords[0], jnp.float32)[:, None]

    def ldt(dt, fft):  # the kinetic factor's cotangent (d/d dt) through the custom VJP
        st = C.strang(C.GPSystem.create(grid, C.harmonic(grid), 50.0, fft=fft), dt)
        return jnp.sum(jnp.real(st.step(st.init(psi * jnp.exp(0.5j * x)))) * x)

    ga, gb = (float(jax.grad(ldt)(1e-2, k)) for k in ("xla", "ducc"))
    assert abs(ga - gb) <= 1e-5 * abs(ga), (ga, gb)
    with pytest.raises(ValueError, match="fft"):
        C.GPSystem.create(grid, C.harmonic(grid), 1.0, fft="fftw")


def test_host_fft_keyed_factor_vmap_over_dt_grad_eviction(monkeypatch):
    """The kinetic factor of a ducc stepper is a spectral.HostFactor (host copy named by a traced key): a vmap over
    steppers of different dt sends a batch of keys; the factor's own cotangent is the operand path's; an evicted
    host copy is recomputed; a key from nowhere is an error naming the process-local registry."""
    pytest.importorskip("ducc0")
    from ivhl_jax.numerics import rollout, spectral

    grid = C.Grid.uniform((24, 24), 8.0)
    x = jnp.asarray(grid.coords[0], jnp.float32)[:, None]
    psi = C.gaussian(grid) * jnp.exp(0.3j * x)
    sys_d = C.GPSystem.create(grid, C.harmonic(grid), 50.0, fft="ducc")
    dts = (1e-3, 3e-3, 2e-3)
    steppers = [C.strang(sys_d, dt) for dt in dts]
    assert all(isinstance(st.params.plan.factors[0], spectral.HostFactor) for st in steppers)
    plans = jax.tree.map(lambda *a: jnp.stack(a), *(st.params.plan for st in steppers))

    def run(plan):
        return rollout.trajectory(
            steppers[0].replace(params=steppers[0].params.replace(plan=plan)), psi, 10, save_every=10
        )[0]

    batched = jax.vmap(run)(plans)
    for i, dt in enumerate(dts):
        ref = _gp_evolve(psi, sys_d.replace(fft="xla"), dt, 10, 10)[0]
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(ref), atol=2e-6)

    def loss(kin_value, keyed):  # gradient w.r.t. the factor itself (its cotangent comes from XLA FFTs)
        plan = steppers[0].params.plan
        kin = plan.factors[0].replace(value=kin_value) if keyed else kin_value
        q = steppers[0].replace(params=steppers[0].params.replace(plan=plan.replace(factors=(kin,)))).step(psi)
        return jnp.sum(jnp.real(q) * x)

    v = steppers[0].params.plan.factors[0].value
    np.testing.assert_allclose(
        np.asarray(jax.grad(loss)(v, True)), np.asarray(jax.grad(loss)(v, False)), rtol=1e-5, atol=1e-6
    )
    # a host cache too small for two factors: every lookup recomputes, same numbers
    monkeypatch.setattr(spectral, "HOST_CACHE_BYTES", 1)
    again = jax.vmap(run)(plans)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(batched))
    bogus = steppers[0].params.plan.factors[0].replace(key=jnp.asarray(10**9, jnp.int32))
    with pytest.raises(Exception, match="process-local"):
        jax.block_until_ready(spectral.spectral_multiply(psi, bogus, (0, 1), "ducc"))
