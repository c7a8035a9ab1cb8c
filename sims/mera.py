"""Variational scale-invariant MERA for the critical transverse-field Ising chain H = −Σ XX − Σ Z (e₀ = −4/π).

The optimisation runs a ladder of stages of growing bond dimension (``chis``), each ``sweeps[k]``
Evenbly–Vidal sweeps with ``layers[k]`` transitional layers below the scale-invariant one; between stages
the tensors are padded (:func:`ivhl_jax.physics.mera.grow`), which keeps the energy and avoids the poor local minima
of a cold start at large χ. Each stage runs in jitted chunks (:func:`ivhl_jax.run.runner.run_chunked`) with
checkpoints in <out>/ckpt/stage<k>: an interrupted run resumes where it stopped. Float64 throughout.

Outputs in <out>: convergence.png (energy error per sweep), scaling_dims.png, mera.json (energy error per
sweep, timings per stage, scaling dimensions vs the Ising CFT), config.json.

  ivhl sim mera                                   # default ladder χ = 4 → 6 → 8
  ivhl sim mera --set chis=4,6 --set sweeps=500,500 --set layers=1,2 --out runs/mera_small
  ivhl sim mera --config run.toml --no-resume
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Sequence

import jax
import numpy as np

from ivhl_jax.physics import mera as M
from ivhl_jax.run.driver import RunContext, Simulation, run_main
from ivhl_jax.run.io import save_figure, write_json
from ivhl_jax.run.runner import run_chunked
from ivhl_jax.train.checkpoint import Checkpointer

ISING_DIMS = [0.0, 0.125, 1.0, 1.125, 1.125, 2.0, 2.0, 2.0, 2.0, 2.125]


@dataclasses.dataclass(frozen=True)
class MERASimConfig:
    """Run configuration (TOML/JSON keys; ``--set key=value``; lists as ``--set chis=4,6,8``)."""

    chis: tuple[int, ...] = (4, 6, 8)  # bond dimension χ of each ladder stage (non-decreasing)
    sweeps: tuple[int, ...] = (1000, 2000, 1000)  # Evenbly–Vidal sweeps of each stage
    layers: tuple[int, ...] = (2, 2, 3)  # transitional layers of each stage (non-decreasing)
    chi_mid: int | None = None       # None: χ_mid = χ (unitary disentanglers)
    g: float = 1.0  # transverse field of the Ising chain (1: critical)
    power_iters: int = 4  # descending-superoperator iterations per sweep for the top density matrix
    u_delay: int = 10  # sweeps before the disentanglers start to be updated
    refsym: bool = True  # impose reflection symmetry (removes spurious minima)
    si_scales: int = 1  # scales summed in the scale-invariant layer's environment (1 = mainVarMERA)
    sweeps_per_chunk: int = 50  # sweeps per compiled chunk
    checkpoint_every: int = 200      # sweeps between checkpoints (a multiple of sweeps_per_chunk)
    seed: int = 0  # seed of the initial isometries

    def validate(self) -> None:
        for name in ("sweeps_per_chunk", "checkpoint_every"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive integer (>= 1), got {val!r}; e.g. --set {name}=50")
        if not (len(self.chis) == len(self.sweeps) == len(self.layers)) or not self.chis:
            raise ValueError(f"chis, sweeps and layers need the same (non-zero) length, got {self.chis}, "
                             f"{self.sweeps}, {self.layers}")
        if list(self.chis) != sorted(self.chis):
            raise ValueError(f"chis must be non-decreasing (the ladder only grows), got {self.chis}")
        if list(self.layers) != sorted(self.layers):
            raise ValueError(f"layers must be non-decreasing, got {self.layers}")
        for k, n in enumerate(self.sweeps):
            if n < 1 or n % self.sweeps_per_chunk:
                raise ValueError(f"sweeps[{k}]={n} must be a positive multiple of sweeps_per_chunk="
                                 f"{self.sweeps_per_chunk}")
        if self.checkpoint_every % self.sweeps_per_chunk:
            raise ValueError("checkpoint_every must be a multiple of sweeps_per_chunk")
        for chi, lay in zip(self.chis, self.layers):
            self.stage_config(chi, lay).validate()

    def stage_config(self, chi: int, layers: int) -> M.MERAConfig:
        mid = None if self.chi_mid is None else min(self.chi_mid, chi)
        return M.MERAConfig(chi=chi, chi_mid=mid, layers=layers, g=self.g, power_iters=self.power_iters,
                            u_delay=self.u_delay, refsym=self.refsym, si_scales=self.si_scales)


def simulate(cfg: MERASimConfig, out: str, *, resume: bool = True, progress: bool = True) -> dict:
    """Run the ladder; returns the summary dict written to mera.json."""
    e0 = M.E0_CRITICAL_ISING if cfg.g == 1.0 else None
    if e0 is None:
        from ivhl_jax.physics.exact import tfi_energy_density

        e0 = tfi_energy_density(cfg.g)
    stages = []
    energies: list[np.ndarray] = []
    with jax.enable_x64(True):
        h = M.ising_two_site_hamiltonian(cfg.g, np.float64)
        key = jax.random.key(cfg.seed)
        mera = None
        for k, (chi, layers, n) in enumerate(zip(cfg.chis, cfg.layers, cfg.sweeps)):
            sc = cfg.stage_config(chi, layers)
            if mera is None:
                mera = M.init_mera(key, sc)
            else:
                mera = M.grow(mera, jax.random.fold_in(key, k), chi, sc.chi_mid, layers=layers)
            advance = M.make_advance(h, cfg.sweeps_per_chunk, sc.power_iters, sc.u_delay, sc.refsym, sc.si_scales)
            ckdir = os.path.join(out, "ckpt", f"stage{k}")
            t0 = time.perf_counter()
            with Checkpointer(ckdir, save_every=cfg.checkpoint_every) as ck:
                result = run_chunked(advance, mera, n_chunks=n // cfg.sweeps_per_chunk,
                                     steps_per_chunk=cfg.sweeps_per_chunk, checkpointer=ck,
                                     progress=progress, description=f"MERA chi={chi} (stage {k + 1}/{len(cfg.chis)})",
                                     metadata={"chi": chi, "layers": layers})
            mera = result.state
            e = np.asarray(result.history) - e0
            energies.append(e)
            iso = M.isometry_errors(mera)
            stages.append({
                "chi": chi, "chi_mid": sc.mid, "layers": layers, "sweeps": n,
                "wall_time_s": time.perf_counter() - t0, "resumed_from": result.resumed_from,
                "final_energy_error": float(e[-1]), "isometry_error": iso,
            })
            print(f"stage {k + 1}: chi={chi} layers={layers} sweeps={n}: energy error {e[-1]:.3e} "
                  f"({stages[-1]['wall_time_s']:.1f} s)")
        dims = M.scaling_dimensions(mera, num=len(ISING_DIMS))
        final = float(energies[-1][-1])
    return {
        "model": "H = -sum X_i X_{i+1} - g sum Z_i (energy per site)",
        "g": cfg.g, "e0_exact": e0, "final_energy_error": final,
        "energy_error_per_sweep": np.concatenate(energies), "stages": stages,
        "scaling_dimensions": dims, "scaling_dimensions_exact": ISING_DIMS[: len(dims)],
        "delta_sigma_rel_error": abs(dims[1] - 0.125) / 0.125,
        "delta_epsilon_rel_error": abs(dims[2] - 1.0),
    }


def write_outputs(summary: dict, out: str) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {}
    err = np.asarray(summary["energy_error_per_sweep"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(np.arange(1, len(err) + 1), np.abs(err))
    edges = np.cumsum([s["sweeps"] for s in summary["stages"]])[:-1]
    for x in edges:
        ax.axvline(x, color="0.7", ls="--", lw=0.8)
    ax.set_xlabel("sweep")
    ax.set_ylabel("energy error per site  |E − e₀|")
    ax.set_title("MERA, critical Ising (χ: " + " → ".join(str(s["chi"]) for s in summary["stages"]) + ")")
    paths["convergence.png"] = save_figure(fig, os.path.join(out, "convergence.png"))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 4))
    d = summary["scaling_dimensions"]
    ax.plot(range(len(d)), summary["scaling_dimensions_exact"], "b-", label="Ising CFT")
    ax.plot(range(len(d)), d, "rx", label="MERA")
    ax.set_xlabel("k")
    ax.set_ylabel("Δ_k")
    ax.legend()
    paths["scaling_dims.png"] = save_figure(fig, os.path.join(out, "scaling_dims.png"))
    plt.close(fig)
    paths["mera.json"] = write_json(os.path.join(out, "mera.json"), summary)
    return paths


def _run(cfg: MERASimConfig, ctx: RunContext) -> dict[str, str]:
    summary = simulate(cfg, ctx.out, resume=ctx.resuming, progress=ctx.progress)
    paths = write_outputs(summary, ctx.out)
    print(f"final energy error per site: {summary['final_energy_error']:.3e}; scaling dims "
          f"{np.round(summary['scaling_dimensions'][:4], 4).tolist()} (exact 0, 0.125, 1, 1.125)")
    return paths


# The tensors' shapes change with χ from stage to stage, so each stage keeps its own checkpointer
# (<out>/ckpt/stage<k>); the driver still owns the run folder, its lock and the config check.
SIMULATION = Simulation(prog="ivhl sim mera", config_type=MERASimConfig, run=_run, description=__doc__.split("\n")[0],
                        default_out=lambda cfg, a: "runs/mera", own_checkpoints=True)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(SIMULATION, argv)


if __name__ == "__main__":
    sys.exit(main())
