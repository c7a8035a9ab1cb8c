"""Variational scale-invariant MERA for the critical transverse-field Ising chain H = −Σ XX − Σ Z (e₀ = −4/π).

The optimisation runs a ladder of stages of growing bond dimension (``chis``, with ``chi_mids`` and ``layers``
per stage), each ``steps[k]`` steps (one step = one Evenbly–Vidal sweep) with ``layers[k]`` transitional layers
below the scale-invariant one; between stages the tensors are padded (:func:`ivhl_jax.physics.mera.grow`), which
keeps the energy and avoids the poor local minima of a cold start at large χ. The cold first stage is checked for a
stuck start after ``stuck_after`` steps and again every ``stuck_every`` steps up to step 1000 while its energy error
stays above 1e-3 (:class:`ivhl_jax.physics.mera.StuckCheck`), and re-initialised with a new key (printed, and
listed under "restarts" in mera.json). ``--set compile_ahead=true`` builds each stage's compiled sweep ahead of
time, the next stage's in a background thread while the current one runs (:class:`StageCompiler`); off by default:
on the shared 2-core host it did not shorten the default ladder (4 interleaved pairs, with/without = 0.86–1.48,
bench/results/mera_compile_overlap.json). Each stage runs in compiled chunks
(:func:`ivhl_jax.run.runner.run_chunked`) with checkpoints in <out>/ckpt/stage<k>: an interrupted run resumes
where it stopped. Float64, unless ``precision`` asks for float32 early stages (the last stage is float64).
``host_cores`` (default 0, auto) holds XLA to one CPU core when the host is busy (its 1-minute load average is at
least the number of cores this process may use) and every χ ≤ 12: there, with two other busy processes on the
2-core host, a sweep slowed a median 1.59x on one core (a single thread's fair share there is 1.5x) against 5x
on XLA's two threads, and with one other busy process 0.94-1.09x; on a quiet host all cores reach each accuracy
25-35 % sooner (XLA compiles on them too; bench/results/mera_busy_host.json and mera_busy_host_window.json).
``--set host_cores=n`` asks for n cores whatever the load.

Default ladder: the published schedule of Evenbly's tensors.net mainVarMERA, χ/χ_mid = 6/4 (1 transitional
layer, 2000 steps) → 8/6 (2 layers, 1800 steps): energy error 9.6e-7 in 19–25 s on the 2-core CPU with a single
stuck check, against 1.15e-6 in 72 s for the former default 4 → 6 → 8 with χ_mid = χ
(bench/results/mera_ladder_schedules.json); 8.6e-7 with the repeated check, which re-initialises the idling start
(bench/results/mera_compile_overlap.json).

Outputs in <out>: convergence.png (energy error per sweep), scaling_dims.png, mera.json (energy error per
sweep, timings per stage, restarts, scaling dimensions vs the Ising CFT), config.json.

  ivhl sim mera                                   # default ladder χ = 6 → 8 (χ_mid 4 → 6)
  ivhl sim mera --set chis=6,8,12 --set chi_mids=4,6,8 --set layers=1,2,3 --set steps=2000,1800,1400
  ivhl sim mera --set chis=4,6 --set chi_mids=4,6 --set steps=500,500 --set layers=1,2 --out runs/mera_small
  ivhl sim mera --config run.toml --no-resume
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.physics import mera as M
from ivhl_jax.run.device import limit_host_cores
from ivhl_jax.run.driver import RunContext, Simulation, run_main
from ivhl_jax.run.io import save_figure, write_json
from ivhl_jax.run.runner import run_chunked
from ivhl_jax.train.checkpoint import Checkpointer

ISING_DIMS = [0.0, 0.125, 1.0, 1.125, 1.125, 2.0, 2.0, 2.0, 2.0, 2.125]
# host_cores=0 (auto) runs ladders up to this χ on one core when the host is busy: measured on 2 cores
# (bench/results/mera_busy_host_window.json, 0.5 s samples), with two other processes spinning a sweep slowed a
# median 1.59x (1.26-1.81x at χ = 8, 12 and 16) on one core instead of 5x on XLA's two threads (each operation split
# over two threads waiting for the descheduled one); at χ = 16 two threads were mostly faster when quiet. On a
# quiet host the default ladder reached 1e-3 / 1e-5 in 2.7-3.0 / 6.9-7.4 s on both cores and 4.0 / 10.1-10.2 s on
# one (compilation runs on XLA's threads too), hence one core only under load.
ONE_CORE_MAX_CHI = 12


@dataclasses.dataclass(frozen=True)
class MERASimConfig:
    """Run configuration (TOML/JSON keys; ``--set key=value``; lists as ``--set chis=4,6,8``). One step is one
    Evenbly–Vidal sweep; the old keys ``sweeps``/``sweeps_per_chunk`` are refused with one line naming the new ones
    (``RENAMED_KEYS``, :func:`ivhl_jax.run.config.renamed_keys`)."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {"sweeps": "steps", "sweeps_per_chunk": "steps_per_chunk"}

    chis: tuple[int, ...] = (6, 8)  # bond dimension χ of each ladder stage (non-decreasing)
    steps: tuple[int, ...] = (2000, 1800)  # steps of each stage (one step = one Evenbly–Vidal sweep)
    layers: tuple[int, ...] = (1, 2)  # transitional layers of each stage (non-decreasing)
    chi_mid: int | None = None       # χ_mid of every stage when chi_mids is empty (None: χ_mid = χ)
    chi_mids: tuple[int, ...] = (4, 6)  # per-stage χ_mid, u's output bond (empty: chi_mid for every stage)
    precision: tuple[str, ...] = ()  # per-stage "f32" or "f64" (empty: all f64); f32 only before an f64 finish
    stuck_after: int = 300           # steps of the cold first stage before the stuck-start check (0: no check)
    stuck_every: int = 100           # steps between rechecks after stuck_after, up to step 1000 (0: one check)
    max_restarts: int = 3            # re-initialisations of a stuck cold start
    g: float = 1.0  # transverse field of the Ising chain (1: critical)
    power_iters: int = 4  # descending-superoperator iterations per sweep for the top density matrix
    u_delay: int = 10  # steps before the disentanglers start to be updated
    refsym: bool = True  # impose reflection symmetry (removes spurious minima)
    si_scales: int = 1  # scales summed in the scale-invariant layer's environment (1 = mainVarMERA)
    steps_per_chunk: int = 50  # steps (sweeps) per compiled chunk
    checkpoint_every: int = 200      # steps between checkpoints (a multiple of steps_per_chunk)
    seed: int = 0  # seed of the initial isometries
    compile_ahead: bool = False  # compile stage k+1's sweep in a background thread while stage k runs (opt-in)
    host_cores: int = 0  # CPU cores XLA may use (0: auto, one core if the host is busy and every χ <= 12; n: n)

    def validate(self) -> None:
        for name in ("steps_per_chunk", "checkpoint_every"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive integer (>= 1), got {val!r}; e.g. --set {name}=50")
        if not (len(self.chis) == len(self.steps) == len(self.layers)) or not self.chis:
            raise ValueError(f"chis, steps and layers need the same (non-zero) length, got {self.chis}, "
                             f"{self.steps}, {self.layers}")
        if list(self.chis) != sorted(self.chis):
            raise ValueError(f"chis must be non-decreasing (the ladder only grows), got {self.chis}")
        if list(self.layers) != sorted(self.layers):
            raise ValueError(f"layers must be non-decreasing, got {self.layers}")
        for k, n in enumerate(self.steps):
            if n < 1 or n % self.steps_per_chunk:
                raise ValueError(f"steps[{k}]={n} must be a positive multiple of steps_per_chunk="
                                 f"{self.steps_per_chunk}")
        if self.checkpoint_every % self.steps_per_chunk:
            raise ValueError("checkpoint_every must be a multiple of steps_per_chunk")
        for name in ("chi_mids", "precision"):
            val = getattr(self, name)
            if val and len(val) != len(self.chis):
                raise ValueError(f"{name} needs one entry per stage ({len(self.chis)}), got {val!r}; e.g. "
                                 f"--set {name}=[] for the default of every stage")
        for k, p in enumerate(self.precision):
            try:
                M.precision_dtype(p)
            except (ValueError, TypeError) as e:
                raise ValueError(f"precision[{k}]={p!r}: {e}") from None
            if k == len(self.chis) - 1 and p != "f64":
                raise ValueError(f"precision[{k}]={p!r}: the last stage must be 'f64' (the float64 finish)")
        if self.stuck_after:
            try:
                self.stuck_check().validate()
            except (ValueError, TypeError) as e:
                raise ValueError(f"stuck_after / stuck_every / max_restarts: {e}") from None
            for name in ("stuck_after", "stuck_every"):
                if getattr(self, name) % self.steps_per_chunk:
                    raise ValueError(f"{name}={getattr(self, name)} must be a multiple of steps_per_chunk="
                                     f"{self.steps_per_chunk} (or 0 to turn the check off)")
        if isinstance(self.host_cores, bool) or not isinstance(self.host_cores, int) or self.host_cores < 0:
            raise ValueError(f"host_cores must be 0 (auto) or a positive number of cores, got {self.host_cores!r}; "
                             "e.g. --set host_cores=1")
        for k, (chi, lay) in enumerate(zip(self.chis, self.layers)):
            self.stage_config(chi, lay, k).validate()

    def cores_to_use(self, load: float | None = None, cores: int | None = None) -> tuple[int | None, str]:
        """(the cores to hold XLA to (:func:`ivhl_jax.run.device.limit_host_cores`), None for all of them; why).
        ``load``: the host's 1-minute load average (default ``os.getloadavg()``), ``cores``: how many this process
        may use (default its affinity mask); the host counts as busy when load >= cores."""
        if self.host_cores:
            return self.host_cores, "host_cores"
        if max(self.chis) > ONE_CORE_MAX_CHI:
            return None, f"auto: a χ above {ONE_CORE_MAX_CHI}"
        load = os.getloadavg()[0] if load is None else load
        cores = len(os.sched_getaffinity(0)) if cores is None and hasattr(os, "sched_getaffinity") else cores
        busy = cores is not None and cores > 1 and load >= cores
        return (1 if busy else None), f"auto: the host is {'' if busy else 'not '}busy, load average {load:.2f}"

    def stuck_check(self) -> M.StuckCheck:
        return M.StuckCheck(after=self.stuck_after, max_restarts=self.max_restarts, every=self.stuck_every,
                            until=max(M.StuckCheck.until, self.stuck_after))

    def stage_config(self, chi: int, layers: int, k: int = 0) -> M.MERAConfig:
        want = self.chi_mids[k] if self.chi_mids else self.chi_mid
        mid = None if want is None else min(want, chi)
        return M.MERAConfig(chi=chi, chi_mid=mid, layers=layers, g=self.g, power_iters=self.power_iters,
                            u_delay=self.u_delay, refsym=self.refsym, si_scales=self.si_scales)


def _same_shapes(abstract: M.MERA, mera: M.MERA) -> bool:
    a, b = jax.tree.leaves(abstract), jax.tree.leaves(mera)
    return (len(a) == len(b) and str(jax.tree.structure(abstract)) == str(jax.tree.structure(mera))
            and all(x.shape == y.shape and x.dtype == y.dtype for x, y in zip(a, b)))


class StageCompiler:
    """Ahead-of-time compiled chunks of a ladder's stages (:func:`ivhl_jax.physics.mera.compile_advance`).

    ``get(k)`` returns stage k's compiled chunk: the one :meth:`prefetch` started in the background thread, or one
    compiled now in the calling thread (as a jit call would). ``prefetch(k)`` starts compiling stage k in one
    worker thread (XLA compilation releases the GIL), meant to be called once stage k − 1 runs its steady chunks
    (after its cold start, whose many small eager operations would compete with the compilation)."""

    def __init__(self, specs: Sequence[tuple[M.MERAConfig, int, Any]]):
        self.specs = list(specs)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mera-compile")
        self.futures: dict[int, Future] = {}
        self.seconds: dict[int, float] = {}

    def _build(self, k: int) -> Any:
        t = time.perf_counter()
        out = M.compile_advance(*self.specs[k])
        self.seconds[k] = round(time.perf_counter() - t, 2)
        return out

    def prefetch(self, k: int) -> None:
        if 0 <= k < len(self.specs) and k not in self.futures:
            self.futures[k] = self.pool.submit(self._build, k)

    def get(self, k: int) -> Any:
        return self.futures[k].result() if k in self.futures else self._build(k)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _stage_dtype(cfg: MERASimConfig, k: int) -> Any:
    return M.precision_dtype(cfg.precision[k] if cfg.precision else None)


def simulate(cfg: MERASimConfig, out: str, *, resume: bool = True, progress: bool = True) -> dict:
    """Run the ladder; returns the summary dict written to mera.json. Call it before any JAX computation for
    ``cfg.host_cores`` to take effect (as ``ivhl sim mera`` does); later it is reported as not applied."""
    cores, why = cfg.cores_to_use()
    host_cores = f"{limit_host_cores(cores) if cores else 'all cores'} ({why})"
    if progress:
        print(f"host cores: {host_cores}")
    e0 = M.E0_CRITICAL_ISING if cfg.g == 1.0 else None
    if e0 is None:
        from ivhl_jax.physics.exact import tfi_energy_density

        e0 = tfi_energy_density(cfg.g)
    stages = []
    energies: list[np.ndarray] = []
    restarts: list[dict] = []
    ahead = StageCompiler([(cfg.stage_config(chi, lay, k), cfg.steps_per_chunk, _stage_dtype(cfg, k))
                           for k, (chi, lay) in enumerate(zip(cfg.chis, cfg.layers))]) if cfg.compile_ahead else None
    try:
        with jax.enable_x64(True):
            key = jax.random.key(cfg.seed)
            mera: M.MERA | None = None
            for k, (chi, layers, n) in enumerate(zip(cfg.chis, cfg.layers, cfg.steps)):
                sc = cfg.stage_config(chi, layers, k)
                dtype = _stage_dtype(cfg, k)
                h = M.ising_two_site_hamiltonian(cfg.g, dtype)
                jitted = lambda m, sc=sc, h=h: M.make_advance(h, m, sc.power_iters, sc.u_delay, sc.refsym,
                                                              sc.si_scales)
                t0 = time.perf_counter()
                compiled = None
                if ahead is not None:
                    try:
                        compiled = ahead.get(k)
                    except Exception as exc:  # noqa: BLE001 - fall back to the jitted sweep, say so
                        print(f"stage {k + 1}: ahead-of-time compilation failed ({type(exc).__name__}: {exc}); "
                              "compiling on first use")
                make = (lambda m, c=compiled, j=jitted: c if (c is not None and m == cfg.steps_per_chunk) else j(m))
                ckdir = os.path.join(out, "ckpt", f"stage{k}")
                first = np.zeros((0,))
                if mera is None:
                    if cfg.stuck_after and n >= cfg.stuck_after:
                        # Cold start: the first checked steps run here, re-initialised while stuck; deterministic,
                        # so a resumed run repeats them (seconds) to recover their energies and the restart record.
                        mera, first, restarts = M.cold_start(sc, key, e0, make, cfg.steps_per_chunk,
                                                             cfg.stuck_check(), log=print, dtype=dtype, limit=n)
                        restarts = [{"stage": k, **r} for r in restarts]
                    else:
                        mera = M.init_mera(key, sc)
                else:
                    mera = M.grow(M.cast_mera(mera, np.float64), jax.random.fold_in(key, k), chi, sc.chi_mid,
                                  layers=layers, refsym=sc.refsym)
                mera = M.cast_mera(mera, dtype)
                if compiled is not None and not _same_shapes(compiled.abstract, mera):
                    compiled = None  # not expected (grow and init_mera agree on shapes); the jitted sweep is exact
                if ahead is not None:
                    ahead.prefetch(k + 1)  # the next stage compiles while this one runs its chunks
                rest = n - first.shape[0]
                advance = compiled if compiled is not None else jitted(cfg.steps_per_chunk)
                with Checkpointer(ckdir, save_every=cfg.checkpoint_every) as ck:
                    result = run_chunked(advance, mera, n_chunks=rest // cfg.steps_per_chunk,
                                         steps_per_chunk=cfg.steps_per_chunk, checkpointer=ck,
                                         progress=progress,
                                         description=f"MERA chi={chi} (stage {k + 1}/{len(cfg.chis)})",
                                         metadata={"chi": chi, "layers": layers, "after_cold_start": first.shape[0]})
                mera = result.state
                e = np.concatenate([first, np.asarray(result.history, np.float64)]) - e0
                energies.append(e)
                iso = M.isometry_errors(mera)
                stages.append({
                    "chi": chi, "chi_mid": sc.mid, "layers": layers, "steps": n,
                    "precision": jnp.dtype(dtype).name, "wall_time_s": time.perf_counter() - t0,
                    "resumed_from": result.resumed_from, "final_energy_error": float(e[-1]), "isometry_error": iso,
                })
                print(f"stage {k + 1}: chi={chi} chi_mid={sc.mid} layers={layers} steps={n} "
                      f"({jnp.dtype(dtype).name}): energy error {e[-1]:.3e} ({stages[-1]['wall_time_s']:.1f} s)")
            assert mera is not None
            mera = M.cast_mera(mera, np.float64)
            dims = M.scaling_dimensions(mera, num=len(ISING_DIMS))
            final = float(energies[-1][-1])
    finally:
        if ahead is not None:
            ahead.close()
    return {
        "model": "H = -sum X_i X_{i+1} - g sum Z_i (energy per site)",
        "g": cfg.g, "e0_exact": e0, "final_energy_error": final,
        "energy_error_per_sweep": np.concatenate(energies), "stages": stages, "restarts": restarts,
        "scaling_dimensions": dims, "scaling_dimensions_exact": ISING_DIMS[: len(dims)],
        "delta_sigma_rel_error": abs(dims[1] - 0.125) / 0.125,
        "delta_epsilon_rel_error": abs(dims[2] - 1.0), "host_cores": host_cores,
    }


def write_outputs(summary: dict, out: str) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {}
    err = np.asarray(summary["energy_error_per_sweep"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(np.arange(1, len(err) + 1), np.abs(err))
    edges = np.cumsum([s["steps"] for s in summary["stages"]])[:-1]
    for x in edges:
        ax.axvline(x, color="0.7", ls="--", lw=0.8)
    ax.set_xlabel("step (sweep)")
    ax.set_ylabel("energy error per site  |E − e₀|")
    ax.set_title("MERA, critical Ising (χ: " + " → ".join(str(s["chi"]) for s in summary["stages"]) + ")")
    if summary.get("restarts"):
        # the curve is the kept start's; say that stuck starts were thrown away before it
        ax.text(0.98, 0.95, f"{len(summary['restarts'])} stuck start(s) re-initialised", transform=ax.transAxes,
                ha="right", va="top", fontsize=8, color="0.3")
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
                        default_out=lambda cfg, a: "runs/mera", own_checkpoints=True, extendable=("host_cores",))


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(SIMULATION, argv)


if __name__ == "__main__":
    sys.exit(main())
