"""Ground states without the time-step bias: the Riemannian conjugate gradient (``method="cg"``) against the
imaginary-time flow (``method="flow"``) for every condensate system in 1D, 2D and 3D (dipolar 3D only), in float64
and float32 (the default policy).

Per case and precision:

- speed, interleaved (the host is shared: only the ratio means anything): the flow at its default step
  (dt = 1e-2, halved until the solver's step check accepts it) to its own default stopping rule, and the
  conjugate gradient to its residual tolerance (float64: ‖Hψ − μψ‖/‖Hψ‖ ≤ 1e-10; float32: the default
  :data:`~ivhl_jax.physics.condensate.riemannian.FLOAT32_RESIDUAL`),
  :data:`REPEATS` times each after a compiling call; ``flow_over_cg`` is the median of the per-repeat ratios;
- accuracy: float64, the flow's fixed-point energies at that dt, dt/2, dt/4 (stopping tol 1e-14) and their
  dt → 0 extrapolation E₀ (a quadratic in dt: the energy error of a fixed point is quadratic in its O(dt) state
  error, with a linear part where the splitting's bias enters the energy directly); the conjugate gradient's
  (E − E₀)/|E₀| is then at the extrapolation's own remainder. float32: both solvers' energies against the float64
  exact ground state of the same system (the float32 energy carries ~1e-7 round-off, below the flow's bias);
- the residual each reaches (the flow's floor is O(dt): it never reaches 1e-10) and, in float32, the floor the
  conjugate gradient reaches when asked for 1e-9 (it stops on stalls or stagnation there).

``python -m bench.studies.ground_state_solvers --out bench/results/ground_state_solvers.json`` (~25 min on 2 CPU
cores; float32 alone: ``--precision f32 --out bench/results/ground_state_solvers_f32.json``; ``--only`` a
comma-separated list of case names, ``--precision f64`` or ``f32``; ``--min-seconds s`` repeats the timed pairs
until each solver has run s seconds: the 1D solves take milliseconds, whose ratio on a shared host needs many
repeats, e.g. ``--only gp_1d_gN500,mixture_1d --min-seconds 2``).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.physics import condensate as C
from ivhl_jax.physics.condensate.riemannian import constrained_residual

#: The flow's step sizes of the dt → 0 extrapolation, in units of the case's flow step (1e-2, the default, where
#: the solver's step check accepts it).
DT_SCALES = (1.0, 0.5, 0.25)
#: Interleaved timing repeats per solver (after one compiling call each).
REPEATS = 3
#: The most interleaved repeats ``--min-seconds`` may ask for.
MAX_REPEATS = 200
#: The conjugate gradient's float64 residual tolerance measured here.
CG_TOL_F64 = 1e-10


def _harmonic(grid, dtype, trap=1.0):
    return C.harmonic(grid, trap, dtype=dtype)


def _cases() -> dict:
    """name → builder(dtype) of (system, ground_state kwargs): the audit's 1D cases, 2D and 3D analogues."""

    def gp(shape, length, g):
        def build(dtype):
            grid = C.Grid.uniform(shape, length)
            return C.GPSystem.create(grid, _harmonic(grid, dtype), g), {}

        return build

    def mixture(shape, length, g):
        def build(dtype):
            grid = C.Grid.uniform(shape, length)
            system = C.MixtureSystem.create(grid, _harmonic(grid, dtype), g)
            return system, {"norm": jnp.asarray([1.0, 0.8], dtype)}

        return build

    def spin1(shape, length, c0, c2):
        def build(dtype):
            grid = C.Grid.uniform(shape, length)
            return C.Spin1System.create(grid, _harmonic(grid, dtype), c0, c2, q=0.5), {"magnetization": 0.3}

        return build

    def dipolar(dtype):
        grid = C.Grid.uniform((24, 24, 24), 12.0)
        v = _harmonic(grid, dtype, (1.0, 1.0, 1.5))
        return C.DipolarSystem.create(grid, v, 100.0, C.Dipolar.create(eps_dd=0.4)), {}

    return {
        "gp_1d_gN2000": gp(512, 48.0, 2000.0),
        "gp_1d_gN500": gp(512, 32.0, 500.0),
        "gp_2d_g200": gp((64, 64), 16.0, 200.0),
        "gp_3d_g100": gp((24, 24, 24), 12.0, 100.0),
        "mixture_1d": mixture(256, 40.0, [[1000.0, 500.0], [500.0, 1200.0]]),
        "mixture_2d": mixture((64, 64), 16.0, [[200.0, 100.0], [100.0, 240.0]]),
        "mixture_3d": mixture((24, 24, 24), 12.0, [[100.0, 50.0], [50.0, 120.0]]),
        "spin1_1d_M0.3": spin1(256, 40.0, 1000.0, 50.0),
        "spin1_2d_M0.3": spin1((64, 64), 16.0, 200.0, 10.0),
        "spin1_3d_M0.3": spin1((24, 24, 24), 12.0, 100.0, 5.0),
        "dipolar_3d": dipolar,
    }


def _clock(fn):
    t = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t


def _summary(info, seconds):
    return {
        "energy": float(info["energy"]),
        "steps": int(info["steps"]),
        "residual": float(info.get("residual", np.nan)),  # (the flow of a mixture, spin-1, dipolar: measured below)
        "converged": bool(info["converged"]),
        "seconds": seconds,
    }


def _density_error(psi, ref) -> float:
    """max |ρ − ρ_ref| / max ρ_ref over the components (ρ = |ψ|²: blind to the free phases of a complex state)."""
    rho, rho_ref = np.abs(np.asarray(psi, np.complex128)) ** 2, np.abs(np.asarray(ref, np.complex128)) ** 2
    return float(np.max(np.abs(rho - rho_ref)) / np.max(rho_ref))


def _flow_dt(system, norm, extra) -> float:
    """The flow's default step 1e-2, halved until the solver's own step check accepts it (the audit's 1D gN = 2000
    resolves its local decay only from dt = 2.5e-3)."""
    dt = 1e-2
    while True:
        try:
            C.ground_state(system, norm, dt, max_steps=1, check_every=1, method="flow", **extra)
            return dt
        except ValueError as e:
            if "too large" not in str(e):
                raise
            dt /= 2


def _speed(system, norm, extra, cg_tol, dt, min_seconds=0.0) -> dict:
    """The flow at step ``dt`` to its default stopping rule and the conjugate gradient to ``cg_tol``, interleaved:
    :data:`REPEATS` pairs, more (up to :data:`MAX_REPEATS`) until each solver has run ``min_seconds`` in all."""

    def flow():
        return C.ground_state(system, norm, dt, method="flow", **extra)

    def cg():
        return C.ground_state(system, norm, tol=cg_tol, method="cg", **extra)

    _clock(flow), _clock(cg)  # compile
    times: dict = {"flow": [], "cg": []}
    while len(times["cg"]) < REPEATS or (
        min(sum(times["flow"]), sum(times["cg"])) < min_seconds and len(times["cg"]) < MAX_REPEATS
    ):
        (_, f_info), tf = _clock(flow)
        (psi, c_info), tc = _clock(cg)
        times["flow"].append(tf)
        times["cg"].append(tc)
    ratios = [f / c for f, c in zip(times["flow"], times["cg"])]
    psi_flow = flow()[0]
    res, _ = constrained_residual(system, psi_flow, magnetization=extra.get("magnetization"))
    f_row = _summary(f_info, float(np.median(times["flow"])))
    f_row["residual"] = float(res)  # as the conjugate gradient measures it (one multiplier per held norm)
    return {
        "flow_default": f_row,
        "cg": {**_summary(c_info, float(np.median(times["cg"]))), "tol": cg_tol},
        "seconds_flow": times["flow"],
        "seconds_cg": times["cg"],
        "flow_over_cg": float(np.median(ratios)),
        "states": (psi_flow, psi),
    }


def run_case(build, dtype, min_seconds=0.0) -> dict:
    system, kw = build(dtype)
    norm = kw.get("norm", 1.0)
    extra = {k: v for k, v in kw.items() if k != "norm"}
    f64 = dtype == jnp.float64
    dt = _flow_dt(system, norm, extra)
    row = {"flow_dt": dt, **_speed(system, norm, extra, CG_TOL_F64 if f64 else None, dt, min_seconds)}
    psi_flow, psi_cg = row.pop("states")
    e_cg = row["cg"]["energy"]
    e_flow = row["flow_default"]["energy"]
    if f64:
        flows = []
        dts = [dt * s for s in DT_SCALES]
        for h in dts:
            _, info = C.ground_state(system, norm, h, tol=1e-14, max_steps=400_000, method="flow", **extra)
            flows.append({"dt": h, "energy": float(info["energy"]), "steps": int(info["steps"])})
        coef = np.polyfit(np.array(dts), np.array([f["energy"] for f in flows]), 2)
        e0 = float(coef[-1])
        row.update(
            {
                "flow_by_dt": flows,
                "energy_extrapolated": e0,
                "cg_minus_extrapolated_relative": (e_cg - e0) / abs(e0),
                "flow_default_minus_extrapolated_relative": (e_flow - e0) / abs(e0),
                "flow_minus_extrapolated_relative": [(f["energy"] - e0) / abs(e0) for f in flows],
                # the exact discrete state is the conjugate gradient's (its energy is at E0): the flow's O(dt) error
                "flow_default_density_error": _density_error(psi_flow, psi_cg),
            }
        )
    else:
        _, floor = C.ground_state(system, norm, tol=1e-9, method="cg", **extra)
        row["cg_floor"] = {"residual": float(floor["residual"]), "steps": int(floor["steps"])}
        with jax.enable_x64(True):
            ref_system, ref_kw = build(jnp.float64)
            ref_psi, ref = C.ground_state(ref_system, ref_kw.get("norm", 1.0), tol=CG_TOL_F64, method="cg", **extra)
        e_ref = float(ref["energy"])
        row.update(
            {
                "energy_exact_float64": e_ref,
                "cg_minus_exact_relative": (e_cg - e_ref) / abs(e_ref),
                "flow_default_minus_exact_relative": (e_flow - e_ref) / abs(e_ref),
                "cg_density_error": _density_error(psi_cg, ref_psi),
                "flow_default_density_error": _density_error(psi_flow, ref_psi),
            }
        )
    return row


def _line(name: str, row: dict) -> str:
    err = "minus_extrapolated" if "energy_extrapolated" in row else "minus_exact"
    cg, flow = row["cg"], row["flow_default"]
    dens = f"; density error flow {row['flow_default_density_error']:.1e}" + (
        f" cg {row['cg_density_error']:.1e}" if "cg_density_error" in row else ""
    )
    return (
        f"{name}: flow/cg time {row['flow_over_cg']:.2f} (flow {flow['seconds']:.3f}s {flow['steps']} steps res "
        f"{flow['residual']:.1e}; cg {cg['seconds']:.3f}s {cg['steps']} it res {cg['residual']:.1e}); error "
        f"cg {row['cg_' + err + '_relative']:.1e} flow(dt={row['flow_dt']:g}) "
        f"{row['flow_default_' + err + '_relative']:.1e}" + dens
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--precision", default="f64,f32", help="f64, f32 or both (comma-separated)")
    ap.add_argument(
        "--min-seconds", type=float, default=0.0, help="repeat the timed pairs until each solver ran this long"
    )
    a = ap.parse_args()
    doc: dict = {
        "what": "exact discrete ground states (Riemannian CG, method='cg') against the imaginary-time flow "
        "(method='flow'): seconds to each solver's stopping rule (flow: dt = 1e-2, halved until the step check "
        "accepts it, and its default tol; cg: residual 1e-10 in float64, its default in float32), interleaved, "
        "compile excluded; flow_over_cg the median ratio; "
        "energies against the flow's dt -> 0 extrapolation (float64, dt, dt/2, dt/4, quadratic fit) or the "
        "float64 exact ground state (float32); residual = ||H psi - mu psi|| / ||H psi|| with one multiplier per "
        "held norm",
        "notes": "measured on a 2-core host shared with other jobs: compare the interleaved ratios, not the seconds",
        "repeats": {"min": REPEATS, "min_seconds": a.min_seconds},
        "cases": {},
    }
    only = None if a.only is None else set(a.only.split(","))
    for prec in a.precision.split(","):
        dtype = {"f64": jnp.float64, "f32": jnp.float32}[prec]
        for name, build in _cases().items():
            if only is not None and name not in only:
                continue
            with jax.enable_x64(prec == "f64"):
                row = run_case(build, dtype, a.min_seconds)
            doc["cases"][f"{name}_{prec}"] = row
            print(_line(f"{name}_{prec}", row), flush=True)
    if a.out:
        from ivhl_jax.bench.harness import write_results

        write_results(a.out, doc)


if __name__ == "__main__":
    main()
