"""Accuracy of the condensate terms per precision: float32 and a bfloat16-stored state against float64.

Five runs of ``condensate.strang``, each from one float64 start, each 1000 steps (``--steps``):

  gp       the default ``ivhl sim bec`` system (2-D, 128², box 20, trap ω = 1, g = 200, dt = 2e-3): its float64
           ground state with a vortex imprinted at (1, 0), so the state moves (the vortex precesses);
  damped   the same start in a trap rotating at Ω = 0.7 with damping γ = 0.03 (``GPSystem.create(gamma=)``);
  mixture  two components (g₁₁ = 100, g₂₂ = 90, g₁₂ = 80), displaced Gaussians with a relative velocity, 128², box 16;
  spin1    spin-1 (c₀ = 100, c₂ = −5, p = 0, q = 0.1), a transverse-spin Gaussian with a phase gradient, 128², box 16;
  dipolar  3-D, 32³ over a box of 16, g = 500, ε_dd = 0.5 along z, cutoff 7, an anisotropic Gaussian, dt = 1e-3.

Each is run three times with the stepper's defaults: in float64 (the reference), in float32 (``policy`` f32: a
complex64 state) and with a bfloat16 *stored* state: float32 compute, Re ψ and Im ψ rounded to bfloat16 after
every step (:func:`ivhl_jax.core.precision.round_complex`), which is all a bf16 policy could mean, since XLA has
no complex bfloat16 type and no bfloat16 FFT. All three advance step by step (one ``stepper.step`` per step, so
the stepper's norm projection acts after every step in all three, to the norm that step starts with). Recorded
after every 100 steps, each final state evaluated in float64:

  norm_drift    |N(t) − N₀|/N₀, N₀ the float64 start's norm (per component for the mixture; total N for spin-1,
                and the magnetisation's change relative to N₀);
  energy_error  |E(t) − E₆₄(t)|/|E₆₄(t)| (the energy of the run's state against that of the float64 run);
  state_error   max |ψ − ψ₆₄| / max |ψ₆₄|.

``python -m bench.studies.condensate_precision --out bench/results/condensate_precision.json`` (about a minute on
2 CPU cores).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.precision import round_complex
from ivhl_jax.physics import condensate as C
from ivhl_jax.physics.condensate import dipolar as D
from ivhl_jax.physics.condensate import mixture as M

RECORD_EVERY = 100
MODES = ("f64", "f32", "bf16_storage")


def _gp_start(grid, rdt):
    """The float64 ground state of the default sim bec system with a vortex imprinted at (1, 0)."""
    system = C.GPSystem.create(grid, C.harmonic(grid, dtype=rdt), 200.0)
    gs, _ = C.ground_state(system, 1.0, dt=5e-3, max_steps=3000)
    return np.asarray(C.imprint_vortices(gs, grid, np.array([[1.0, 0.0]]), np.array([1])))


def cases() -> dict:
    """name -> (build(rdt) -> system, dt, start (float64 NumPy), observables(psi, system) -> dict)."""
    g2 = C.Grid.uniform((128, 128), 20.0)
    gp_start = _gp_start(g2, jnp.float64)

    def gp_obs(psi, system):
        return {"n": C.norm(psi, system.grid), "e": C.energy(psi, system)["total"]}

    m2 = C.Grid.uniform((128, 128), 16.0)
    x, y = np.meshgrid(*m2.coords, indexing="ij")
    mix = np.stack(
        [np.exp(-((x - 0.5) ** 2 + y**2) / 2) * np.exp(0.5j * y), np.exp(-((x + 0.5) ** 2 + y**2) / 2)]
    ).astype(complex)
    mix = mix / np.sqrt(np.sum(np.abs(mix) ** 2, axis=(1, 2), keepdims=True) * m2.cell_volume)

    def mix_obs(psi, system):
        return {"n": M.component_norms(psi, system.grid), "e": M.mixture_energy(psi, system)["total"]}

    env = np.exp(-(x**2 + y**2) / 2)
    spin = np.stack([0.5 * env, np.sqrt(0.5) * env * np.exp(0.3j * x), 0.5 * env]).astype(complex)
    spin = spin / np.sqrt(np.sum(np.abs(spin) ** 2) * m2.cell_volume)

    def spin_obs(psi, system):
        return {
            "n": jnp.sum(M.component_norms(psi, system.grid)),
            "m": M.magnetization(psi, system.grid),
            "e": M.spin1_energy(psi, system)["total"],
        }

    g3 = C.Grid.uniform((32, 32, 32), 16.0)
    x3, y3, z3 = np.meshgrid(*g3.coords, indexing="ij")
    dip = np.exp(-(x3**2 + y3**2 + 0.5 * z3**2) / 2).astype(complex)
    dip = dip / np.sqrt(np.sum(np.abs(dip) ** 2) * g3.cell_volume)

    def dip_obs(psi, system):
        return {"n": C.norm(psi, system.grid), "e": D.dipolar_gp_energy(psi, system)["total"]}

    return {
        "gp": (lambda rdt: C.GPSystem.create(g2, C.harmonic(g2, dtype=rdt), 200.0), 2e-3, gp_start, gp_obs),
        "damped": (
            lambda rdt: C.GPSystem.create(g2, C.harmonic(g2, dtype=rdt), 200.0, 0.7, gamma=0.03),
            2e-3,
            gp_start,
            gp_obs,
        ),
        "mixture": (
            lambda rdt: M.MixtureSystem.create(
                m2, C.harmonic(m2, dtype=rdt), jnp.asarray([[100.0, 80.0], [80.0, 90.0]], rdt)
            ),
            2e-3,
            mix,
            mix_obs,
        ),
        "spin1": (
            lambda rdt: M.Spin1System.create(m2, C.harmonic(m2, dtype=rdt), 100.0, -5.0, p=0.0, q=0.1),
            2e-3,
            spin,
            spin_obs,
        ),
        "dipolar": (
            lambda rdt: D.DipolarSystem.create(
                g3, C.harmonic(g3, dtype=rdt), 500.0, D.Dipolar.create(eps_dd=0.5, axis=(0.0, 0.0, 1.0), cutoff=7.0)
            ),
            1e-3,
            dip,
            dip_obs,
        ),
    }


def _block(stepper, psi, n: int, bf16: bool):
    def body(p, _):
        p = stepper.step(p)
        return (round_complex(p, jnp.bfloat16) if bf16 else p), None

    return jax.lax.scan(body, psi, None, length=n)[0]


_block_jit = jax.jit(_block, static_argnums=(2, 3))


def run_case(build, dt: float, start: np.ndarray, obs, steps: int) -> dict:
    """The three runs of one term (module docstring): the metrics after every ``RECORD_EVERY`` steps."""
    sys64 = build(jnp.float64)
    states: dict = {}
    for mode in MODES:
        rdt = jnp.float64 if mode == "f64" else jnp.float32
        st = C.strang(build(rdt), dt)
        psi = st.init(jnp.asarray(start, jnp.result_type(rdt, jnp.complex64)))
        if mode == "bf16_storage":
            psi = round_complex(psi, jnp.bfloat16)
        seq = []
        for _ in range(steps // RECORD_EVERY):
            psi = _block_jit(st, psi, RECORD_EVERY, mode == "bf16_storage")
            seq.append(np.asarray(psi, np.complex128))
        states[mode] = seq
    o0 = {k: np.asarray(v, np.float64) for k, v in obs(jnp.asarray(start), sys64).items()}
    n0 = o0["n"]
    out: dict = {"dt": dt, "steps": steps, "record_every": RECORD_EVERY, "start_norm": n0.tolist()}
    ref = [{k: np.asarray(v, np.float64) for k, v in obs(jnp.asarray(s), sys64).items()} for s in states["f64"]]
    for mode in MODES:
        rec: dict = {"norm_drift": [], "energy_error": [], "state_error": []}
        if "m" in o0:
            rec["magnetization_drift"] = []
        for i, s in enumerate(states[mode]):
            o = {k: np.asarray(v, np.float64) for k, v in obs(jnp.asarray(s), sys64).items()}
            rec["norm_drift"].append(float(np.max(np.abs(o["n"] - n0) / n0)))
            e_ref = ref[i]["e"]
            rec["energy_error"].append(float(abs(o["e"] - e_ref) / abs(e_ref)))
            s64 = states["f64"][i]
            rec["state_error"].append(float(np.max(np.abs(s - s64)) / np.max(np.abs(s64))))
            if "m" in o0:
                rec["magnetization_drift"].append(float(abs(o["m"] - o0["m"]) / np.sum(n0)))
        rec["final"] = {k: v[-1] for k, v in rec.items() if isinstance(v, list)}
        out[mode] = rec
    out["f64"]["energy_change_over_run"] = float(abs(ref[-1]["e"] - o0["e"]) / abs(o0["e"]))
    return out


def summary(doc: dict) -> dict:
    """Per term, the final (after ``steps``) figures of f32 and bf16 storage; and the bf16 norm-loss range."""
    table = {}
    for name, rec in doc["terms"].items():
        table[name] = {mode: rec[mode]["final"] for mode in ("f32", "bf16_storage")}
    bf = [t["bf16_storage"]["norm_drift"] for t in table.values()]
    return {"final": table, "bf16_storage_norm_drift_range": [min(bf), max(bf)]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.studies.condensate_precision")
    ap.add_argument("--out", default=None)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--only", nargs="*", default=None, help="terms to run (default: all)")
    a = ap.parse_args(argv)
    if a.steps % RECORD_EVERY:
        ap.error(f"--steps must be a multiple of {RECORD_EVERY}")
    doc: dict = {"terms": {}}
    with jax.enable_x64(True):
        for name, (build, dt, start, obs) in cases().items():
            if a.only and name not in a.only:
                continue
            doc["terms"][name] = run_case(build, dt, start, obs, a.steps)
            fin = doc["terms"][name]
            print(name, {m: fin[m]["final"] for m in ("f32", "bf16_storage")}, flush=True)
    doc["summary"] = summary(doc)
    print(doc["summary"])
    if a.out:
        from ivhl_jax.bench.harness import write_results

        write_results(a.out, doc)


if __name__ == "__main__":
    main()
