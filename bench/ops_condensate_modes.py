"""GPU check of the condensate family's analysis tools: vortex tracking (2-D points over a batch of frames,
3-D vortex lines) and the Bogoliubov–de Gennes spectrum (``condensate.vortices``, ``condensate.vortex_lines``,
``condensate.bogoliubov``).

Each record holds a correctness figure measured on the device against an analytic reference (imprinted
vortex positions, the length 2πR of a vortex ring, the homogeneous dispersion ω(k) = √(ε_k(ε_k + 2gn)), the
Kohn mode at the trap frequency) and the time of the jitted call (median of calls waited on).
"""

from __future__ import annotations

import numpy as np

from ivhl_jax.bench.harness import gpu_check_main, median_ms, run_checks


def _vortex_frames(shape, frames: int):
    """``frames`` 2-D fields with 5 imprinted vortices (both signs, off-grid, drifting by 0.13 per frame)."""
    import jax.numpy as jnp

    from ivhl_jax.physics import condensate as C

    grid = C.Grid.uniform(shape, 20.0)
    centers = np.array([[1.03, 2.27], [-3.41, 0.58], [2.71, -2.93], [-1.17, -3.66], [0.07, 0.11]])
    charges = np.array([1, -1, 1, -1, 1])
    base = C.gaussian(grid, 1.0, 4.0)  # |ψ|² ~ 2e-3 of the peak at the edge: no wrap-around phase jump
    stack = jnp.stack(
        [C.imprint_vortices(base, grid, centers + 0.013 * t, charges, core_size=0.5) for t in range(frames)]
    )
    truth = np.stack([centers + 0.013 * t for t in range(frames)])
    return C, grid, stack, truth


def check_vortices(shape=(512, 512), frames: int = 64, reps: int = 5) -> dict:
    """2-D vortices of a batch of frames in one jitted call: max position error (grid spacings), ms per frame."""
    import jax

    C, grid, stack, truth = _vortex_frames(shape, frames)
    fn = jax.jit(lambda p: C.vortices(p, grid, max_vortices=16))
    out = fn(stack)
    pos, mask = np.asarray(out.positions), np.asarray(out.mask)
    err = 0.0
    for t in range(frames):
        found = pos[t][mask[t]]
        d = np.linalg.norm(found[None, :, :] - truth[t][:, None, :], axis=-1).min(axis=1)
        err = max(err, float(d.max()))
    ms = median_ms(lambda: jax.block_until_ready(fn(stack)), reps)
    return {
        "shape": list(shape),
        "frames": frames,
        "counts_ok": bool(np.all(np.asarray(out.count) == 5)),
        "max_position_error_dx": err / grid.dx[0],
        "ms_per_call": ms,
        "ms_per_frame": ms / frames,
    }


def check_vortex_lines(n: int = 128, reps: int = 5) -> dict:
    """A vortex ring of radius 3 in a 12³ box on n³ points: its traced length against 2πR, ms per call."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.physics import condensate as C

    grid = C.Grid.uniform((n, n, n), 12.0)
    x, y, z = (np.asarray(m, np.float64) for m in grid.mesh())
    radius, xi = 3.0, 0.4
    s = np.sqrt(x**2 + y**2)
    ring = ((s - radius) + 1j * z) / np.sqrt((s - radius) ** 2 + z**2 + xi**2) * np.exp(-(s**2 + z**2) / 18)
    psi = jnp.asarray(ring, jnp.complex64)
    fn = jax.jit(lambda p: C.vortex_lines(p, grid, max_points=16 * n, max_lines=8))
    out = fn(psi)
    ms = median_ms(lambda: jax.block_until_ready(fn(psi)), reps)
    return {
        "n": n,
        "n_lines": int(out.n_lines),
        "closed": bool(out.closed[0]),
        "length_rel_error": float(out.length[0]) / (2 * np.pi * radius) - 1,
        "ms_per_call": ms,
    }


def check_bogoliubov(n: int = 128, n_trap: int = 128, n_modes: int = 8, reps: int = 3) -> dict:
    """BdG spectra on the device in float32: the homogeneous dispersion on an n² periodic box (max relative
    error of the lowest ``n_modes``) and the Kohn mode of a 2-D trapped ground state (g = 50, n_trap² points over
    a 12² box; |ω − 1|), with times."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.physics import condensate as C

    out: dict = {"n": n, "n_trap": n_trap, "n_modes": n_modes, "dtype": "float32"}
    length, g, dens = 20.0, 2.0, 1.0
    grid = C.Grid.uniform((n, n), length)
    system = C.GPSystem.create(grid, jnp.zeros((n, n), jnp.float32), g)
    psi0 = jnp.full((n, n), np.sqrt(dens), jnp.complex64)
    modes = C.bogoliubov(jax.random.key(0), system, psi0, n_modes)
    k = 2 * np.pi * np.fft.fftfreq(n, length / n)
    eps = 0.5 * (k[:, None] ** 2 + k[None, :] ** 2).reshape(-1)
    exact = np.sort(np.sqrt(eps * (eps + 2 * g * dens)))[1 : n_modes + 1]
    out["homogeneous_max_rel_error"] = float(np.max(np.abs(np.asarray(modes.omega) / exact - 1)))
    out["homogeneous_iterations"] = int(modes.iterations)
    out["homogeneous_ms"] = median_ms(
        lambda: jax.block_until_ready(C.bogoliubov(jax.random.key(0), system, psi0, n_modes).omega), reps
    )
    trap = C.Grid.uniform((n_trap, n_trap), 12.0)
    tsys = C.GPSystem.create(trap, C.harmonic(trap), 50.0)
    gs, _ = C.ground_state(tsys, 1.0, dt=1e-2, tol=1e-9, max_steps=20000)
    gs, _ = C.ground_state(tsys, 1.0, dt=1e-3, tol=1e-9, max_steps=20000, psi0=gs)
    tm = C.bogoliubov(jax.random.key(0), tsys, gs, 4)
    out["kohn_abs_error"] = float(np.max(np.abs(np.asarray(tm.omega[:2]) - 1.0)))
    out["trap_omegas"] = [float(w) for w in np.asarray(tm.omega)]
    out["trap_iterations"] = int(tm.iterations)
    out["trap_ms"] = median_ms(lambda: jax.block_until_ready(C.bogoliubov(jax.random.key(0), tsys, gs, 4).omega), reps)
    return out


def _vortices_line(rec: dict) -> str:
    return (
        f"vortices {rec['shape']} x{rec['frames']}: max error {rec['max_position_error_dx']:.3f} dx, "
        f"{rec['ms_per_frame']:.3f} ms/frame"
    )


def _vortex_lines_line(rec: dict) -> str:
    return f"vortex ring {rec['n']}^3: length error {100 * rec['length_rel_error']:.2f} %, {rec['ms_per_call']:.2f} ms"


def _bogoliubov_line(rec: dict) -> str:
    return (
        f"BdG {rec['n']}^2 homogeneous: max rel error {rec['homogeneous_max_rel_error']:.1e} "
        f"({rec['homogeneous_ms']:.1f} ms); Kohn {rec['n_trap']}^2 |w-1| {rec['kohn_abs_error']:.1e} "
        f"({rec['trap_ms']:.1f} ms)"
    )


def gpu_check(quick: bool = False) -> dict:
    """Vortex tracking and BdG spectra on this device (``quick``: CPU-sized, seconds): correctness against the
    analytic references and ms per jitted call. Returns the records and a ``summary`` (one line each;
    :func:`ivhl_jax.bench.harness.run_checks`)."""
    return run_checks(
        {
            "vortices": (lambda: check_vortices((64, 64), 4, 2) if quick else check_vortices(), _vortices_line),
            "vortex_lines": (
                lambda: check_vortex_lines(32, 2) if quick else check_vortex_lines(),
                _vortex_lines_line,
            ),
            "bogoliubov": (
                lambda: check_bogoliubov(24, 32, 4, 1) if quick else check_bogoliubov(),
                _bogoliubov_line,
            ),
        }
    )


def main(argv=None) -> int:
    """``python -m ivhl_jax.bench.ops_condensate_modes --out FILE [--quick]``: :func:`gpu_check` on this device,
    written as JSON with the command that made it."""
    return gpu_check_main("ops_condensate_modes", gpu_check, argv)


if __name__ == "__main__":
    raise SystemExit(main())
