"""``ivhl sim cdt``: many independent 1+1D CDT Monte Carlo chains (vmapped), with checkpoints and plots.

Examples::

    ivhl sim cdt                                            # T=16, target N2=512, lambda=ln 2, 8 chains
    ivhl sim cdt --set slices=32 --set volume=2048 --set chains=16 --set sweeps=400
    ivhl sim cdt --set eps=0 --set lam=0.75 --set volume=0  # no volume fixing (needs lam > ln 2)

One sweep is ``attempts_per_sweep`` move attempts per chain (default: the target N2). Outputs in
``--out`` (default ``runs/cdt``): ``volume_profiles.png``, ``volume_trace.png``, ``coordination.png``
and ``summary.json`` (mean profile, correlator, coordination histogram, acceptance rates, distance
spheres and a Hausdorff-dimension estimate from them).
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.numerics.rollout import chunked
from ivhl_jax.physics import cdt
from ivhl_jax.run.config import config_dict
from ivhl_jax.run.driver import RunContext, Simulation, run_main
from ivhl_jax.run.io import save_figure, write_json
from ivhl_jax.run.runner import run_chunked
from ivhl_jax.train.checkpoint import Checkpointer


@dataclasses.dataclass(frozen=True)
class CDTConfig:
    slices: int = 16  # number of time slices T (>= 3)
    volume: int = 512  # target number of triangles N2 (used by volume fixing and defaults)
    lam: float = cdt.LN2  # cosmological constant lambda
    eps: float = 0.02  # volume-fixing strength eps (0: none, then lam > ln 2 is required)
    chains: int = 8  # independent Markov chains (vmapped)
    sweeps: int = 200  # sweeps per chain (raise it to extend a finished run)
    measure_every: int = 2  # sweeps between measurements
    chunks: int = 10  # compiled chunks (progress lines and checkpoints); divides sweeps
    attempts_per_sweep: int = 0  # Metropolis attempts per sweep; 0: the target volume
    capacity: int = 0  # vertex slots per chain; 0: 2 * volume (N0 ~ volume / 2, so 4x headroom)
    init_length: int = 0  # initial slice length; 0: volume / (2 slices), at least 3
    seed: int = 0  # PRNG seed of the chains
    r_max: int = 0  # distance-sphere radius for the Hausdorff estimate; 0: automatic
    origins: int = 8  # BFS origins per chain

    def validate(self) -> None:
        if self.slices < 2:
            raise ValueError(f"slices must be >= 2, got {self.slices}")
        if self.volume < 6 * self.slices and self.volume != 0:
            raise ValueError(f"volume={self.volume} is below the minimum 6 * slices = {6 * self.slices}")
        if self.eps > 0 and self.volume <= 0:
            raise ValueError("eps > 0 (volume fixing) needs volume > 0")
        if self.eps == 0 and self.lam <= cdt.LN2:
            raise ValueError(f"lam={self.lam} <= ln 2 without volume fixing diverges; set lam > ln 2 or eps > 0")
        for name in ("chains", "sweeps", "measure_every", "chunks", "origins"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.sweeps % self.chunks or (self.sweeps // self.chunks) % self.measure_every:
            raise ValueError(f"sweeps ({self.sweeps}) must split into chunks ({self.chunks}) of a multiple of "
                             f"measure_every ({self.measure_every}) sweeps")


def _derived(cfg: CDTConfig) -> tuple[int, int, int, int]:
    vol = cfg.volume if cfg.volume > 0 else 6 * cfg.slices * 4
    init_len = cfg.init_length or max(3, vol // (2 * cfg.slices))
    cap = cfg.capacity or max(2 * vol, 4 * init_len * cfg.slices)
    attempts = cfg.attempts_per_sweep or vol
    return vol, init_len, cap, attempts


def simulate(cfg: CDTConfig, out: str, *, checkpointer: Checkpointer | None = None, progress: bool = True) -> dict:
    """Run ``cfg`` (resuming from ``checkpointer`` when it holds a checkpoint); write the outputs into ``out``."""
    vol, init_len, cap, attempts = _derived(cfg)
    params = cdt.make_params(cfg.lam, eps=cfg.eps, target=float(cfg.volume if cfg.eps > 0 else 0),
                             attempts_per_sweep=attempts)
    stepper = cdt.metropolis(params)
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.chains)
    chains = jax.vmap(lambda k: stepper.init(k, cfg.slices, init_len, cap))(keys)
    per_chunk = cfg.sweeps // cfg.chunks
    chunk = chunked(stepper, per_chunk, save_every=cfg.measure_every, observe=cdt.observe_chain)

    @jax.jit
    def advance(chains):
        chains, obs = jax.vmap(chunk)(chains)
        # runner concatenates along axis 0: put measurements first, chains second
        return chains, jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), obs)

    res = run_chunked(advance, chains, n_chunks=cfg.chunks, steps_per_chunk=per_chunk, checkpointer=checkpointer,
                      metadata={"config": config_dict(cfg)}, progress=progress, description="cdt sweeps")
    final = res.state.geometry
    hist = jax.device_get(res.history)
    if bool(np.any(hist["overflow"])):
        print(f"warning: capacity {cap} overflowed in some chain; rerun with --set capacity={2 * cap}")
    cdt.assert_invariants(final)
    return _report(cfg, out, final, hist, res, vol, cap, attempts)


def _report(cfg, out, final, hist, res, vol, cap, attempts) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = np.asarray(hist["lengths"])  # (n_meas, chains, T)
    n2 = np.asarray(hist["n2"])
    n_meas = lengths.shape[0]
    therm = n_meas // 2  # discard the first half as thermalisation
    prof = lengths[therm:]
    centred = np.asarray(cdt.center_profiles(prof))
    corr = np.asarray(cdt.volume_correlator(prof))
    coord = np.asarray(hist["coordination"])[therm:].sum((0, 1))
    acc = np.asarray(final.accepts).sum(0)
    att = np.asarray(final.attempts).sum(0)

    r_max = cfg.r_max or int(min(4 * cfg.slices, 6 * math.sqrt(vol) + 10))
    spheres = np.asarray(jax.jit(jax.vmap(lambda k, s: cdt.sphere_volumes(k, s, r_max, cfg.origins)))(
        jax.random.split(jax.random.PRNGKey(cfg.seed + 1), cfg.chains), final)).mean(0)
    d_h, d_h_err = cdt.hausdorff_from_spheres(spheres)

    sweeps_axis = (np.arange(n_meas) + 1) * cfg.measure_every
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    t = np.arange(cfg.slices)
    ax[0].plot(t, centred.mean((0, 1)), "k-", lw=2, label="mean (centred)")
    ax[0].fill_between(t, *np.percentile(centred.reshape(-1, cfg.slices), [16, 84], axis=0), color="0.8",
                       label="16-84 %")
    for c in range(min(3, cfg.chains)):
        ax[0].plot(t, lengths[-1, c], lw=0.8, label=f"chain {c}, last")
    ax[0].set_xlabel("time slice t (centred on the volume maximum)")
    ax[0].set_ylabel("slice length $l_t$")
    ax[0].legend(fontsize=7)
    ax[1].plot(np.arange(cfg.slices), corr, "o-")
    ax[1].set_xlabel(r"slice separation $\Delta t$")
    ax[1].set_ylabel(r"$\langle l_t l_{t+\Delta t}\rangle - \langle l\rangle^2$")
    fig.suptitle(f"CDT T={cfg.slices}, target N2={cfg.volume}, lambda={cfg.lam:.4f}, eps={cfg.eps}")
    p_prof = save_figure(fig, os.path.join(out, "volume_profiles.png"))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot(sweeps_axis, n2, lw=0.7)
    ax.set_xlabel("sweep")
    ax.set_ylabel("number of triangles $N_2$")
    ax.set_title(f"volume trace of {cfg.chains} chains (target {cfg.volume})")
    p_trace = save_figure(fig, os.path.join(out, "volume_trace.png"))
    plt.close(fig)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    q = np.arange(coord.size)
    ax[0].bar(q, coord / max(coord.sum(), 1))
    ax[0].set_xlabel("coordination number q")
    ax[0].set_ylabel("fraction of vertices")
    ax[0].set_title("vertex coordination numbers")
    ax[1].loglog(np.arange(1, r_max + 1), spheres[1:], "o-", ms=3)
    ax[1].set_xlabel("graph distance r (links)")
    ax[1].set_ylabel("sphere volume S(r) (vertices)")
    ax[1].set_title(f"distance spheres, local d_H = {d_h:.2f}")
    p_coord = save_figure(fig, os.path.join(out, "coordination.png"))
    plt.close(fig)

    summary = {
        "config": config_dict(cfg),
        "derived": {"attempts_per_sweep": attempts, "vertex_capacity": cap, "target_volume": vol},
        "sweeps_done": res.steps, "resumed_from": res.resumed_from, "wall_time_s": res.wall_time_s,
        "overflow": bool(np.any(hist["overflow"])),
        "mean_n2": float(n2[therm:].mean()), "std_n2": float(n2[therm:].std()),
        "mean_slice_length": float(prof.mean()),
        "mean_profile_centred": centred.mean((0, 1)).tolist(),
        "volume_correlator": corr.tolist(),
        "coordination_histogram": (coord / max(coord.sum(), 1)).tolist(),
        "mean_coordination": float((q * coord).sum() / max(coord.sum(), 1)),
        "acceptance": {n: float(acc[i] / max(att[i], 1)) for i, n in enumerate(cdt.MOVE_NAMES)},
        "accepted_moves": {n: int(acc[i]) for i, n in enumerate(cdt.MOVE_NAMES)},
        "sphere_volumes": spheres.tolist(), "mean_distance": float(cdt.mean_distance(spheres)),
        "hausdorff_local": d_h, "hausdorff_local_err": d_h_err,
        "figures": [p_prof, p_trace, p_coord],
    }
    path = write_json(os.path.join(out, "summary.json"), summary)
    print(f"CDT: <N2> = {summary['mean_n2']:.1f}, <l> = {summary['mean_slice_length']:.2f}, "
          f"acceptance {summary['acceptance']}, local d_H = {d_h:.2f}")
    summary["summary_path"] = path
    return summary


def _run(cfg: CDTConfig, ctx: RunContext) -> dict[str, str]:
    summary = simulate(cfg, ctx.out, checkpointer=ctx.checkpointer, progress=ctx.progress)
    names = ("volume_profiles", "volume_trace", "coordination")
    return {"summary": summary["summary_path"], **dict(zip(names, summary["figures"]))}


SIMULATION = Simulation(
    prog="ivhl sim cdt", config_type=CDTConfig, run=_run, description=__doc__.split("\n")[0],
    default_out=lambda cfg, a: "runs/cdt", extendable=("sweeps", "chunks"),
    checkpoint_every=lambda cfg: cfg.sweeps // cfg.chunks, keep=lambda cfg: 2)


def main(argv: list[str] | None = None) -> int:
    return run_main(SIMULATION, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
