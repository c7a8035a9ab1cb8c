"""GPU check of the condensate family's extra terms: dissipation (``GPSystem.create(gamma=)``), two-component
mixtures, spin-1 and dipolar interactions, and the Lee–Huang–Yang terms of dipolar and mixture condensates (timed
against the same equation without them, interleaved), each through the family's one door ``condensate.strang``.

Each record holds, measured on the device: the time of one jitted block of steps (median of calls waited on,
ms per step), the conserved quantities' drift over the block in float32 (each N_i of a mixture; N and M of a
spin-1 state; the norm of a dipolar run; for the damped run, whether the energy fell at every record while N
was held), and the float32 state's distance from the float64 one after the same steps (max |ψ₃₂ − ψ₆₄| /
max |ψ₆₄|, the accuracy of the f32 policy against f64; bf16 is refused by every condensate solver).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ivhl_jax.bench.harness import gpu_check_main, median_ms, run_checks


def _f32_vs_f64(build, psi_np, steps: int) -> float:
    """max |ψ₃₂ − ψ₆₄| / max |ψ₆₄| after ``steps`` steps of ``build(dtype)`` from the same start."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.numerics.rollout import trajectory

    outs = {}
    for name, rdt, cdt in (("f32", jnp.float32, jnp.complex64), ("f64", jnp.float64, jnp.complex128)):
        with jax.enable_x64(name == "f64"):
            st = build(rdt)
            psi = st.init(jnp.asarray(psi_np, cdt))
            outs[name] = np.asarray(trajectory(st, psi, steps, save_every=steps)[0])
    return float(np.max(np.abs(outs["f32"] - outs["f64"])) / np.max(np.abs(outs["f64"])))


def _timed_block(st, psi, steps: int, observe, reps: int):
    import jax

    from ivhl_jax.numerics.rollout import trajectory

    final, rec = trajectory(st, psi, steps, save_every=max(1, steps // 10), observe=observe)
    ms = median_ms(lambda: jax.block_until_ready(trajectory(st, psi, steps, save_every=steps)[0]), reps)
    return final, rec, ms / steps


def _timed_check(system, start, dt: float, steps: int, observe, reps: int, f32_steps: int):
    """``system(float32)`` stepped from ``start`` (:func:`_timed_block`): (final ψ, records, {"ms_per_step",
    "f32_vs_f64" after ``f32_steps`` steps})."""
    import jax.numpy as jnp

    from ivhl_jax.physics import condensate as C

    st = C.strang(system(jnp.float32), dt)
    final, rec, ms = _timed_block(st, st.init(jnp.asarray(start, jnp.complex64)), steps, observe, reps)
    accuracy = _f32_vs_f64(lambda rdt: C.strang(system(rdt), dt), start, f32_steps)
    return final, rec, {"ms_per_step": ms, "f32_vs_f64": accuracy}


def check_damped(n: int = 512, steps: int = 200, reps: int = 3) -> dict:
    """A rotating 2-D trap (Ω = 0.8, gN = 500, γ = 0.03) on an n² grid over a 24² box."""
    import jax.numpy as jnp

    from ivhl_jax.physics import condensate as C

    def system(rdt):
        grid = C.Grid.uniform((n, n), 24.0)
        return C.GPSystem.create(grid, C.harmonic(grid, dtype=rdt), 500.0, 0.8, gamma=0.03)

    sys32 = system(jnp.float32)
    x, y = np.meshgrid(*sys32.grid.coords, indexing="ij")
    r2 = x * x + y * y
    start = np.sqrt(np.maximum(0.0, 16.0 - r2)) * (1 + 0.01 * np.random.default_rng(0).standard_normal(r2.shape))
    start = start / np.sqrt(np.sum(start**2) * sys32.grid.cell_volume)
    observe = lambda p, prm: C.energy(p, prm.system)["total"]  # noqa: E731
    final, energy, timing = _timed_check(system, start, 2e-3, steps, observe, reps, 20)
    e = np.asarray(energy)
    return {
        "n": n,
        "steps": steps,
        "energy_monotone": bool(np.all(np.diff(e) < 0)),
        "norm_error": float(abs(float(C.norm(final, sys32.grid)) - 1.0)),
        **timing,
    }


def check_mixture(n: int = 512, steps: int = 200, reps: int = 3) -> dict:
    """Two components in a 2-D trap (g₁₁ = 100, g₂₂ = 90, g₁₂ = 80), displaced Gaussians, n² over a 16² box."""
    import jax.numpy as jnp

    from ivhl_jax.physics import condensate as C

    def system(rdt):
        grid = C.Grid.uniform((n, n), 16.0)
        g = np.array([[100.0, 80.0], [80.0, 90.0]])
        return C.MixtureSystem.create(grid, C.harmonic(grid, dtype=rdt), jnp.asarray(g, rdt))

    sys32 = system(jnp.float32)
    x, y = np.meshgrid(*sys32.grid.coords, indexing="ij")
    start = np.stack([np.exp(-((x - 0.5) ** 2 + y**2) / 2), np.exp(-((x + 0.5) ** 2 + y**2) / 2)]).astype(complex)
    start = start / np.sqrt(np.sum(np.abs(start) ** 2, axis=(1, 2), keepdims=True) * sys32.grid.cell_volume)
    observe = lambda p, prm: C.component_norms(p, prm.system.grid)  # noqa: E731
    _, norms, timing = _timed_check(system, start, 2e-3, steps, observe, reps, 20)
    return {
        "n": n,
        "steps": steps,
        "max_component_norm_drift": float(np.max(np.abs(np.asarray(norms) - 1.0))),
        **timing,
    }


def check_spin1(n: int = 512, steps: int = 200, reps: int = 3) -> dict:
    """Spin-1 in a 2-D trap (c₀ = 100, c₂ = −5, p = 0, q = 0.1), a transverse-spin start, n² over a 16² box."""
    import jax.numpy as jnp

    from ivhl_jax.physics import condensate as C

    def system(rdt):
        grid = C.Grid.uniform((n, n), 16.0)
        return C.Spin1System.create(grid, C.harmonic(grid, dtype=rdt), 100.0, -5.0, p=0.0, q=0.1)

    sys32 = system(jnp.float32)
    x, y = np.meshgrid(*sys32.grid.coords, indexing="ij")
    env = np.exp(-(x**2 + y**2) / 2)
    start = np.stack([0.5 * env, np.sqrt(0.5) * env * np.exp(1j * 0.3 * x), 0.5 * env]).astype(complex)
    start = start / np.sqrt(np.sum(np.abs(start) ** 2) * sys32.grid.cell_volume)

    def observe(p, prm):
        return {"n": jnp.sum(C.component_norms(p, prm.system.grid)), "m": C.magnetization(p, prm.system.grid)}

    _, rec, timing = _timed_check(system, start, 2e-3, steps, observe, reps, 20)
    n_rec, m_rec = np.asarray(rec["n"]), np.asarray(rec["m"])
    return {
        "n": n,
        "steps": steps,
        "norm_drift": float(np.max(np.abs(n_rec - 1.0))),
        "magnetization_drift": float(np.max(np.abs(m_rec - m_rec[0]))),
        **timing,
    }


def check_dipolar(n: int = 128, steps: int = 100, reps: int = 3) -> dict:
    """A dipolar 3-D cloud (g = 500, ε_dd = 0.5 along z, spherical cutoff) from a Gaussian, n³ over a 16³ box."""
    import jax.numpy as jnp

    from ivhl_jax.physics import condensate as C

    def system(rdt):
        grid = C.Grid.uniform((n, n, n), 16.0)
        dip = C.Dipolar.create(eps_dd=0.5, axis=(0.0, 0.0, 1.0), cutoff=7.0)
        return C.DipolarSystem.create(grid, C.harmonic(grid, dtype=rdt), 500.0, dip)

    sys32 = system(jnp.float32)
    x, y, z = np.meshgrid(*sys32.grid.coords, indexing="ij")
    start = np.exp(-(x**2 + y**2 + 0.5 * z**2) / 2).astype(complex)
    start = start / np.sqrt(np.sum(np.abs(start) ** 2) * sys32.grid.cell_volume)
    _, norms, timing = _timed_check(system, start, 1e-3, steps, lambda p, prm: C.norm(p, prm.system.grid), reps, 10)
    return {"n": n, "steps": steps, "norm_drift": float(np.max(np.abs(np.asarray(norms) - 1.0))), **timing}


def lhy_pair(kind: str, n: int, rdt) -> tuple:
    """(system without LHY, system with it, start ψ) of ``kind``: a ¹⁶⁴Dy-like cloud in the droplet regime (a_s =
    0.005 a_ho, g = 4πa_s, ε_dd = 1.3, γ_QF from ``lhy=True``, peak density 6400 a_ho⁻³) or a two-component mixture
    beyond the mean-field collapse (g₁₁ = g₂₂ = 0.5, g₁₂ = −1.1√(g₁₁g₂₂), peak densities 100), n³ over a 16³ box in a
    harmonic trap."""
    from ivhl_jax.physics import condensate as C

    grid = C.Grid.uniform((n, n, n), 16.0)
    v = C.harmonic(grid, dtype=rdt)
    x, y, z = np.meshgrid(*grid.coords, indexing="ij")
    blob = np.exp(-(x**2 + y**2 + 0.5 * z**2) / 2)
    plain: Any
    with_lhy: Any
    if kind == "dipolar":
        dip = C.Dipolar.create(eps_dd=1.3, cutoff=7.0)
        g = 4 * np.pi * 0.005
        plain, with_lhy = (C.DipolarSystem.create(grid, v, g, dip, lhy=on) for on in (False, True))
        start = blob * 80.0
    else:
        gm = [[0.5, -0.55], [-0.55, 0.5]]
        plain, with_lhy = (C.MixtureSystem.create(grid, v, gm, lhy=on) for on in (False, True))
        start = np.stack([blob, blob]) * 10.0
    return plain, with_lhy, start.astype(complex)


def check_lhy(kind: str, n: int = 128, steps: int = 50, rounds: int = 15) -> dict:
    """Step time with the LHY term against the same equation without it, interleaved round by round (per-round
    ratio with/without: 1 when the n^{3/2} term costs no extra pass over the field), and the float32 state's
    distance from float64 after 10 steps with LHY."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.bench.harness import interleaved_rounds
    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.physics import condensate as C

    plain, with_lhy, start = lhy_pair(kind, n, jnp.float32)
    calls = {}
    for name, system in (("plain", plain), ("lhy", with_lhy)):
        st = C.strang(system, 1e-3)
        psi = st.init(jnp.asarray(start, jnp.complex64))
        run = jax.jit(lambda p, st=st: trajectory(st, p, steps, save_every=steps)[0])
        jax.block_until_ready(run(psi))  # compile apart
        calls[name] = lambda run=run, psi=psi: jax.block_until_ready(run(psi))
    wall, _ = interleaved_rounds(calls, rounds)
    ratios = [a / b for a, b in zip(wall["lhy"], wall["plain"])]
    return {
        "n": n,
        "steps": steps,
        "rounds": rounds,
        "ms_per_step": 1e3 * float(np.median(wall["lhy"])) / steps,
        "ms_per_step_plain": 1e3 * float(np.median(wall["plain"])) / steps,
        "ratio_lhy_over_plain_per_round": dict(
            zip(("q1", "median", "q3"), map(float, np.percentile(ratios, [25, 50, 75])))
        ),
        "f32_vs_f64": _f32_vs_f64(lambda rdt: C.strang(lhy_pair(kind, n, rdt)[1], 1e-3), start, 10),
    }


def _line(name: str):
    def line(rec: dict) -> str:
        drift = {k: v for k, v in rec.items() if "drift" in k or k in ("norm_error", "energy_monotone")}
        return (
            f"{name} {rec['n']}^d: {rec['ms_per_step']:.3f} ms/step, "
            + ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}" for k, v in drift.items())
            + f", f32 vs f64 {rec['f32_vs_f64']:.1e}"
            + (f", LHY/plain {rec['ratio_lhy_over_plain_per_round']['median']:.3f}" if "rounds" in rec else "")
        )

    return line


def gpu_check(quick: bool = False) -> dict:
    """The four terms on this device (``quick``: CPU-sized, seconds). Returns the records and a ``summary``
    (:func:`ivhl_jax.bench.harness.run_checks`)."""
    checks = {
        "damped": lambda: check_damped(48, 40, 1) if quick else check_damped(),
        "mixture": lambda: check_mixture(32, 40, 1) if quick else check_mixture(),
        "spin1": lambda: check_spin1(32, 40, 1) if quick else check_spin1(),
        "dipolar": lambda: check_dipolar(16, 20, 1) if quick else check_dipolar(),
        "dipolar_lhy": lambda: check_lhy("dipolar", 16, 10, 3) if quick else check_lhy("dipolar"),
        "mixture_lhy": lambda: check_lhy("mixture", 16, 10, 3) if quick else check_lhy("mixture"),
    }
    return run_checks({name: (run, _line(name)) for name, run in checks.items()})


def main(argv=None) -> int:
    """``python -m ivhl_jax.bench.ops_condensate_terms --out FILE [--quick]``: :func:`gpu_check` on this device,
    written as JSON with the command that made it."""
    return gpu_check_main("ops_condensate_terms", gpu_check, argv)


if __name__ == "__main__":
    raise SystemExit(main())
