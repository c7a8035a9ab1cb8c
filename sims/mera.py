"""Variational scale-invariant MERA for a critical nearest-neighbour chain (Ising, XX, 3-state Potts, or a term
from a file), run as a ladder of growing bond dimensions.

The model comes from ``model`` ("ising": H = −Σ XX − g Σ Z, critical at g = 1 with e₀ = −4/π; "xx":
H = −¼ Σ (XX + YY), e₀ = −1/π; "potts": H = −Σ (σσ† + h.c.) − g Σ (τ + τ†), critical at g = 1; "custom": the real
Hermitian two-site term (d, d, d, d) in the NumPy file ``term_file``, with ``e0`` its exact energy per site if
known). The optimisation runs a ladder of stages (``chis``, with ``chi_mids`` and ``layers`` per stage, or the
bond dimension above every layer with ``layer_chis`` / ``layer_chi_mids``), each ``steps[k]`` steps (one step =
one Evenbly–Vidal sweep of :func:`ivhl_jax.physics.tensornet.mera.evenbly_vidal`, run by ``chunked(stepper)`` through
:func:`ivhl_jax.run.runner.run_chunked` with checkpoints in <out>/ckpt/stage<k> (k = 1, 2, …): an interrupted run
resumes where it stopped). Between stages the tensors are padded (:func:`ivhl_jax.physics.tensornet.mera.grow`), which
keeps the energy and avoids the poor local minima of a cold start at large χ. The cold first stage is checked for a
stuck start after ``stuck_after`` steps and every ``stuck_every`` steps up to step 1000 while its energy error stays
above 1e-3 (:class:`ivhl_jax.physics.tensornet.mera.StuckCheck`), and re-initialised with a new key (printed, and listed
under "restarts" in mera.json). Float64, unless ``precision`` asks for float32 early stages (the last stage is
float64). ``host_cores=n`` holds XLA to n CPU cores (0, the default: all of them; a symmetric MERA's many small
block products gain nothing from a second core, so give it one and the other cores other work).

``symmetry`` ("Z2" for Ising, "U1" for XX, "Z3" for Potts, run in its charge basis,
:func:`ivhl_jax.physics.tensornet.mera.symmetric.potts_charge_basis`) runs the block-sparse symmetric MERA: the first
stage's sectors split each χ in proportion to what each layer can carry, every later stage's are grown from the
reduced density matrices' spectra (:func:`ivhl_jax.physics.tensornet.mera.grow`); the records, store and outputs are the
dense run's, and the scaling dimensions carry their charges ("scaling_dimension_charges").

``term_file`` (``model="custom"``) is a NumPy file holding the real Hermitian two-site term
``term[a', b', a, b] = <a' b'| h |a b>`` of shape (d, d, d, d), written e.g. for the Heisenberg chain by::

    import numpy as np
    x, y, z = np.array([[0, 1], [1, 0]]), np.array([[0, -1], [1, 0]]), np.diag([1, -1])   # y = i·Y, real
    np.save("h.npy", (np.kron(x, x) - np.kron(y, y) + np.kron(z, z)).reshape(2, 2, 2, 2) / 4)

and ``e0`` its exact ground-state energy per site if known (−ln 2 + 1/4 here): an energy below ``e0`` is an error
naming ``e0`` (a variational energy cannot go below the exact one, so ``e0`` is wrong).

Progress: every phase reports (the cold start's checked steps, each stage's steps counted to its configured
total, the conformal data); Ctrl-C stops any phase (the stages at their last checkpoint, as every run).

Default ladder: the published schedule of Evenbly's tensors.net mainVarMERA, χ/χ_mid = 6/4 (1 transitional
layer, 2000 steps) → 8/6 (2 layers, 1800 steps); ``bench/studies/mera_reference.py`` runs the same ladder with a
NumPy port of the reference optimiser.

Outputs in <out>: convergence.png (energy error per sweep), scaling_dims.png (one-site spectrum, and the
two-site spectrum with each operator's conformal family marked), mera.json (energy error per sweep, timings per
stage, restarts, scaling dimensions vs the CFT, "conformal_data": the two-site scaling dimensions with their
reflection parity, CFT label, exact value and family; "ope_coefficients": C_σσε (Ising; and C_σσσ for Potts)
measured vs exact; "central_charge": c from the coarse-grained Hamiltonian on rings, with its method), config.json.

  ivhl sim mera                                   # default ladder χ = 6 → 8 (χ_mid 4 → 6), critical Ising
  ivhl sim mera --set chis=6,8,12 --set chi_mids=4,6,8 --set layers=1,2,3 --set steps=2000,1800,1400
  ivhl sim mera --set model=xx --set chis=4,6 --set chi_mids=4,6 --set steps=500,500 --set layers=1,2
  ivhl sim mera --set 'layer_chis=[[6,6],[12,16,16]]' --set chis=6,16 --set layers=1,2 --set steps=1000,200
  ivhl sim mera --config run.toml --no-resume
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.numerics.rollout import chunked
from ivhl_jax.physics.tensornet import mera as M
from ivhl_jax.physics.tensornet.mera import conformal, scaling
from ivhl_jax.physics.tensornet.mera import symmetric as MS
from ivhl_jax.run.config import option
from ivhl_jax.run.device import limit_host_cores
from ivhl_jax.run.driver import RunContext, Simulation
from ivhl_jax.run.io import load_array, save_figure, write_json
from ivhl_jax.run.runner import phase, run_chunked
from ivhl_jax.run.store import RunStore
from ivhl_jax.sims import entry_point
from ivhl_jax.sims._common import shared_key
from ivhl_jax.train.checkpoint import Checkpointer


@dataclasses.dataclass(frozen=True)
class MERASimConfig:
    """Run configuration (TOML/JSON keys; ``--set key=value``; lists as ``--set chis=4,6,8``). One step is one
    Evenbly–Vidal sweep."""

    model: str = option("ising", '"ising", "xx", "potts" or "custom" (the two-site term in term_file)')
    g: float = option(1.0, "transverse field of the Ising chain / f of the Potts chain (1: critical)")
    term_file: str = option("", 'model="custom": a .npy file holding the real Hermitian two-site term (d, d, d, d)')
    d: int = option(0, "the spin dimension the run expects (0: the model's; else it must match)")
    e0: float | None = option(
        None, 'model="custom": the exact energy per site, if known (errors are reported against it)'
    )
    chis: tuple[int, ...] = option((6, 8), "bond dimension χ of each ladder stage (non-decreasing)")
    steps: tuple[int, ...] = option((2000, 1800), "steps of each stage (one step = one Evenbly–Vidal sweep)")
    layers: tuple[int, ...] = option((1, 2), "transitional layers of each stage (non-decreasing)")
    chi_mid: int | None = option(None, "χ_mid of every stage when chi_mids is empty (None: χ_mid = χ)")
    chi_mids: tuple[int, ...] = option((4, 6), "per-stage χ_mid, u's output bond (empty: chi_mid for every stage)")
    layer_chis: tuple[tuple[int, ...], ...] = option(
        (), "per stage, χ above each layer (layers+1 entries, bottom first)"
    )
    layer_chi_mids: tuple[tuple[int, ...], ...] = option((), "per stage, χ_mid of each layer (layers+1 entries)")
    precision: tuple[str, ...] = option((), 'per-stage "f32" or "f64" (empty: all f64); f32 only before an f64 finish')
    stuck_after: int = option(300, "steps of the cold first stage before the stuck-start check (0: no check)")
    stuck_every: int = option(100, "steps between rechecks after stuck_after, up to step 1000 (0: one check)")
    max_restarts: int = option(3, "re-initialisations of a stuck cold start")
    power_iters: int = option(4, "descending-superoperator iterations per sweep for the top density matrix")
    u_delay: int = option(10, "steps before the disentanglers start to be updated")
    refsym: bool = option(True, "impose reflection symmetry (removes spurious minima; needs a symmetric term)")
    si_scales: int = option(1, "scales summed in the scale-invariant layer's environment (1 = mainVarMERA)")
    steps_per_chunk: int = shared_key("steps_per_chunk", 50)
    checkpoint_every: int = option(200, "steps between checkpoints (a multiple of steps_per_chunk)")
    seed: int = option(0, "seed of the initial isometries")
    host_cores: int = option(0, "CPU cores XLA may use (0: all of them)")
    symmetry: str = option(
        "", '"" (dense) or the symmetry of a block-sparse MERA: "Z2" (ising), "U1" (xx), "Z3" (potts)'
    )

    def build_model(self) -> M.Model:
        """The chain of ``model``; a ValueError names the key at fault."""
        if self.model not in ("ising", "xx", "potts", "custom"):
            raise ValueError(f"model must be one of 'ising', 'xx', 'potts', 'custom', got {self.model!r}")
        if self.model != "custom" and self.term_file:
            raise ValueError(f"term_file is only read for model='custom' (model={self.model!r})")
        try:
            if self.model == "ising":
                model = M.ising(self.g)
            elif self.model == "potts":
                model = MS.potts_charge_basis(self.g) if self.symmetry else M.potts(self.g)
            elif self.model == "xx":
                model = M.xx()
            else:
                if not self.term_file:
                    raise ValueError("term_file: model='custom' needs the two-site term as a .npy file")
                term = load_array(self.term_file, "term_file")  # one line naming term_file and the formats
                try:
                    model = M.two_site(term, name=f"custom({os.path.basename(self.term_file)})", e0=self.e0)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"term_file: {e}") from None
        except (TypeError, ValueError) as e:
            msg = str(e)
            raise ValueError(msg if msg.startswith("term_file") else f"g: {msg}") from None
        symmetry = self.symmetry_record()
        if symmetry is not None:
            try:
                MS.check_commutes(model, symmetry)
            except ValueError as e:
                raise ValueError(f"symmetry: {e}") from None
        if self.d and self.d != model.d:
            raise ValueError(
                f"d={self.d} does not match the model's spin dimension {model.d} ({model.name}); "
                f"pass --set d={model.d} or d=0"
            )
        return model

    def validate(self) -> None:
        for name in ("steps_per_chunk", "checkpoint_every"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive integer (>= 1), got {val!r}; e.g. --set {name}=50")
        if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 0:
            raise ValueError(f"d must be 0 (the model's) or the spin dimension, got {self.d!r}")
        if self.e0 is not None and not np.isfinite(self.e0):
            raise ValueError(f"e0 must be a finite number, got {self.e0!r}")
        model = self.build_model()
        if not (len(self.chis) == len(self.steps) == len(self.layers)) or not self.chis:
            raise ValueError(
                f"chis, steps and layers need the same (non-zero) length, got {self.chis}, {self.steps}, {self.layers}"
            )
        if list(self.chis) != sorted(self.chis):
            raise ValueError(f"chis must be non-decreasing (the ladder only grows), got {self.chis}")
        if list(self.layers) != sorted(self.layers):
            raise ValueError(f"layers must be non-decreasing, got {self.layers}")
        for k, n in enumerate(self.steps):
            if n < 1 or n % self.steps_per_chunk:
                raise ValueError(
                    f"steps[{k}]={n} must be a positive multiple of steps_per_chunk={self.steps_per_chunk}"
                )
        if self.checkpoint_every % self.steps_per_chunk:
            raise ValueError("checkpoint_every must be a multiple of steps_per_chunk")
        for name in ("chi_mids", "precision", "layer_chis", "layer_chi_mids"):
            val = getattr(self, name)
            if val and len(val) != len(self.chis):
                raise ValueError(
                    f"{name} needs one entry per stage ({len(self.chis)}), got {val!r}; e.g. "
                    f"--set {name}=[] for the default of every stage"
                )
        for k, p in enumerate(self.precision):
            try:
                M.precision_dtype(p)
            except (ValueError, TypeError) as e:
                raise ValueError(f"precision[{k}]={p!r}: {e}") from None
            if k == len(self.chis) - 1 and p != "f64":
                raise ValueError(f"precision[{k}]={p!r}: the last stage must be 'f64' (the float64 finish)")
        if self.stuck_after:
            if model.e0 is None:
                raise ValueError(
                    f"stuck_after: the stuck-start check measures the energy error, but {model.name} "
                    "has no exact energy; pass e0 or --set stuck_after=0"
                )
            try:
                self.stuck_check().validate()
            except (ValueError, TypeError) as e:
                raise ValueError(f"stuck_after / stuck_every / max_restarts: {e}") from None
            for name in ("stuck_after", "stuck_every"):
                if getattr(self, name) % self.steps_per_chunk:
                    raise ValueError(
                        f"{name}={getattr(self, name)} must be a multiple of steps_per_chunk="
                        f"{self.steps_per_chunk} (or 0 to turn the check off)"
                    )
        if isinstance(self.host_cores, bool) or not isinstance(self.host_cores, int) or self.host_cores < 0:
            raise ValueError(
                f"host_cores must be 0 (all cores) or a positive number of cores, got {self.host_cores!r}; "
                "e.g. --set host_cores=1"
            )
        shapes = []
        for k in range(len(self.chis)):
            sc = self.stage_config(k)
            try:
                shapes.append(sc.layer_shapes(model.d * model.d))
            except (ValueError, TypeError) as e:
                key = "layer_chis" if self.layer_chis else "chis"
                raise ValueError(f"{key}[{k}]: {e}") from None
            if sc.refsym and not model.reflection_symmetric:
                raise ValueError(
                    f"refsym: {model.name}'s two-site term is not reflection symmetric; --set refsym=false"
                )
        for k in range(1, len(shapes)):
            for z, (a, b) in enumerate(zip(shapes[k - 1], shapes[k])):
                if b[1] < a[1] or b[2] < a[2]:
                    raise ValueError(
                        f"{'layer_chis' if self.layer_chis else 'chis'}[{k}]: the ladder only grows, "
                        f"but layer {z} goes from (chi_mid, chi) = {a[1:]} to {b[1:]}"
                    )

    def symmetry_record(self) -> M.Symmetry | None:
        """The :class:`~ivhl_jax.physics.tensornet.mera.Symmetry` of ``symmetry`` (sectors chosen per stage), None if
        dense."""
        if not self.symmetry:
            return None
        try:
            return M.Symmetry(self.symmetry)
        except ValueError as e:
            raise ValueError(f"symmetry must be '', 'Z2', 'U1' or 'Z3': {e}") from None

    def stuck_check(self) -> M.StuckCheck:
        return M.StuckCheck(
            after=self.stuck_after,
            max_restarts=self.max_restarts,
            every=self.stuck_every,
            until=max(M.StuckCheck.until, self.stuck_after),
        )

    def stage_config(self, k: int) -> M.MERAConfig:
        """The :class:`MERAConfig` of stage ``k``."""
        chi: Any = self.layer_chis[k] if self.layer_chis else self.chis[k]
        if self.layer_chi_mids:
            mid: Any = self.layer_chi_mids[k]
        else:
            want = self.chi_mids[k] if self.chi_mids else self.chi_mid
            mid = None if want is None else min(want, self.chis[k])
        try:
            return M.MERAConfig(
                chi=chi,
                chi_mid=mid,
                layers=self.layers[k],
                power_iters=self.power_iters,
                u_delay=self.u_delay,
                refsym=self.refsym,
                si_scales=self.si_scales,
                symmetry=self.symmetry_record(),
            )
        except (ValueError, TypeError) as e:
            key = "layer_chis" if self.layer_chis else "chis"
            raise ValueError(f"{key}[{k}] / layers[{k}]: {e}") from None


def _stage_dtype(cfg: MERASimConfig, k: int) -> Any:
    return M.precision_dtype(cfg.precision[k] if cfg.precision else None)


def apply_host_cores(cfg: MERASimConfig) -> str:
    """Hold XLA to ``cfg.host_cores`` cores (0: all of them); what was done, in words. Only effective before JAX
    starts its backend (``ivhl sim mera`` applies it before anything else)."""
    return f"{limit_host_cores(cfg.host_cores)} (host_cores)" if cfg.host_cores else "all cores (host_cores=0)"


class _Reporter:
    """Progress lines of one phase counted to its configured total (about ten per phase), each with the energy
    (error); and the check that no energy falls below the claimed exact ``e0``."""

    def __init__(self, enabled: bool, label: str, total: int, e0: float | None, tol: float) -> None:
        self.enabled, self.label, self.total, self.e0, self.tol = enabled, label, total, e0, tol
        self.every = max(1, total // 10)
        self.t0 = time.perf_counter()
        self.last = 0

    def __call__(self, step: int, energies: Any) -> None:
        e = np.asarray(energies, np.float64).reshape(-1)
        check_e0(e, self.e0, self.tol)
        if self.enabled and e.size and (step - self.last >= self.every or step >= self.total):
            self.last = step
            what = f"energy error {e[-1] - self.e0:.3e}" if self.e0 is not None else f"energy {e[-1]:.10f}"
            print(
                f"{self.label}: step {step}/{self.total}, {what} ({time.perf_counter() - self.t0:.1f} s)",
                file=sys.stderr,
                flush=True,
            )


class WrongE0Error(ValueError):
    """An energy per site below the claimed exact ``e0`` (:func:`check_e0`)."""


def check_e0(energies: np.ndarray, e0: float | None, tol: float) -> None:
    """:class:`WrongE0Error` naming ``e0`` when an energy per site lies below it by more than ``tol``: a MERA's
    energy is variational (an upper bound of the ground-state energy), so the claimed exact energy is wrong."""
    if e0 is None or not energies.size:
        return
    low = float(np.min(energies))
    if low < e0 - tol:
        raise WrongE0Error(
            f"e0={e0!r} is not the exact energy per site: the MERA reached {low:.12f}, {e0 - low:.3e} below it, and "
            "a variational energy cannot go below the ground state's; pass the right e0 (or none)"
        )


def _advance_reporting(advance: Any, report: _Reporter, start: int, steps: int, progress: bool) -> Any:
    """``advance`` that announces its compilation (the first call) and reports after each chunk (counted from
    ``start``, the steps already done in the stage)."""
    done = [start]

    def run(state: Any) -> Any:
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(state)):
            return advance(state)  # run_chunked's eval_shape: no step
        with phase(f"compiling {report.label}", enabled=progress and done[0] == start):
            new, obs = advance(state)
        done[0] += steps
        report(done[0], obs)
        return new, obs

    return run


@contextlib.contextmanager
def _interruptible() -> Any:
    """Ctrl-C (SIGINT) during the conformal-data phase: remembered and raised as KeyboardInterrupt between its
    steps (:func:`interrupt_point`), so it is never swallowed inside a library callback; the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    flag = [False]
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda signum, frame: flag.__setitem__(0, True))
    _INTERRUPTED.append(flag)
    try:
        yield
    finally:
        _INTERRUPTED.pop()
        signal.signal(signal.SIGINT, previous)
    if flag[0]:
        raise KeyboardInterrupt


_INTERRUPTED: list[list[bool]] = []


def interrupt_point() -> None:
    """Raise the KeyboardInterrupt that arrived during :func:`_interruptible`, if one did."""
    if _INTERRUPTED and _INTERRUPTED[-1][0]:
        raise KeyboardInterrupt


def _conformal_data(mera: Any, model: M.Model, progress: bool) -> dict[str, Any]:
    """The conformal-data phase, each step announced (:func:`~ivhl_jax.run.runner.phase`) and interruptible."""
    out: dict[str, Any] = {}
    with _interruptible():
        with phase("conformal data: one-site scaling dimensions", enabled=progress):
            out["dims"], out["charges"] = M.scaling_dimensions(mera, num=10, charges=True)
        interrupt_point()
        with phase("conformal data: two-site scaling dimensions", enabled=progress):
            two, parity = scaling.two_site_scaling_dimensions(mera, num=12)
        if model.cft:
            out["table"] = [
                {**rec, "reflection_parity": int(p)} for rec, p in zip(scaling.identify(two, model.cft), parity)
            ]
        else:
            out["table"] = [{"delta": float(d), "reflection_parity": int(p)} for d, p in zip(two, parity)]
        interrupt_point()
        # OPE coefficients (tabulated CFTs) and the central charge (a velocity is known for the library's chains)
        out["ope"] = {}
        if model.cft and model.cft.ope:
            with phase("conformal data: OPE coefficients", enabled=progress):
                try:
                    out["ope"] = conformal.ope_coefficients(mera, model.cft)
                except ValueError as err:  # a MERA too rough for its operators to match: said, not guessed
                    out["ope"] = {"error": str(err)}
            interrupt_point()
        out["central"] = None
        if model.cft:
            with phase("conformal data: central charge", enabled=progress):
                out["central"] = conformal.central_charge(mera, model)
    return out


def stage_group(k: int) -> str:
    """The store group (and checkpoint folder) of stage ``k`` (from 0): ``stage1``, ``stage2``, … as the log counts."""
    return f"stage{k + 1}"


def simulate(
    cfg: MERASimConfig,
    out: str,
    *,
    resume: bool = True,
    progress: bool = True,
    sink: RunStore | None = None,
    host_cores: str | None = None,
) -> dict:
    """Run the ladder; returns the summary dict written to mera.json. ``host_cores``: what
    :func:`apply_host_cores` reported when the caller applied it before JAX started (as ``ivhl sim mera`` does);
    None applies it here, which takes effect only if no JAX computation ran yet (else it is reported as not
    applied). With ``sink`` each stage's energies go to its group ``stage1``, ``stage2``, … (listed in the root
    attribute ``groups``; ``open_run(out, group="stage1")``)."""
    if host_cores is None:
        host_cores = apply_host_cores(cfg)
    if progress:
        print(f"host cores: {host_cores}")
    model = cfg.build_model()
    e0 = model.e0
    stages = []
    energies: list[np.ndarray] = []
    restarts: list[dict] = []
    n_stages = len(cfg.chis)
    if sink is not None:
        sink.announce([stage_group(k) for k in range(n_stages)])  # open_run(out).groups opens them
    with jax.enable_x64(True):
        key = jax.random.key(cfg.seed)
        mera: M.MERA | None = None
        for k, (chi, layers, n) in enumerate(zip(cfg.chis, cfg.layers, cfg.steps)):
            sc = cfg.stage_config(k)
            dtype = _stage_dtype(cfg, k)
            # rounding of the energy per site in the stage's dtype: below e0 by more is not rounding
            tol = 1e-9 if dtype == np.float64 else 1e-5
            label = f"MERA chi={chi} (stage {k + 1}/{n_stages})"
            stepper = M.evenbly_vidal(model, sc, policy=cfg.precision[k] if cfg.precision else None)
            t0 = time.perf_counter()
            first = np.zeros((0,))
            if mera is None:
                if cfg.stuck_after and n >= cfg.stuck_after and e0 is not None:
                    # Cold start: the first checked steps run here, re-initialised while stuck; deterministic, so a
                    # resumed run repeats them (seconds) to recover their energies and the restart record.
                    report = _Reporter(progress, f"{label}, cold start (checked)", n, e0, tol)
                    state, first, restarts = M.cold_start(
                        stepper, key, e0, cfg.steps_per_chunk, cfg.stuck_check(), log=print, limit=n, progress=report
                    )
                    restarts = [{"stage": k + 1, **r} for r in restarts]
                else:
                    state = stepper.init(key)
            else:
                grown = M.grow(
                    M.cast(mera, np.float64),
                    jax.random.fold_in(key, k),
                    sc.chi,
                    sc.chi_mid,
                    layers=layers,
                    refsym=sc.refsym,
                    model=model,
                )
                state = stepper.init(key, mera=grown)
            rest = n - first.shape[0]
            stage_sink = (
                None
                if sink is None
                else sink.child(stage_group(k)).describe(
                    time_unit="1",  # a sweep count is a number (UDUNITS has no sweep); the long_name says so
                    units={"energy": "1"},  # in units of the model's coupling J
                    rename={"value": "energy"},
                    long_names={"time": "sweeps done", "energy": "energy per site in units of the coupling J"},
                )
            )
            with Checkpointer(os.path.join(out, "ckpt", stage_group(k)), save_every=cfg.checkpoint_every) as ck:
                done = first.shape[0] + (ck.latest_step() or 0)
                advance = _advance_reporting(
                    chunked(stepper, cfg.steps_per_chunk, save_every=1, observe=M.observe),
                    _Reporter(progress, label, n, e0, tol),
                    done,
                    cfg.steps_per_chunk,
                    progress,
                )
                result = run_chunked(
                    advance,
                    state,
                    n_chunks=rest // cfg.steps_per_chunk,
                    steps_per_chunk=cfg.steps_per_chunk,
                    checkpointer=ck,
                    progress=False,  # _Reporter counts the stage's steps, the cold start's included
                    description=label,
                    metadata={"chi": chi, "layers": layers, "after_cold_start": first.shape[0]},
                    sink=stage_sink,
                )
            mera = result.state.mera
            history = result.history if stage_sink is None else stage_sink.read(like=jax.eval_shape(advance, state)[1])
            if stage_sink is not None:
                stage_sink.close()
            e = np.concatenate([first, np.asarray(history, np.float64)])
            check_e0(e, e0, tol)
            energies.append(e - e0 if e0 is not None else e)
            stages.append(
                {
                    "chi": chi,
                    "chi_mid": sc.mid,
                    "layers": layers,
                    "steps": n,
                    "layer_chis": list(mera.chis),
                    "layer_chi_mids": list(mera.chi_mids),
                    "precision": jnp.dtype(dtype).name,
                    "wall_time_s": time.perf_counter() - t0,
                    "resumed_from": result.resumed_from,
                    "final_energy": float(e[-1]),
                    "final_energy_error": None if e0 is None else float(e[-1] - e0),
                    "isometry_error": M.isometry_errors(mera),
                }
            )
            what = f"energy error {e[-1] - e0:.3e}" if e0 is not None else f"energy {e[-1]:.10f}"
            print(
                f"stage {k + 1}: chi={chi} chi_mid={sc.mid} layers={layers} steps={n} "
                f"({jnp.dtype(dtype).name}): {what} ({stages[-1]['wall_time_s']:.1f} s)"
            )
        assert mera is not None
        mera = M.cast(mera, np.float64)
        data = _conformal_data(mera, model, progress)
    dims = data["dims"]
    # the CFT's low-lying scaling dimensions, from the model's CFT record
    exact = sorted(op.delta for op in model.cft.operators) if model.cft else []
    summary = {
        "model": model.name,
        "spin_dimension": model.d,
        "symmetry": cfg.symmetry or None,
        "e0_exact": e0,
        "final_energy": stages[-1]["final_energy"],
        "final_energy_error": stages[-1]["final_energy_error"],
        "energy_error_per_sweep" if e0 is not None else "energy_per_sweep": np.concatenate(energies),
        "stages": stages,
        "restarts": restarts,
        "scaling_dimensions": dims,
        "scaling_dimension_charges": data["charges"],
        "scaling_dimensions_exact": exact[: len(dims)],
        "conformal_data": data["table"],
        "ope_coefficients": data["ope"],
        "central_charge": data["central"],
        "host_cores": host_cores,
    }
    if cfg.model == "ising" and model.cft:
        sigma, epsilon = model.cft.primary("σ")[0], model.cft.primary("ε")[0]
        summary["delta_sigma_rel_error"] = abs(dims[1] - sigma) / sigma
        summary["delta_epsilon_rel_error"] = abs(dims[2] - epsilon)
    return summary


def write_outputs(summary: dict, out: str) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {}
    have_e0 = "energy_error_per_sweep" in summary
    err = np.asarray(summary["energy_error_per_sweep" if have_e0 else "energy_per_sweep"])
    fig, ax = plt.subplots(figsize=(6, 4))
    (ax.semilogy if have_e0 else ax.plot)(np.arange(1, len(err) + 1), np.abs(err) if have_e0 else err)
    edges = np.cumsum([s["steps"] for s in summary["stages"]])[:-1]
    for x in edges:
        ax.axvline(x, color="0.7", ls="--", lw=0.8)
    ax.set_xlabel("step (sweep)")
    ax.set_ylabel("energy error per site  |E − e₀|" if have_e0 else "energy per site")
    ax.set_title(f"MERA, {summary['model']} (χ: " + " → ".join(str(s["chi"]) for s in summary["stages"]) + ")")
    if summary.get("restarts"):
        # the curve is the kept start's; say that stuck starts were thrown away before it
        ax.text(
            0.98,
            0.95,
            f"{len(summary['restarts'])} stuck start(s) re-initialised",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            color="0.3",
        )
    paths["convergence.png"] = save_figure(fig, os.path.join(out, "convergence.png"))
    plt.close(fig)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    d = summary["scaling_dimensions"]
    if summary["scaling_dimensions_exact"]:
        ax.plot(range(len(summary["scaling_dimensions_exact"])), summary["scaling_dimensions_exact"], "b-", label="CFT")
    ax.plot(range(len(d)), d, "rx", label="MERA")
    ax.set_xlabel("k")
    ax.set_ylabel("Δ_k")
    ax.set_title("one-site scaling superoperator")
    ax.legend()
    # two-site spectrum, each operator coloured by the primary whose family it belongs to (○ primary, × descendant)
    table = summary.get("conformal_data", [])
    families = sorted({str(r.get("primary")) for r in table})
    colours = {f: f"C{i}" for i, f in enumerate(families)}
    for k, r in enumerate(table):
        fam = str(r.get("primary"))
        ax2.plot(
            k,
            r["delta"],
            "x" if r.get("descendant") else "o",
            color=colours[fam],
            label=fam if fam != "None" else "unassigned",
        )
        if r.get("exact") is not None:
            ax2.plot([k - 0.3, k + 0.3], [r["exact"], r["exact"]], "-", color=colours[fam], lw=0.8)
    handles, labels = ax2.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    if uniq:
        ax2.legend(uniq.values(), uniq.keys(), title="family", fontsize=8)
    ax2.set_xlabel("k")
    ax2.set_ylabel("Δ_k (lines: CFT)")
    facts = [
        f"{k} = {v['measured']:.4f} ({v['exact']:g})"
        for k, v in summary.get("ope_coefficients", {}).items()
        if isinstance(v, dict)
    ]
    if summary.get("central_charge"):
        cc = summary["central_charge"]
        facts.append(f"c = {cc['c']:.4f} ({cc['exact']:g})")
    ax2.set_title("two-site scaling superoperator" + ("\n" + ", ".join(facts) if facts else ""), fontsize=9)
    paths["scaling_dims.png"] = save_figure(fig, os.path.join(out, "scaling_dims.png"))
    plt.close(fig)
    paths["mera.json"] = write_json(os.path.join(out, "mera.json"), summary)
    return paths


class MERASimulation(Simulation):
    """``ivhl sim mera``: the bond-dimension ladder. The tensors' shapes change with χ from stage to stage, so
    each stage keeps its own checkpointer (<out>/ckpt/stage<k>, k from 1); the driver still owns the run folder, its
    lock and the config check."""

    prog = "ivhl sim mera"
    config_type = MERASimConfig
    extendable = ("host_cores",)
    own_checkpoints = True
    streams = True

    def prepare_process(self, cfg: MERASimConfig) -> None:
        self._host_cores = apply_host_cores(cfg)  # before the run folder's settings.json starts JAX's backend

    def run(self, cfg: MERASimConfig, ctx: RunContext) -> dict[str, str]:
        try:
            summary = simulate(
                cfg,
                ctx.out,
                resume=ctx.resuming,
                progress=ctx.progress,
                sink=ctx.sink,
                host_cores=getattr(self, "_host_cores", None),
            )
        except WrongE0Error as e:  # a wrong setting found by the run itself: one line and exit 2, as at setup
            print(f"{self.prog}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        paths = write_outputs(summary, ctx.out)
        what = (
            f"final energy error per site: {summary['final_energy_error']:.3e}"
            if summary["final_energy_error"] is not None
            else f"final energy per site: {summary['final_energy']:.10f}"
        )
        print(
            f"{what}; scaling dims {np.round(summary['scaling_dimensions'][:4], 4).tolist()}"
            + (
                f" (exact {[round(x, 4) for x in summary['scaling_dimensions_exact'][:4]]})"
                if summary["scaling_dimensions_exact"]
                else ""
            )
        )
        return paths

    def default_out(self, cfg: MERASimConfig, args: argparse.Namespace) -> str:
        return "runs/mera"


SIMULATION = MERASimulation()
main = entry_point(SIMULATION, __name__)  # the command line as a function; python -m runs it
