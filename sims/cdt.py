"""``ivhl sim cdt``: 1+1D CDT Monte Carlo, many independent chains: grow, thermalise, measure at fixed volume.

Examples::

    ivhl sim cdt                                            # T=16, target N2=512, lambda=ln 2, 8 chains
    ivhl sim cdt --set slices=32 --set volume=4096 --set chains=16 --set steps=400
    ivhl sim cdt --set eps=0 --set lam=0.75 --set volume=0  # no volume fixing (needs lam > ln 2)

One *step* of a chain is one *sweep* (``attempts_per_sweep`` Metropolis attempts): the config speaks the
library's vocabulary (``steps``, ``save_every``, as in ``trajectory(cdt.metropolis(lam, ...), ...)``), the text
below says sweeps. The chains run through ``chunked(cdt.metropolis(lam, ...))``. What a run does, as CDT users
expect from the reference code 2d-cdt:

1. *Start* on the smallest torus (every slice 3 vertices) and *grow* it: with volume fixing the quadratic
   term pulls N2 to the target, around which it then fluctuates.
2. *Thermalise* automatically: sweep until, in every chain, no vertex has had more than log2(2 N2) future
   or past links (a grown triangulation has a few vertices of very high coordination), then as many sweeps
   again (at most ``thermalise_max`` sweeps).
3. *Measure* ``steps`` sweeps (checkpointed every ``steps_per_chunk``; a killed run resumes exactly): slice lengths,
   coordination histogram, largest timelike degree, every ``save_every`` sweeps. Sweeps have a fixed length; with
   volume fixing the fixed-volume ensemble is the measurements at N2 = target (``at_target``) and only those
   enter the averages (the chain's law restricted to N2 = target; a sweep extended until N2 first hits the
   target would weight configurations by how easily they leave and re-enter it).
4. *Analyse*: integrated autocorrelation times of the volume-profile observables (over every measurement:
   the chain's own) with error bars, fixed-volume means with errors from independent chains; sphere volumes
   on the vertex and on the dual graph, Hausdorff dimensions from both, and the quantum Ricci curvature
   (average sphere distance, Klitgaard & Loll) on both, measured on the chains at the target at fixed times:
   the final state and after each of ``geometry_times`` further blocks of 10 sweeps.

One sweep is ``attempts_per_sweep`` move attempts per chain, a count fixed before the run (default: the target
N2, or 24 T with ``volume=0``, with the JAX engine; 100 times that with the host engine, as in 2d-cdt).
Outputs in ``--out`` (default ``runs/cdt``): ``thermalisation.png``, ``volume_profiles.png``,
``autocorrelation.png``, ``coordination.png``, ``curvature.png`` and ``summary.json`` (``steps_done``: measured
sweeps; ``thermalisation.steps``: sweeps of the grow-and-thermalise phase). The keys ``sweeps`` and
``measure_every`` are refused with one line naming ``steps`` and ``save_every``. Every phase (grow and
thermalise, sweeps, geometry) reports its progress.

``--set dims=3`` runs 2+1D CDT instead (``cdt.metropolis_3d`` on the host engine, S² × S¹ by tetrahedra): keys
``k0``, ``k3`` (default the reference code JorenB/3d-cdt's example couplings, 5 and 1.703, with its (2,6)/(6,2)
ratios, ``measure="reference"``, for which that k3 is tuned), ``target`` (N(3,1), or N3 with ``fix=n3``), ``eps``,
``slices``, ``attempts_per_sweep`` (default 10 x target), ``capacity`` (tetrahedron slots); a 1+1D-only key
(``lam``, ``volume``, the geometry keys) is refused with dims=3 and a 2+1D key with dims=2, in one line. The chains
grow to the target, thermalise (at the target once, then as many sweeps again, at least 200), and each measurement
records ``cdt.observe_3d`` (slice areas, N0, N31, N22, N3, at_target, move counters) in the run store; the summary
gives ⟨N22⟩/⟨N31⟩, ⟨N3⟩, the centred averaged slice-area profile and its de Sitter fit at the target volume
(``thermalisation.png``, ``volume_profiles.png``, ``summary.json``; default ``--out runs/cdt3``). It resumes like
the 1+1D run.

The jitted chunks and the geometry measurement are built once per process (:func:`vmapped_chunk`): a second
:func:`simulate` of the same configuration, or resuming a finished run, compiles nothing; extending a run
compiles only the analysis of its longer history, not the sweeps.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core import backend
from ivhl_jax.numerics import statistics
from ivhl_jax.numerics.rollout import Stepper, chunked
from ivhl_jax.physics import cdt
from ivhl_jax.physics.cdt import graph as cdt_graph
from ivhl_jax.physics.cdt import host as cdt_host
from ivhl_jax.physics.cdt.observables import geometry_arrays
from ivhl_jax.physics.cdt.state import live_triangles
from ivhl_jax.run.config import config_defaults, config_dict, option
from ivhl_jax.run.driver import RunContext, Simulation
from ivhl_jax.run.io import read_json, save_figure, write_json
from ivhl_jax.run.runner import phase, run_chunked
from ivhl_jax.run.store import RunStore
from ivhl_jax.sims import entry_point
from ivhl_jax.sims._common import shared_key
from ivhl_jax.train.checkpoint import Checkpointer


@dataclasses.dataclass(frozen=True)
class CDTConfig:
    slices: int = option(16, "number of time slices T (>= 3)")
    volume: int = option(512, "target number of triangles N2 (even; 0: no target, only with eps = 0)")
    lam: float = option(cdt.LN2, "cosmological constant lambda")
    eps: float = option(0.02, "volume-fixing strength eps (1+1D: 0 for none, then lam > ln 2 is required; dims=3: > 0)")
    chains: int = option(8, "independent Markov chains (vmapped)")
    steps: int = option(
        200, "measured steps (1 step = 1 sweep) per chain after thermalisation; raise it to extend a run"
    )
    save_every: int = option(2, "steps (sweeps) between measurements")
    steps_per_chunk: int = shared_key("steps_per_chunk", 20)
    attempts_per_sweep: int = option(
        0, "Metropolis attempts per sweep; 0: target N2 (jax engine) or 100x (host); dims=3: 10x target"
    )
    capacity: int = option(
        0, "vertex slots per chain; 0: the target N2 (N0 = N2 / 2, so 2x headroom); dims=3: tetrahedron slots"
    )
    engine: str = option(
        "auto", '"jax", "host" (compiled CPU kernel, needs numba) or "auto" (core.backend\'s cdt_engine)'
    )
    thermalise_max: int = option(2000, "most steps (sweeps) of the automatic grow-and-thermalise phase")
    seed: int = option(0, "PRNG seed of the chains")
    r_max: int = option(0, "distance-sphere radius for the Hausdorff estimates; 0: automatic")
    origins: int = option(8, "BFS origins per chain for the sphere volumes")
    curvature_deltas: int = option(0, "the Ricci curvature is measured for delta = 1..this; 0: automatic")
    curvature_samples: int = option(8, "point pairs per delta and chain for the Ricci curvature")
    geometry_times: int = option(
        8, "the geometry is also measured after this many further blocks of 10 sweeps (chains at the target)"
    )
    dims: int = option(2, "spacetime dimensions: 2 (1+1D, triangles) or 3 (2+1D, tetrahedra: cdt.metropolis_3d)")
    k0: float = option(5.0, "dims=3: coupling of N0 in S = -k0 N0 + k3 N3 (the reference's example: 5)")
    k3: float = option(1.703, "dims=3: coupling of N3, fixed (the reference's example: 1.703; it retunes it)")
    target: int = option(1000, "dims=3: target of the volume term, N(3,1) (fix=n31) or N3 (fix=n3)")
    fix: str = option("n31", 'dims=3: the count the volume term fixes, "n31" (the reference\'s default) or "n3"')
    measure: str = option(
        "reference",
        'dims=3: "reference" (its (2,6)/(6,2) ratios, for which its k3 is tuned) or "action" (balance for e^-S)',
    )

    def validate(self) -> None:
        """Every value checked before any work (one line each): the config, then the stepper's own builder."""
        for name in (
            "slices",
            "volume",
            "chains",
            "steps",
            "save_every",
            "steps_per_chunk",
            "attempts_per_sweep",
            "capacity",
            "thermalise_max",
            "seed",
            "r_max",
            "origins",
            "curvature_deltas",
            "curvature_samples",
            "geometry_times",
            "dims",
            "target",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be an integer, got {v!r}")
        for name in ("lam", "eps", "k0", "k3"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if self.eps < 0:
            raise ValueError(f"eps must be >= 0 (the volume-fixing strength; 0: none), got {self.eps}")
        if self.dims not in (2, 3):
            raise ValueError(f"dims must be 2 (1+1D) or 3 (2+1D), got {self.dims}")
        check_dimension_keys(self)
        if self.slices < 3:
            raise ValueError(f"slices must be >= 3 (a torus of T >= 3 slices), got {self.slices}")
        for name in (
            "chains",
            "steps",
            "save_every",
            "steps_per_chunk",
            "origins",
            "thermalise_max",
            "curvature_samples",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("attempts_per_sweep", "capacity", "seed", "r_max", "curvature_deltas", "geometry_times"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: automatic), got {getattr(self, name)}")
        if self.steps % self.steps_per_chunk or self.steps_per_chunk % self.save_every:
            raise ValueError(
                f"steps ({self.steps}) must be a multiple of steps_per_chunk ({self.steps_per_chunk}), "
                f"itself a multiple of save_every ({self.save_every})"
            )
        if self.dims == 3:
            validate_3d(self)
            return
        if self.volume < 0 or (self.volume != 0 and (self.volume < 6 * self.slices or self.volume % 2)):
            raise ValueError(
                f"volume must be an even number of triangles >= 6 * slices = {6 * self.slices} "
                f"(or 0: no target), got {self.volume}"
            )
        if self.eps > 0 and self.volume <= 0:
            raise ValueError("eps > 0 (volume fixing) needs volume > 0")
        if self.eps == 0 and self.lam <= cdt.LN2:
            raise ValueError(f"lam={self.lam} <= ln 2 without volume fixing diverges; set lam > ln 2 or eps > 0")
        if self.engine not in ("auto",) + cdt.ENGINES:
            raise ValueError(f"engine must be 'auto', 'jax' or 'host', got {self.engine!r}")
        if self.engine == "host" and not cdt_host.available():
            raise ValueError("engine='host' needs numba (pip install 'ivhl_jax[cpu-kernels]'); use engine=jax")
        need = _min_capacity(self)
        if self.capacity and self.capacity < need:
            raise ValueError(
                f"capacity={self.capacity} vertex slots cannot hold the target volume N2={self.volume} "
                f"(N0 = N2/2 plus fluctuations); use capacity >= {need} or 0 (automatic)"
            )
        d = derived(self)
        limit = cdt.max_capacity(d["engine"])
        if d["vertex_capacity"] > limit:
            raise ValueError(
                f"capacity={d['vertex_capacity']} vertex slots exceeds what the {d['engine']} engine "
                f"addresses ({limit}); use a smaller volume or capacity"
                + (", or engine=host" if d["engine"] == "jax" else "")
            )
        chain_stepper(self, d)  # the builder's own checks (one door)


def _min_capacity(cfg: CDTConfig) -> int:
    vol = cfg.volume if cfg.volume > 0 else 24 * cfg.slices
    return max(vol // 2 + 8 * int(math.sqrt(vol)) + 16, 3 * cfg.slices)


def engine_choice(cfg: CDTConfig) -> tuple[str, str]:
    """The engine of a run and why: ``cfg.engine`` when given, else (``"auto"``) the platform's ``cdt_engine`` in
    :func:`ivhl_jax.core.backend.defaults`, or the JAX engine where that one cannot run on this install."""
    if cfg.engine != "auto":
        return cfg.engine, "engine set in the config"
    choice = backend.defaults().cdt_engine
    if choice == "host" and not cdt_host.available():
        return "jax", (
            "engine=auto: this platform's default, the host engine, needs numba, which is not installed "
            "(pip install 'ivhl_jax[cpu-kernels]')"
        )
    if choice not in cdt.ENGINES:
        return "jax", f"engine=auto: the platform's cdt_engine {choice!r} is not a CDT engine"
    return choice, f"engine=auto: this platform's default (ivhl info: cdt_engine={choice})"


def derived(cfg: CDTConfig) -> dict:
    """Quantities derived from the config: target volume, engine, capacity, attempts per sweep, radii."""
    vol = cfg.volume if cfg.volume > 0 else 24 * cfg.slices
    engine, reason = engine_choice(cfg)
    cap = cfg.capacity or min(max(vol, _min_capacity(cfg)), cdt.max_capacity(engine))
    attempts = cfg.attempts_per_sweep or (100 * vol if engine == "host" else vol)
    r_max = cfg.r_max or int(min(4 * cfg.slices, 6 * math.sqrt(vol) + 10))
    deltas = cfg.curvature_deltas or max(1, min(6, r_max // 4))
    return {
        "target_volume": vol,
        "engine": engine,
        "engine_reason": reason,
        "vertex_capacity": cap,
        "attempts_per_sweep": attempts,
        "r_max": r_max,
        "curvature_deltas": deltas,
    }


def chain_stepper(cfg: CDTConfig, d: dict) -> Stepper[cdt.Chain, cdt.MetropolisParams]:
    """The Metropolis stepper of a run (volume fixing, attempts per sweep, engine)."""
    return cdt.metropolis(
        cfg.lam,
        eps=cfg.eps,
        target=float(cfg.volume if cfg.eps > 0 else 0),
        attempts_per_sweep=d["attempts_per_sweep"],
        engine=d["engine"],
    )


def vmapped_chunk(stepper, steps: int, save_every: int, observe):
    """``advance(chains) -> (chains, obs)``: ``steps`` steps (sweeps) of every chain, ``obs`` (measurements,
    chains, ...) every ``save_every`` steps.

    The jitted function is shared (:func:`_jitted_chunk`, one per ``(steps, save_every, observe)``) and takes
    the stepper as a pytree argument, so a second call, or a new stepper with other ``lam``/``eps``/``target``
    values, compiles nothing; only new shapes or static settings (engine, attempts per sweep) do."""
    chunked(stepper, steps, save_every=save_every, observe=observe)  # validates now, not inside a trace
    return functools.partial(_jitted_chunk(int(steps), int(save_every), observe), stepper)


@functools.lru_cache(maxsize=32)
def _jitted_chunk(steps: int, save_every: int, observe):
    @jax.jit
    def advance(stepper, chains):
        chunk = chunked(stepper, steps, save_every=save_every, observe=observe)
        chains, obs = jax.vmap(chunk)(chains)
        # the runner concatenates along axis 0: put measurements first, chains second
        return chains, jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), obs)

    return advance


def store_layout(cfg: CDTConfig) -> dict:
    """Names, coordinates and units of the run store's records (``RunStore.describe``): every record is
    (``time``, ``chain``, ...), with ``slice`` (time slice t) for the slice lengths, ``q`` (the coordination
    number, links at a vertex; the last bin holds q >= 32) for the coordination histogram and ``move`` (0, 1, 2:
    flip, add, delete, ``cdt.MOVE_NAMES``) for the move counters. Units are UDUNITS strings: ``"1"`` for counts,
    flags and indices."""
    per_chain = ("n2", "n0", "max_timelike_degree", "overflow", "missed_target", "at_target")
    dims: dict[str, tuple[str, ...]] = {name: ("chain",) for name in per_chain}
    dims |= {
        "lengths": ("chain", "slice"),
        "coordination": ("chain", "q"),
        "accepts": ("chain", "move"),
        "attempts": ("chain", "move"),
    }
    coords = {
        "chain": np.arange(cfg.chains),
        "slice": np.arange(cfg.slices),
        "q": np.arange(33),
        "move": np.arange(len(cdt.MOVE_NAMES)),  # cdt.MOVE_NAMES: flip, add, delete
    }
    return {"dims": dims, "coords": coords, "units": {name: "1" for name in (*dims, *coords)}}


def _trace_obs(chain: cdt.Chain, params: cdt.MetropolisParams) -> dict:
    """The thermalisation record of one sweep: N2 and the largest timelike degree."""
    return {"n2": chain.geometry.n2, "max_timelike_degree": cdt.max_timelike_degree(chain.geometry)}


def thermalise(cfg: CDTConfig, stepper, chains, d: dict, progress: bool = True):
    """Grow from the smallest torus and thermalise (see the module docstring); returns (chains, record).

    A chain meets the criterion at the first sweep where it is at the target volume (with volume fixing)
    and no vertex has more than log2(2 N2) future or past links; the phase ends once every chain has met
    it and as many sweeps again have passed as the slowest chain needed (at most ``cfg.thermalise_max``).
    ``record``: ``steps`` (sweeps done), ``criterion_met_at`` (per chain, -1: never), ``seconds`` and the
    per-sweep ``n2`` and ``max_timelike_degree`` (sweeps, chains)."""

    def ok(obs):
        n2, deg = obs["n2"], obs["max_timelike_degree"]
        return (deg <= np.log2(2.0 * np.maximum(n2, 1))) & ((n2 == cfg.volume) if cfg.eps > 0 else True)

    def status(obs):
        n2, deg = obs["n2"][-1], obs["max_timelike_degree"][-1]
        return f"N2 {int(n2.min())}..{int(n2.max())}, max timelike degree {int(deg.max())}"

    return grow_and_thermalise(
        cfg,
        vmapped_chunk(stepper, 10, 1, _trace_obs),
        chains,
        ok,
        status,
        detail=f"{cfg.chains} chains to N2 = {d['target_volume']}, {d['engine']} engine, at most "
        f"{cfg.thermalise_max} sweeps; the first block compiles",
        criterion="target volume or timelike-degree criterion",
        progress=progress,
    )


def grow_and_thermalise(
    cfg: CDTConfig, advance, chains, ok, status, *, detail: str, criterion: str, progress: bool, at_least: int = 0
):
    """The grow-and-thermalise loop of both dimensions: blocks of 10 sweeps of ``advance`` (a
    :func:`vmapped_chunk` recording every sweep) until every chain has met its criterion (``ok(obs)`` (10, chains)
    bool, from the block's records) and as many sweeps again have passed as the slowest chain needed, and at least
    ``at_least`` sweeps in all (at most ``cfg.thermalise_max``). ``status(obs)`` describes the last block in the
    progress lines. Returns ``(chains, record)``: ``steps``, ``criterion_met_at`` (per chain, -1: never),
    ``seconds`` and every recorded series (sweeps, chains)."""
    series: dict[str, list[np.ndarray]] = {}
    met = np.full(cfg.chains, -1)
    done = 0
    t0 = time.perf_counter()
    last_note = t0
    with phase("grow and thermalise", enabled=progress, detail=detail) as note:
        while done < cfg.thermalise_max:
            chains, obs = advance(chains)
            obs = {k: np.asarray(v) for k, v in jax.device_get(obs).items()}  # (block, chains) each
            for k, v in obs.items():
                series.setdefault(k, []).append(v)
            good = np.asarray(ok(obs), bool)
            first = np.where(good.any(0), done + 1 + good.argmax(0), -1)
            met = np.where((met < 0) & (first > 0), first, met)
            done += good.shape[0]
            if np.all(met > 0) and done >= max(2 * met.max(), at_least):
                break
            now = time.perf_counter()
            if now - last_note >= 1.0:  # a line at most every second while this phase runs
                last_note = now
                note(f"{done} sweeps, {int((met > 0).sum())}/{cfg.chains} chains met the criterion, " + status(obs))
        if np.all(met > 0):
            note(f"every chain met the criterion (at most {int(met.max())} sweeps); {done} sweeps in all")
    if np.any(met < 0):
        print(
            f"warning: {int((met < 0).sum())} chains not thermalised after thermalise_max={cfg.thermalise_max} "
            f"sweeps ({criterion} not met); raise thermalise_max"
        )
    record = {"steps": done, "criterion_met_at": met.tolist(), "seconds": time.perf_counter() - t0}
    record |= {k: np.concatenate(v).tolist() for k, v in series.items()}
    return chains, record


def simulate(
    cfg: CDTConfig,
    out: str,
    *,
    checkpointer: Checkpointer | None = None,
    progress: bool = True,
    sink: RunStore | None = None,
) -> dict:
    """Run ``cfg`` (resuming from ``checkpointer`` when it holds a checkpoint); write the outputs into ``out``."""
    if cfg.dims == 3:
        return simulate_3d(cfg, out, checkpointer, progress, sink)
    d = derived(cfg)
    print(f"cdt: {d['engine']} engine ({d['engine_reason']})")
    stepper = chain_stepper(cfg, d)
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.chains)
    chains = jax.vmap(lambda k: stepper.init(k, cfg.slices, 3, d["vertex_capacity"]))(keys)
    # committed to their device, as the arrays a checkpoint restores are: jit keys its cache on committedness,
    # so a resume in this process then reuses the compiled chunks instead of compiling them again
    chains = jax.tree_util.tree_map(lambda x: jax.device_put(x, x.sharding), chains)
    therm_path = os.path.join(out, "thermalisation.json")
    resuming = checkpointer is not None and checkpointer.latest_step() is not None
    if resuming and os.path.exists(therm_path):
        therm = read_json(therm_path, "the thermalisation record", fix="use --no-resume to start over")
    else:
        chains, therm = thermalise(cfg, stepper, chains, d, progress)
        write_json(therm_path, therm)
    res, hist = measure_chains(
        cfg, stepper, chains, cdt.observe, store_layout(cfg), "cdt sweeps", checkpointer, sink, progress
    )
    final = res.state.geometry
    states = geometry_states(cfg, stepper, res.state, d)
    if bool(np.any(hist["overflow"])):
        print(
            f"warning: capacity {d['vertex_capacity']} overflowed in some chain; rerun with "
            f"--set capacity={2 * d['vertex_capacity']}"
        )
    return _report(cfg, out, final, states, hist, res, d, therm, progress)


def measure_chains(
    cfg: CDTConfig,
    stepper,
    chains,
    observe,
    layout: dict,
    description: str,
    checkpointer: Checkpointer | None,
    sink: RunStore | None,
    progress: bool,
):
    """The measured sweeps of both dimensions: ``cfg.steps`` sweeps in chunks of ``cfg.steps_per_chunk``,
    ``observe`` every ``cfg.save_every``, checkpointed per chunk and resumed from ``checkpointer``, the records
    streamed to ``sink`` (described by ``layout``, :func:`store_layout`). Returns ``(res, hist)``: the runner's
    result and every record (measurements, chains, ...), read back from the store when there is one."""
    per_chunk = cfg.steps_per_chunk
    advance = vmapped_chunk(stepper, per_chunk, cfg.save_every, observe)
    if sink is not None:
        # a sweep count is a number (UDUNITS has no sweep): unit "1", the long_name says what it counts
        sink.describe(time_unit="1", long_names={"time": "Monte Carlo sweeps done"}, **layout)
    res = run_chunked(
        advance,
        chains,
        n_chunks=cfg.steps // per_chunk,
        steps_per_chunk=per_chunk,
        checkpointer=checkpointer,
        metadata={"config": config_dict(cfg)},
        progress=progress,
        description=description,
        sink=sink,
    )
    # with the run store the records come back from it for the analysis, none were kept in memory
    hist = sink.read(like=jax.eval_shape(advance, chains)[1]) if sink is not None else jax.device_get(res.history)
    return res, hist


def geometry_states(cfg: CDTConfig, stepper, chains, d: dict) -> list[tuple[cdt.CDTState, np.ndarray]]:
    """The triangulations the geometry is measured on: ``(states, use)`` at fixed times, the final chains and
    the chains after each of ``cfg.geometry_times`` further blocks of 10 sweeps; ``use`` (chains,) marks the
    chains at the target volume (every chain without volume fixing). Fixed times and every chain at the target
    there, never a wait for the target: the fixed-volume ensemble, unbiased. The extra sweeps do not enter the
    checkpoint (a resumed or extended run repeats them from its own final chains)."""
    advance = vmapped_chunk(stepper, 10, 1, _trace_obs)  # the thermalisation's compiled block

    def use(g):
        return np.asarray(g.n2) == d["target_volume"] if cfg.eps > 0 else np.ones(cfg.chains, bool)

    out = [(chains.geometry, use(chains.geometry))]
    for _ in range(cfg.geometry_times):
        chains, _obs = advance(chains)
        out.append((chains.geometry, use(chains.geometry)))
    return out


def _autocorrelation(series: np.ndarray) -> dict:
    """τ_int per chain of a (n_meas, chains) series, averaged over chains (error: spread / sqrt(chains)).

    NaN when there are fewer than 20 measurements (the windowed estimator needs a series many τ long)."""
    import warnings

    if series.shape[0] < 20:
        return {"tau_int": float("nan"), "tau_int_err": float("nan"), "n_over_tau": float("nan")}
    taus = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # short demo runs: reported through n_over_tau below
        for c in range(series.shape[1]):
            if np.ptp(series[:, c]) > 0:
                taus.append(statistics.integrated_autocorrelation_time(series[:, c]).tau)
    if not taus:
        return {"tau_int": 0.5, "tau_int_err": 0.0, "n_over_tau": float(series.shape[0] / 0.5)}
    tau = float(np.mean(taus))
    err = float(np.std(taus, ddof=1) / math.sqrt(len(taus))) if len(taus) > 1 else float("nan")
    return {"tau_int": tau, "tau_int_err": err, "n_over_tau": float(series.shape[0] / tau)}


def _mean_error(series: np.ndarray, use: np.ndarray) -> tuple[float, float]:
    """Mean over the measurements ``use`` marks (n_meas, chains); error from the spread of the per-chain means
    (independent chains; chains with no marked measurement left out)."""
    counts = use.sum(0)
    if not counts.any():
        return float("nan"), float("nan")
    per_chain = (series * use).sum(0)[counts > 0] / counts[counts > 0]
    err = float(per_chain.std(ddof=1) / math.sqrt(per_chain.size)) if per_chain.size > 1 else float("nan")
    return float(series[use].mean()), err


@functools.lru_cache(maxsize=32)
def _geometry_fn(graph: str, r_max: int, deltas: tuple[int, ...], origins: int, samples: int):
    """The jitted, vmapped measurement of :func:`measure_geometry` on one graph (cached: it compiles once)."""

    def one(key, s):
        tv, tnbr, tri_alive, vert_alive = geometry_arrays(s)
        if graph == "vertex":
            (src, dst), alive = cdt_graph.vertex_adjacency_edges(tv, tri_alive), vert_alive
        else:
            (src, dst), alive = cdt_graph.dual_adjacency_edges(tnbr, tri_alive), tri_alive
        k1, k2 = jax.random.split(key)
        prof = cdt_graph.ricci_curvature_profile(k2, src, dst, alive, deltas, samples)
        return {
            "spheres": cdt_graph.sphere_volumes(k1, src, dst, alive, r_max, origins),
            "curvature": prof.samples,
            "curvature_overflow": prof.n_overflow,
        }

    return jax.jit(jax.vmap(one))


def measure_geometry(cfg: CDTConfig, states: list, d: dict, progress: bool = False) -> dict:
    """Sphere volumes, Hausdorff dimensions and Ricci curvature on the vertex and dual graphs of the chains marked
    in ``states`` (:func:`geometry_states`: ``[(batched states, use (chains,)), ...]``), pooled over the times."""
    r_max, deltas = int(d["r_max"]), tuple(range(1, int(d["curvature_deltas"]) + 1))
    keys = jax.random.split(jax.random.key(cfg.seed + 1), cfg.chains)
    n_used = int(sum(int(np.sum(u)) for _, u in states))
    geo: dict = {"deltas": list(deltas), "r_max": r_max, "configurations": n_used, "times": len(states)}
    with phase(
        "geometry",
        enabled=progress,
        detail=f"sphere volumes to r = {r_max} and Ricci curvature for delta = 1..{len(deltas)}, "
        f"vertex and dual graphs of {n_used} configurations at the target ({len(states)} times x {cfg.chains} chains)",
    ) as note:
        for i, name in enumerate(("vertex", "dual")):
            fn = _geometry_fn(name, r_max, deltas, int(cfg.origins), int(cfg.curvature_samples))
            spheres_all, samples_all, overflow = [], [], 0
            for j, (state, used) in enumerate(states):
                if not used.any():
                    continue
                k = jax.vmap(lambda k, i=i, j=j: jax.random.fold_in(jax.random.fold_in(k, i), j))(keys)
                res = jax.device_get(fn(k, state))
                spheres_all.append(np.asarray(res["spheres"])[used])
                samples_all.append(np.asarray(res["curvature"])[used])  # (used chains, D, S)
                overflow += int(np.asarray(res["curvature_overflow"])[used].sum())
            if not spheres_all:
                geo[name] = None
                note(f"{name} graph: no chain at the target volume at the measured times; raise geometry_times")
                continue
            spheres = np.concatenate(spheres_all).mean(0)
            d_h, d_h_err = cdt.hausdorff_from_spheres(spheres)
            samples = np.concatenate(samples_all)
            ok = np.isfinite(samples)
            n_ok = ok.sum((0, 2))
            mean = np.where(n_ok > 0, np.nansum(samples, (0, 2)) / np.maximum(n_ok, 1), np.nan)
            var = np.nansum((samples - mean[None, :, None]) ** 2, (0, 2)) / np.maximum(n_ok - 1, 1)
            geo[name] = {
                "sphere_volumes": spheres.tolist(),
                "mean_distance": float(cdt.mean_distance(spheres)),
                "hausdorff_local": d_h,
                "hausdorff_local_err": d_h_err,
                "dbar_over_delta": mean.tolist(),
                "dbar_over_delta_err": np.sqrt(var / np.maximum(n_ok, 1)).tolist(),
                "curvature_samples": n_ok.tolist(),
                "curvature_sphere_overflow": overflow,
            }
            note(f"{name} graph measured")
    return geo


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_thermalisation(cfg: CDTConfig, out: str, therm: dict, d: dict) -> str:
    """``thermalisation.png``: N₂ and the largest future/past degree of every chain per sweep of the
    grow-and-thermalise phase."""
    plt = _pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    sw = np.arange(1, len(therm["n2"]) + 1)
    ax[0].plot(sw, np.asarray(therm["n2"]), lw=0.7)
    ax[0].axhline(d["target_volume"], color="k", ls="--", lw=0.8, label="target")
    ax[0].set_xlabel("sweep (grow and thermalise)")
    ax[0].set_ylabel("$N_2$")
    ax[0].legend(fontsize=7)
    degs = np.asarray(therm["max_timelike_degree"])
    ax[1].plot(sw, degs, lw=0.7)
    ax[1].plot(sw, np.log2(2.0 * np.maximum(np.asarray(therm["n2"]), 1)).max(1), "k--", lw=0.8, label="$\\log_2(2N_2)$")
    met = [m for m in therm["criterion_met_at"] if m > 0]
    if met:
        ax[1].axvline(max(met), color="r", lw=0.8, label="all chains met the criterion")
    ax[1].set_xlabel("sweep")
    ax[1].set_ylabel("largest future/past degree")
    ax[1].legend(fontsize=7)
    fig.suptitle(f"thermalisation of {cfg.chains} chains ({d['engine']} engine)")
    path = save_figure(fig, os.path.join(out, "thermalisation.png"))
    plt.close(fig)
    return path


def _plot_profiles(
    cfg: CDTConfig, out: str, lengths: np.ndarray, centred: np.ndarray, at: np.ndarray, corr: np.ndarray, d: dict
) -> str:
    """``volume_profiles.png``: the centred slice-length profiles at the target volume (mean and 16-84 %) with the
    last profile of up to three chains, and the volume-volume correlator."""
    plt = _pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    t = np.arange(cfg.slices)
    if at.any():
        ax[0].plot(t, centred[at].mean(0), "k-", lw=2, label="mean at the target (centred)")
        ax[0].fill_between(t, *np.percentile(centred[at], [16, 84], axis=0), color="0.8", label="16-84 %")
    for c in range(min(3, cfg.chains)):
        ax[0].plot(t, lengths[-1, c], lw=0.8, label=f"chain {c}, last")
    ax[0].set_xlabel("time slice t (centred on the volume maximum)")
    ax[0].set_ylabel("slice length $l_t$")
    ax[0].legend(fontsize=7)
    ax[1].plot(np.arange(cfg.slices), corr, "o-")
    ax[1].set_xlabel(r"slice separation $\Delta t$")
    ax[1].set_ylabel(r"$\langle l_t l_{t+\Delta t}\rangle - \langle l\rangle^2$")
    fig.suptitle(f"CDT T={cfg.slices}, N2={d['target_volume']}, lambda={cfg.lam:.4f}, eps={cfg.eps}")
    path = save_figure(fig, os.path.join(out, "volume_profiles.png"))
    plt.close(fig)
    return path


def _plot_autocorrelation(cfg: CDTConfig, out: str, series: dict[str, np.ndarray], auto: dict) -> str:
    """``autocorrelation.png``: the autocorrelation of each ``series[key]`` ``(n_meas, chains)`` against the lag
    in sweeps, averaged over the chains that move, labelled with its integrated autocorrelation time."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for key, values in series.items():
        lags = np.arange(min(values.shape[0], 50))
        rho = np.mean(
            [
                statistics.autocorrelation(values[:, c])[: lags.size]
                for c in range(values.shape[1])
                if np.ptp(values[:, c]) > 0
            ]
            or [np.zeros(lags.size)],
            0,
        )
        ax.plot(
            lags * cfg.save_every,
            rho,
            "o-",
            ms=3,
            label=f"{key.replace('_', ' ')}: tau_int = {auto[key]['tau_int']:.2f} +- {auto[key]['tau_int_err']:.2f} "
            "measurements",
        )
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("lag (sweeps)")
    ax.set_ylabel("autocorrelation")
    ax.legend(fontsize=7)
    path = save_figure(fig, os.path.join(out, "autocorrelation.png"))
    plt.close(fig)
    return path


def _plot_coordination(out: str, coord: np.ndarray, geo: dict) -> str:
    """``coordination.png``: the coordination-number histogram and the sphere volumes S(r) of each graph."""
    plt = _pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    ax[0].bar(np.arange(coord.size), coord / max(coord.sum(), 1))
    ax[0].set_xlabel("coordination number q")
    ax[0].set_ylabel("fraction of vertices")
    for name in ("vertex", "dual"):
        if geo[name] is None:
            continue
        sph = np.asarray(geo[name]["sphere_volumes"])
        ax[1].loglog(
            np.arange(1, sph.size),
            sph[1:],
            "o-",
            ms=3,
            label=f"{name} graph, local d_H = {geo[name]['hausdorff_local']:.2f}",
        )
    ax[1].set_xlabel("graph distance r (links)")
    ax[1].set_ylabel("sphere volume S(r)")
    ax[1].legend(fontsize=7)
    path = save_figure(fig, os.path.join(out, "coordination.png"))
    plt.close(fig)
    return path


def _plot_curvature(out: str, geo: dict) -> str:
    """``curvature.png``: the quantum Ricci curvature, average sphere distance d̄/δ against δ, of each graph."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for name in ("vertex", "dual"):
        if geo[name] is None:
            continue
        ax.errorbar(
            geo["deltas"],
            geo[name]["dbar_over_delta"],
            geo[name]["dbar_over_delta_err"],
            fmt="o-",
            ms=3,
            capsize=2,
            label=f"{name} graph",
        )
    ax.set_xlabel(r"$\delta$ (links)")
    ax.set_ylabel(r"$\bar d / \delta$")
    ax.set_title("quantum Ricci curvature: average sphere distance")
    ax.legend(fontsize=7)
    path = save_figure(fig, os.path.join(out, "curvature.png"))
    plt.close(fig)
    return path


def _print_report(summary: dict, at: np.ndarray) -> None:
    """The run's results in one line, and a note for each autocorrelation time measured on too few data."""
    auto, geo = summary["autocorrelation"], summary["geometry"]
    d_h = {k: (f"{geo[k]['hausdorff_local']:.2f}" if geo[k] is not None else "n/a") for k in ("vertex", "dual")}
    print(
        f"CDT: <N2> = {summary['mean_n2']:.1f}, {int(at.sum())}/{at.size} measurements at the target volume, "
        f"<l> = {summary['mean_slice_length']:.2f}, tau_int(spread) = "
        f"{auto['profile_spread']['tau_int']:.2f} measurements, local d_H vertex {d_h['vertex']} / dual "
        f"{d_h['dual']} ({geo['configurations']} configurations), acceptance {summary['acceptance']}"
    )
    for name, a in auto.items():
        if math.isnan(a["n_over_tau"]):
            print(f"note: {name}: fewer than 20 measurements, no autocorrelation time; raise steps")
        elif a["n_over_tau"] < 50:
            print(f"note: {name}: only {a['n_over_tau']:.0f} x tau_int measurements; raise steps for reliable errors")


def _run_record(cfg: CDTConfig, d: dict, therm: dict, res, hist: dict, at: np.ndarray) -> dict:
    """The head of both dimensions' summaries: the config and derived settings, the thermalisation, the steps done
    and resumed from, the wall time, overflow and the at-target count of the measurements ``at``."""
    return {
        "config": config_dict(cfg),
        "derived": d,
        "thermalisation": {k: therm[k] for k in ("steps", "criterion_met_at", "seconds")},
        "steps_done": res.steps,
        "resumed_from": res.resumed_from,
        "wall_time_s": res.wall_time_s,
        "overflow": bool(np.any(hist["overflow"])),
        "measurements_at_target": int(at.sum()),
        "at_target_fraction": float(at.mean()),
    }


def _report(cfg, out, final, states, hist, res, d, therm, progress=False) -> dict:
    """The summary of a run (``summary.json``, the figures, one printed line) from its records ``hist``, its final
    chains ``final``, the configurations ``states`` for the geometry, the derived settings ``d`` and the
    thermalisation record ``therm``."""
    lengths = np.asarray(hist["lengths"])  # (n_meas, chains, T)
    n2 = np.asarray(hist["n2"])
    at = np.asarray(hist["at_target"], bool)  # (n_meas, chains): the fixed-volume ensemble (all without fixing)
    centred = np.asarray(cdt.center_profiles(lengths))
    corr = np.asarray(cdt.volume_correlator(lengths[at])) if at.any() else np.full(cfg.slices, np.nan)
    coord = (np.asarray(hist["coordination"]) * at[..., None]).sum((0, 1))
    acc = np.asarray(final.accepts).sum(0)
    att = np.asarray(final.attempts).sum(0)
    spread = lengths.std(-1)  # (n_meas, chains): how far the profile is from a cylinder
    series = {"profile_spread": spread, "largest_slice": lengths.max(-1).astype(float)}
    auto = {key: _autocorrelation(values) for key, values in series.items()}
    geo = measure_geometry(cfg, states, d, progress)
    figures = [
        _plot_thermalisation(cfg, out, therm, d),
        _plot_profiles(cfg, out, lengths, centred, at, corr, d),
        _plot_autocorrelation(cfg, out, series, auto),
        _plot_coordination(out, coord, geo),
        _plot_curvature(out, geo),
    ]
    spread_mean, spread_err = _mean_error(spread, at)
    q = np.arange(coord.size)
    summary = {
        **_run_record(cfg, d, therm, res, hist, at),
        "mean_n2": float(n2.mean()),
        "std_n2": float(n2.std()),
        "mean_slice_length": float(lengths[at].mean()) if at.any() else float("nan"),
        "profile_spread": {"mean": spread_mean, "err": spread_err},
        "autocorrelation": auto,
        "mean_profile_centred": (centred[at].mean(0) if at.any() else np.full(cfg.slices, np.nan)).tolist(),
        "volume_correlator": corr.tolist(),
        "coordination_histogram": (coord / max(coord.sum(), 1)).tolist(),
        "mean_coordination": float((q * coord).sum() / max(coord.sum(), 1)),
        "acceptance": {n: float(acc[i] / max(att[i], 1)) for i, n in enumerate(cdt.MOVE_NAMES)},
        "accepted_moves": {n: int(acc[i]) for i, n in enumerate(cdt.MOVE_NAMES)},
        "geometry": geo,
        "figures": figures,
    }
    path = write_json(os.path.join(out, "summary.json"), summary)
    _print_report(summary, at)
    summary["summary_path"] = path
    return summary


# ----------------------------------------------------------------------------------------------
# 2+1 dimensions (dims=3): cdt.metropolis_3d on the host engine

#: keys only the 1+1D run reads, and keys only the 2+1D run reads (``check_dimension_keys``)
ONLY_2D = ("volume", "lam", "r_max", "origins", "curvature_deltas", "curvature_samples", "geometry_times")
ONLY_3D = ("k0", "k3", "target", "fix", "measure")
#: the 2+1D thermalisation lasts at least this many sweeps: several autocorrelation times of N22/N31 at the default
#: couplings and sweep length (about 50 sweeps: docs/guide/cdt.md, the reference's k0 = 5 runs)
THERMALISE_3D_MIN = 200


def check_dimension_keys(cfg: CDTConfig) -> None:
    """A key of the other dimension set to other than its default is refused in one line naming it (a 2+1D run
    would silently ignore ``lam``, a 1+1D run ``k0``)."""
    defaults = config_defaults(CDTConfig)
    other, theirs = (ONLY_2D, "1+1D (dims=2)") if cfg.dims == 3 else (ONLY_3D, "2+1D (dims=3)")
    stray = [k for k in other if getattr(cfg, k) != defaults[k]]
    if stray:
        mine = ", ".join(ONLY_3D if cfg.dims == 3 else ONLY_2D)
        raise ValueError(
            f"dims={cfg.dims} does not read the {theirs} key(s) {', '.join(stray)}; leave them out "
            f"(the dims={cfg.dims} keys of their kind: {mine})"
        )
    if cfg.dims == 3 and cfg.engine == "jax":
        raise ValueError("dims=3 runs on the host engine (numba) only: set engine=host or auto, not jax")


def derived_3d(cfg: CDTConfig) -> dict:
    """Quantities derived from a 2+1D config: attempts per sweep (default 10 x target, the sweep of the
    reference runs in docs/guide/cdt.md) and tetrahedron slots per chain (default :func:`cdt.default_capacity_3d`)."""
    attempts = cfg.attempts_per_sweep or 10 * cfg.target
    params = cdt.metropolis_3d(cfg.k0, cfg.k3, target=cfg.target, eps=cfg.eps, fix=cfg.fix).params
    capacity = cfg.capacity or cdt.default_capacity_3d(params, cfg.slices)
    return {
        "engine": "host",
        "engine_reason": "dims=3 runs on the host engine",
        "attempts_per_sweep": attempts,
        "tetra_capacity": capacity,
    }


def stepper_3d(cfg: CDTConfig, d: dict) -> Stepper[cdt.Chain3d, cdt.Metropolis3dParams]:
    """The 2+1D stepper of a run: ``cdt.metropolis_3d`` with the config's couplings, fix and measure."""
    return cdt.metropolis_3d(
        cfg.k0,
        cfg.k3,
        target=cfg.target,
        eps=cfg.eps,
        fix=cfg.fix,
        attempts_per_sweep=d["attempts_per_sweep"],
        measure=cfg.measure,
    )


def validate_3d(cfg: CDTConfig) -> None:
    """The 2+1D settings, one line each, then the builder's and ``init``'s own checks (traced, nothing allocated)."""
    if not cdt_host.available():
        raise ValueError("dims=3 needs numba, its engine is compiled for the CPU (pip install 'ivhl_jax[cpu-kernels]')")
    if cfg.eps <= 0:
        raise ValueError(
            "dims=3 needs eps > 0 (the volume term holds the volume at target; k3 is fixed, so use 0.005..0.02)"
        )
    start = (6 if cfg.fix == "n31" else 18) * cfg.slices
    if cfg.target < start:
        raise ValueError(
            f"target must be >= {start} (the starting triangulation's {cfg.fix.upper()} for {cfg.slices} slices), "
            f"got {cfg.target}"
        )
    d = derived_3d(cfg)  # the builder checks k0, k3, eps, fix, measure (one door)
    stepper = stepper_3d(cfg, d)
    jax.eval_shape(lambda k: stepper.init(k, cfg.slices, d["tetra_capacity"]), jax.random.key(0))


def store_layout_3d(cfg: CDTConfig) -> dict:
    """Names, coordinates and units of a 2+1D run's records (``cdt.observe_3d``): every record is (``time``,
    ``chain``, ...), with ``slice`` for ``slice_volumes`` (spatial triangles of slice t) and ``move`` (0..4:
    (2,6), (6,2), (4,4), (2,3), (3,2), ``cdt.MOVE_NAMES_3D``) for the move counters of the sweep."""
    per_chain = ("n0", "n31", "n22", "n3", "at_target", "overflow", "missed_target")
    dims: dict[str, tuple[str, ...]] = {name: ("chain",) for name in per_chain}
    dims |= {"slice_volumes": ("chain", "slice"), "accepts": ("chain", "move"), "attempts": ("chain", "move")}
    coords = {
        "chain": np.arange(cfg.chains),
        "slice": np.arange(cfg.slices),
        "move": np.arange(len(cdt.MOVE_NAMES_3D)),
    }
    return {"dims": dims, "coords": coords, "units": {name: "1" for name in (*dims, *coords)}}


def _trace_obs_3d(chain: cdt.Chain3d, params: cdt.Metropolis3dParams) -> dict:
    """The thermalisation record of one 2+1D sweep: N(3,1) + N(1,3), N22 and the at-target flag."""
    obs = cdt.observe_3d(chain, params)
    return {k: obs[k] for k in ("n31", "n22", "at_target")}


def simulate_3d(cfg: CDTConfig, out: str, checkpointer: Checkpointer | None, progress: bool, sink: RunStore | None):
    """A 2+1D run (``dims=3``): chains from the minimal triangulation grown to the target and thermalised (every
    chain at the target once, then as many sweeps again, at least ``THERMALISE_3D_MIN`` in all), ``cfg.steps``
    measured sweeps (``cdt.observe_3d`` every ``save_every``, checkpointed per chunk, streamed to the run store),
    then the analysis (:func:`report_3d`)."""
    d = derived_3d(cfg)
    print(f"cdt: 2+1D, host engine, k0 = {cfg.k0}, k3 = {cfg.k3}, target {cfg.fix.upper()} = {cfg.target}")
    stepper = stepper_3d(cfg, d)
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.chains)
    chains = jax.vmap(lambda k: stepper.init(k, cfg.slices, d["tetra_capacity"]))(keys)
    chains = jax.tree_util.tree_map(lambda x: jax.device_put(x, x.sharding), chains)  # committed, as in simulate
    therm_path = os.path.join(out, "thermalisation.json")
    if checkpointer is not None and checkpointer.latest_step() is not None and os.path.exists(therm_path):
        therm = read_json(therm_path, "the thermalisation record", fix="use --no-resume to start over")
    else:
        chains, therm = grow_and_thermalise(
            cfg,
            vmapped_chunk(stepper, 10, 1, _trace_obs_3d),
            chains,
            lambda obs: obs["at_target"],
            lambda obs: f"N(3,1) {int(obs['n31'][-1].min()) // 2}..{int(obs['n31'][-1].max()) // 2}",
            detail=f"{cfg.chains} chains to {cfg.fix.upper()} = {cfg.target}, at most {cfg.thermalise_max} sweeps",
            criterion="target volume",
            progress=progress,
            at_least=THERMALISE_3D_MIN,
        )
        write_json(therm_path, therm)
    res, hist = measure_chains(
        cfg, stepper, chains, cdt.observe_3d, store_layout_3d(cfg), "cdt 2+1D sweeps", checkpointer, sink, progress
    )
    if bool(np.any(hist["overflow"])):
        print(f"warning: capacity {d['tetra_capacity']} overflowed in some chain; rerun with a larger capacity")
    return report_3d(cfg, out, hist, res, d, therm)


def report_3d(cfg: CDTConfig, out: str, hist: dict, res, d: dict, therm: dict) -> dict:
    """The summary of a 2+1D run from its records ``hist`` (measurements, chains, ...): at the target volume
    (``at_target``), ⟨N22⟩/⟨N31⟩ (error from the spread of the chains' ratios), ⟨N3⟩, ⟨N0⟩, the autocorrelation
    time of N22/N31, the centred averaged slice-area profile and its de Sitter fit
    (:mod:`~ivhl_jax.physics.cdt.d3_profile`; None where it fails, e.g. no blob), the acceptance per move over the
    measured sweeps; ``summary.json``, ``thermalisation.png`` and ``volume_profiles.png``."""
    from ivhl_jax.physics.cdt import d3_profile

    at = np.asarray(hist["at_target"], bool)
    n22, n31 = np.asarray(hist["n22"], np.float64), np.asarray(hist["n31"], np.float64)
    sv = np.asarray(hist["slice_volumes"], np.float64)  # (n, chains, T)
    used = at.sum(0) > 0
    ratio = float((n22 * at).sum() / max((n31 * at).sum(), 1.0))
    per_chain = (n22 * at).sum(0)[used] / (n31 * at).sum(0)[used]
    ratio_err = float(per_chain.std(ddof=1) / math.sqrt(per_chain.size)) if per_chain.size > 1 else float("nan")
    profiles = np.swapaxes(sv, 0, 1)[at.T]  # each chain's measurements in order, chain after chain
    fit: dict[str, Any] | None = None
    mean = err = np.full(cfg.slices, np.nan)
    if profiles.shape[0] >= 2:
        mean, err = d3_profile.mean_profile(profiles)
        stalk = d3_profile.stalk_level(mean)
        try:
            f = d3_profile.fit_de_sitter(
                mean, err, float(np.asarray(hist["n3"])[at].mean()), min_area=2 * stalk, stalk=stalk
            )
            fit = {"s": f.s, "s_err": f.s_err, "t0": f.t0, "chi2": f.chi2, "dof": f.dof, "stalk": f.stalk}
            fit["volume"] = f.volume
        except (ValueError, RuntimeError) as e:  # no blob above the stalk, or no convergence: said in the summary
            fit = {"error": str(e)}
    acc = np.asarray(hist["accepts"]).sum((0, 1))
    att = np.asarray(hist["attempts"]).sum((0, 1))
    n3_mean, n3_err = _mean_error(np.asarray(hist["n3"], np.float64), at)
    n0_mean, n0_err = _mean_error(np.asarray(hist["n0"], np.float64), at)
    figures = [_plot_thermalisation_3d(cfg, out, therm), _plot_profile_3d(cfg, out, mean, err, fit, sv[-1])]
    summary = {
        **_run_record(cfg, d, therm, res, hist, at),
        "n22_over_n31": {"mean": ratio, "err": ratio_err},
        "mean_n3": {"mean": n3_mean, "err": n3_err},
        "mean_n0": {"mean": n0_mean, "err": n0_err},
        "autocorrelation": {"n22_over_n31": _autocorrelation(n22 / n31)},
        "mean_profile_centred": np.asarray(mean).tolist(),
        "mean_profile_err": np.asarray(err).tolist(),
        "de_sitter": fit,
        "acceptance": {n: float(acc[i] / max(att[i], 1)) for i, n in enumerate(cdt.MOVE_NAMES_3D)},
        "accepted_moves": {n: int(acc[i]) for i, n in enumerate(cdt.MOVE_NAMES_3D)},
        "figures": figures,
    }
    path = write_json(os.path.join(out, "summary.json"), summary)
    s_text = f"s = {fit['s']:.3f} +- {fit['s_err']:.3f}" if fit and "s" in fit else "no de Sitter fit"
    print(
        f"CDT 2+1D: <N22>/<N31> = {ratio:.4f} +- {ratio_err:.4f}, <N3> = {n3_mean:.1f}, {int(at.sum())}/{at.size} "
        f"measurements at the target, {s_text}"
    )
    summary["summary_path"] = path
    return summary


def _plot_thermalisation_3d(cfg: CDTConfig, out: str, therm: dict) -> str:
    """``thermalisation.png`` (2+1D): N(3,1) and N22/N31 of every chain per sweep of the grow-and-thermalise phase."""
    plt = _pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    n31, n22 = np.asarray(therm["n31"], np.float64), np.asarray(therm["n22"], np.float64)
    sw = np.arange(1, n31.shape[0] + 1)
    ax[0].plot(sw, n31 / 2 if cfg.fix == "n31" else n31 + n22, lw=0.7)
    ax[0].axhline(cfg.target, color="k", ls="--", lw=0.8, label="target")
    ax[0].set_xlabel("sweep (grow and thermalise)")
    ax[0].set_ylabel("$N_{(3,1)}$" if cfg.fix == "n31" else "$N_3$")
    ax[0].legend(fontsize=7)
    ax[1].plot(sw, n22 / np.maximum(n31, 1), lw=0.7)
    ax[1].set_xlabel("sweep")
    ax[1].set_ylabel("$N_{22}/N_{31}$")
    fig.suptitle(f"2+1D CDT, k0 = {cfg.k0}, k3 = {cfg.k3}: thermalisation of {cfg.chains} chains")
    path = save_figure(fig, os.path.join(out, "thermalisation.png"))
    plt.close(fig)
    return path


def _plot_profile_3d(cfg: CDTConfig, out: str, mean, err, fit, last) -> str:
    """``volume_profiles.png`` (2+1D): the centred averaged slice areas with their errors, the de Sitter fit (on
    its stalk) where there is one, and the last profile of up to three chains."""
    from ivhl_jax.physics.cdt import d3_profile

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    t = np.arange(cfg.slices)
    ax.errorbar(t, mean, err, fmt="ko", ms=3, capsize=2, label="mean at the target (centred)")
    if fit and "s" in fit:
        tt = np.linspace(0, cfg.slices - 1, 400)
        total = float(np.sum(np.asarray(mean) - fit["stalk"]))
        shape = d3_profile.de_sitter_profile(tt, fit["s"], fit["volume"], total, fit["t0"])
        ax.plot(tt, fit["stalk"] + shape, "r-", lw=1, label=f"de Sitter, s = {fit['s']:.3f} +- {fit['s_err']:.3f}")
    for c in range(min(3, cfg.chains)):
        ax.plot(t, last[c], lw=0.7, label=f"chain {c}, last")
    ax.set_xlabel("time slice t")
    ax.set_ylabel("spatial triangles $V_2(t)$")
    ax.set_title(f"2+1D CDT, k0 = {cfg.k0}, T = {cfg.slices}, {cfg.fix.upper()} = {cfg.target}", fontsize=9)
    ax.legend(fontsize=7)
    path = save_figure(fig, os.path.join(out, "volume_profiles.png"))
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------
# drawing (matplotlib stays out of the physics package)


def slice_orders(state: cdt.CDTState) -> list[list[int]]:
    """For an unbatched state: per slice, its vertex ids in spatial order (starting anywhere)."""
    s = jax.device_get(state)
    alive = np.asarray(s.vpos) < int(s.n0)
    vright, vtime = np.asarray(s.vright), np.asarray(s.vtime)
    out: list[list[int]] = []
    for t in range(s.n_slices):
        vs = np.nonzero(alive & (vtime == t))[0]
        order = [int(vs[0])]
        for _ in range(int(s.lengths[t]) - 1):
            order.append(int(vright[order[-1]]))
        out.append(order)
    return out


def draw_triangulation(state: cdt.CDTState, ax=None, *, color="k", lw=0.6):
    """Draw an unbatched triangulation: slice t at height t, vertices spread evenly on [0, 1).

    Spatial links and timelike links that wrap around the circle are omitted. Returns the axes.
    """
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    s = jax.device_get(state)
    orders = slice_orders(state)
    xpos, ypos = {}, {}
    for t, order in enumerate(orders):
        for k, v in enumerate(order):
            xpos[v], ypos[v] = (k + 0.5) / len(order), t
    alive = np.asarray(live_triangles(s))
    tv = np.asarray(s.tv)
    T = len(orders)
    for tri in np.nonzero(alive)[0]:
        a, b, c = (int(x) for x in tv[tri])
        for p, q in ((a, b), (a, c), (b, c)):
            if abs(xpos[p] - xpos[q]) > 0.5 or abs(ypos[p] - ypos[q]) > 1:
                continue
            ax.plot([xpos[p], xpos[q]], [ypos[p], ypos[q]], color=color, lw=lw)
    ax.set_xlabel("spatial position (fraction of slice)")
    ax.set_ylabel("time slice t")
    ax.set_ylim(-0.5, T - 0.5)
    return ax


class CDTSimulation(Simulation):
    """``ivhl sim cdt``: grow, thermalise and measure chains; records stream to the run store."""

    prog = "ivhl sim cdt"
    config_type = CDTConfig
    extendable = ("steps",)
    streams = True

    def run(self, cfg: CDTConfig, ctx: RunContext) -> dict[str, str]:
        summary = simulate(cfg, ctx.out, checkpointer=ctx.checkpointer, progress=ctx.progress, sink=ctx.sink)
        names: tuple[str, ...] = ("thermalisation", "volume_profiles")
        if cfg.dims == 2:
            names += ("autocorrelation", "coordination", "curvature")
        return {"summary": summary["summary_path"], **dict(zip(names, summary["figures"]))}

    def default_out(self, cfg: CDTConfig, args: argparse.Namespace) -> str:
        return "runs/cdt" if cfg.dims == 2 else "runs/cdt3"

    def checkpoint_every(self, cfg: CDTConfig) -> int:
        return cfg.steps_per_chunk

    def keep(self, cfg: CDTConfig) -> int:
        return 2


SIMULATION = CDTSimulation()
main = entry_point(SIMULATION, __name__)  # the command line as a function; python -m runs it
