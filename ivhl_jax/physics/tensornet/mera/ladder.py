"""Bond-dimension ladders: :func:`grow` (enlarge χ per layer, insert layers), the stuck-start check of a cold
start (:class:`StuckCheck`, :func:`cold_start`, :func:`stuck_warning`)."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_key, check_scalar
from ivhl_jax.numerics.rollout import Stepper, chunked
from ivhl_jax.physics.tensornet.mera import symmetric as MS
from ivhl_jax.physics.tensornet.mera.config import MERA, check_mera, layer_shapes, polar_factor
from ivhl_jax.physics.tensornet.mera.models import Model
from ivhl_jax.physics.tensornet.mera.scaling import scaling_dimensions
from ivhl_jax.physics.tensornet.mera.superoperators import mirror_wv, reflect_u
from ivhl_jax.physics.tensornet.mera.sweep import MERAState, observe

_LOG = logging.getLogger("ivhl_jax.physics.tensornet.mera")


# ------------------------------------------------------------------------------------------- bond growth


def _complete_isometry(key: jax.Array, mat: jax.Array, cols: int) -> jax.Array:
    """Extend an isometry's columns (rows × k, already padded to the new row count) to ``cols`` columns."""
    rows, k = mat.shape
    if cols == k:
        return mat
    extra = jax.random.normal(key, (rows, cols - k), mat.dtype)
    extra = extra - mat @ (mat.T @ extra)
    q, r = jnp.linalg.qr(extra)
    return jnp.concatenate([mat, q * jnp.sign(jnp.diagonal(r))[None, :]], axis=1)


def grow(
    mera: MERA,
    key: jax.Array,
    chi: int | tuple[int, ...],
    chi_mid: int | tuple[int, ...] | None = None,
    mix: float = 1e-3,
    layers: int | None = None,
    refsym: bool = False,
    model: Model | None = None,
) -> MERA:
    """Enlarge the bond dimensions (``chi``/``chi_mid`` as in :class:`MERAConfig`: an int, capped per layer at what
    it can carry, or one per layer) keeping the old tensors as a block: the energy is unchanged up to the small
    ``mix`` of the identity added to the top density matrix so that the new directions get weight.
    ``layers`` > current transitional layers inserts copies of the SI layer below it (as mainVarMERA).
    ``refsym``: keep reflection symmetry (v = mirror(w); u's new columns symmetrised, u ← polar(½(u + R u)), which
    leaves a symmetric old block unchanged), so the first sweep's one-mirror-diagram contractions are exact.

    A symmetric MERA grows block by block, each bond's new states given to the charges by the reduced density
    matrices' spectra (:func:`~ivhl_jax.physics.tensornet.mera.symmetric.grow_spectral`; ``model``: the chain, whose
    charge conjugation, if it has one, keeps ±q sectors equal); its stepper continues with ``init(mera=...)``."""
    check_mera(mera)
    if MS.is_symmetric(mera):
        return MS.grow_spectral(mera, key, chi, chi_mid, mix, layers, refsym, model)
    old_chi, old_mid = mera.chi, max(mera.chi_mids)
    if not isinstance(chi, (tuple, list)):
        check_scalar(chi, "chi", integer=True)
        if int(chi) < old_chi:
            raise ValueError(
                f"chi={chi} is smaller than the MERA's current bond dimension {old_chi}: grow can only "
                f"enlarge it; pass chi >= {old_chi} (or start a new MERA with init_tensors)"
            )
        chi = int(chi)
    if chi_mid is not None and not isinstance(chi_mid, (tuple, list)):
        check_scalar(chi_mid, "chi_mid", integer=True, maximum=max(chi) if isinstance(chi, (tuple, list)) else chi)
        if chi_mid < old_mid:
            raise ValueError(
                f"chi_mid={chi_mid} is smaller than the MERA's current disentangler bond {old_mid}: "
                f"grow can only enlarge it; pass chi_mid >= {old_mid} or None"
            )
        chi_mid = int(chi_mid)
    check_scalar(mix, "mix", minimum=0.0, maximum=1.0)
    n_layers = mera.num_layers - 1
    if layers is not None:
        check_scalar(layers, "layers", integer=True, minimum=1)
        n_layers = max(n_layers, int(layers))
    shapes = layer_shapes(
        tuple(chi) if isinstance(chi, list) else chi,
        tuple(chi_mid) if isinstance(chi_mid, list) else chi_mid,
        n_layers,
        mera.d,
    )
    old = [tuple(int(s) for s in (w.shape[0], u.shape[-1], w.shape[-1])) for u, w in zip(mera.u, mera.w)]
    old = old[:-1] + [old[-1]] * (n_layers + 1 - len(old) + 1)  # the inserted copies of the SI layer
    for z, (new, was) in enumerate(zip(shapes, old)):
        if new[1] < was[1] or new[2] < was[2]:
            raise ValueError(
                f"grow can only enlarge the bonds: layer {z} would go from (chi_mid, chi) = "
                f"{was[1:]} to {new[1:]}; pass chi/chi_mid >= the MERA's {mera.chi_mids} / {mera.chis}"
            )
    return _grow_tensors(mera, key, tuple(shapes), float(mix), n_layers, bool(refsym))


# One compiled program per (shapes, layers, refsym): eagerly, the ~150 small ops of a χ step would each be
# compiled on first use, which takes longer than compiling the stage's sweep.
@functools.partial(jax.jit, static_argnums=(2, 4, 5))
def _grow_tensors(
    mera: MERA, key: jax.Array, shapes: tuple[tuple[int, int, int], ...], mix: float, layers: int, refsym: bool
) -> MERA:
    if layers + 1 > mera.num_layers:
        extra = layers + 1 - mera.num_layers
        mera = mera.replace(
            u=mera.u[:-1] + (mera.u[-1],) * (extra + 1),
            w=mera.w[:-1] + (mera.w[-1],) * (extra + 1),
            v=mera.v[:-1] + (mera.v[-1],) * (extra + 1),
        )
    dtype = mera.w[0].dtype
    us, ws, vs = [], [], []
    keys = jax.random.split(key, 3 * mera.num_layers)
    for z in range(mera.num_layers):
        u, w, v = mera.layer(z)
        chi_in, m, chi_out = shapes[z]
        # u: old block kept on the old (padded) legs; new mid columns completed to an exact isometry.
        mat = jnp.zeros((chi_in, chi_in, m, m), dtype).at[: u.shape[0], : u.shape[1], : u.shape[2], : u.shape[3]].set(u)
        mat = mat.reshape(chi_in * chi_in, m * m)
        old_idx = ((np.arange(m)[:, None] < u.shape[2]) & (np.arange(m)[None, :] < u.shape[3])).reshape(-1)
        old_cols, new_cols = np.flatnonzero(old_idx), np.flatnonzero(~old_idx)
        done = _complete_isometry(keys[3 * z], mat[:, old_cols], m * m)
        mat = mat.at[:, old_cols].set(done[:, : len(old_cols)]).at[:, new_cols].set(done[:, len(old_cols) :])
        up = mat.reshape(chi_in, chi_in, m, m)
        if refsym:
            up = polar_factor((0.5 * (up + reflect_u(up))).reshape(chi_in * chi_in, m * m)).reshape(up.shape)
        wp = jnp.zeros((chi_in, m, w.shape[2]), dtype).at[: w.shape[0], : w.shape[1]].set(w).reshape(-1, w.shape[2])
        vp = jnp.zeros((m, chi_in, v.shape[2]), dtype).at[: v.shape[0], : v.shape[1]].set(v).reshape(-1, v.shape[2])
        ws.append(_complete_isometry(keys[3 * z + 1], wp, chi_out).reshape(chi_in, m, chi_out))
        if refsym:
            vs.append(mirror_wv(ws[-1]))
        else:
            vs.append(_complete_isometry(keys[3 * z + 2], vp, chi_out).reshape(m, chi_in, chi_out))
        us.append(up)
    top = shapes[-1][2]

    def pad_rho(r: jax.Array) -> jax.Array:
        o = r.shape[0]
        big = jnp.zeros((top,) * 4, dtype).at[:o, :o, :o, :o].set(r)
        eye = jnp.eye(top * top, dtype=dtype).reshape((top,) * 4) / top**2
        return (1.0 - mix) * big + mix * eye

    return MERA(tuple(us), tuple(ws), tuple(vs), pad_rho(mera.rho_ab), pad_rho(mera.rho_ba), mera.sweeps)


# ------------------------------------------------------------------------------------------- stuck starts


#: Short starts per cold-start attempt of a symmetric MERA (:class:`StuckCheck`): from key 0 the
#: first draw of a U(1) XX MERA at χ/χ_mid 6/4 stalls at an energy error of 7.8e-3 where other draws reach 1.7e-3
#: (bench/results/mera_symmetric_starts_xx.json). The trials run the attempt's one compiled chunk, so they cost sweeps
#: only, no compilation.
SYMMETRIC_TRIALS = 4


@dataclasses.dataclass(frozen=True)
class StuckCheck:
    """When a cold start counts as stuck (an energy plateau far from the bound), and how often to re-initialise.

    With ε(n) = E(n) − e₀ the energy error per site after n steps (one step = one sweep) and the progress
    p(n) = (ε(n − window) − ε(n)) / ε(n − window), a cold start is stuck at step n

    * n = ``after`` (the first check): if ε(n) > ``min_error`` and p(n) < ``min_progress``;
    * n = after + ``every``, after + 2·every, … ≤ ``until`` (the rechecks; ``every=0`` turns them off): if
      ε(n) > ``recheck_error`` and p(n) < ``min_progress``. Rechecks stop once ε ≤ ``recheck_error``.

    Then the MERA is re-initialised with the key ``fold_in(key, attempt)``, at most ``max_restarts`` times (if every
    attempt is stuck, the one with the lowest ε at its last check is kept).

    Each attempt starts as the best of ``trials`` short starts (the draws of
    ``jax.random.split(attempt key, trials)``, each run ``trial_steps`` steps, the lowest energy continuing);
    ``trials=None``: :data:`SYMMETRIC_TRIALS` for a symmetric MERA's stepper (``config.symmetry``), whose cold starts
    stall more often, and 1 (the plain draw ``init(attempt key)``) for a dense one.

    The defaults separate healthy from stalled cold starts of the critical Ising chain at χ = 4–8 (one to three
    transitional layers): healthy starts fall by ≥ 29 % per 100 sweeps between sweeps 200 and 300 and are below
    1e-3 from sweep 300 on, stalled ones change by less than ±25 % and sit at 2e-3–9e-3 (the recheck catches a
    start that passes the first check while still falling from higher up and then idles). ``recheck_error`` is
    higher than ``min_error`` because healthy χ = 4 / one-layer starts level off near 3e-4. Known miss: cold
    starts at χ = 8 are all poor and may pass; start small and grow (the ladder of ``ivhl sim mera``).
    """

    after: int = 300
    window: int = 100
    min_error: float = 2e-4
    min_progress: float = 0.2
    max_restarts: int = 3
    every: int = 100
    until: int = 1000
    recheck_error: float = 1e-3
    trials: int | None = None
    trial_steps: int = 100

    def validate(self) -> StuckCheck:
        check_scalar(self.after, "after", integer=True, minimum=2)
        check_scalar(self.window, "window", integer=True, minimum=1, maximum=self.after - 1)
        check_scalar(self.min_error, "min_error", nonnegative=True)
        check_scalar(self.min_progress, "min_progress")
        check_scalar(self.max_restarts, "max_restarts", integer=True, nonnegative=True)
        check_scalar(self.every, "every", integer=True, nonnegative=True)
        check_scalar(self.until, "until", integer=True, minimum=self.after)
        check_scalar(self.recheck_error, "recheck_error", nonnegative=True)
        if self.trials is not None:
            check_scalar(self.trials, "trials", integer=True, minimum=1)
        check_scalar(self.trial_steps, "trial_steps", integer=True, minimum=1)
        return self

    def trials_for(self, stepper: Stepper) -> int:
        """The short starts per attempt for ``stepper``: ``trials``, or (None) :data:`SYMMETRIC_TRIALS` for a
        symmetric MERA's stepper and 1 for a dense one."""
        if self.trials is not None:
            return int(self.trials)
        return SYMMETRIC_TRIALS if getattr(stepper.params, "legs", None) is not None else 1

    def checks(self, limit: int | None = None) -> list[int]:
        """The steps at which a start is checked (``after``, then every ``every`` up to ``until`` and ``limit``)."""
        end = self.until if limit is None else min(self.until, int(limit))
        if end < self.after:
            return []
        if not self.every:
            return [self.after]
        return list(range(self.after, end + 1, self.every))

    def reason(self, errors: np.ndarray, at: int | None = None) -> str | None:
        """Why the start whose energy errors per step are ``errors`` is stuck at step ``at`` (default ``after``, the
        first check; a later ``at`` applies the recheck threshold). None: it is not, or it has fewer than ``at``
        steps."""
        err = np.asarray(errors, dtype=np.float64)
        at = self.after if at is None else int(at)
        if err.shape[0] < at or at <= self.window:
            return None
        now, before = float(err[at - 1]), float(err[at - 1 - self.window])
        progress = (before - now) / before if before > 0 else 0.0
        bound = self.min_error if at == self.after else self.recheck_error
        if now <= bound or progress >= self.min_progress:
            return None
        moved = f"fell by only {100 * progress:.0f} %" if progress >= 0 else f"rose by {-100 * progress:.0f} %"
        return (
            f"energy error {now:.2e} > {bound:.1e} after {at} steps and it {moved} "
            f"(needs to fall by {100 * self.min_progress:.0f} %) over the last {self.window}"
        )


def _trial_start(
    advance: Callable[[MERAState], tuple[MERAState, Any]],
    stepper: Stepper,
    key: jax.Array,
    trials: int,
    chunks: int,
) -> tuple[MERAState, np.ndarray, int]:
    """The best of ``trials`` short cold starts: ``stepper.init(k)`` for each k of ``jax.random.split(key, trials)``
    (``trials=1``: ``init(key)`` itself), each advanced ``chunks`` times by ``advance`` (a
    ``chunked(stepper, n, save_every=1, observe=observe)``); kept: the lowest energy after the last chunk (the
    first on a tie; a non-finite energy counts as +∞), deterministic given ``key``. Returns (its state, its
    energies per step, its index)."""
    check_key(key)
    check_scalar(trials, "trials", integer=True, minimum=1)
    check_scalar(chunks, "chunks", integer=True, nonnegative=True)
    keys = [key] if trials == 1 else list(jax.random.split(key, int(trials)))
    best: tuple[float, MERAState, np.ndarray, int] | None = None
    for i, k in enumerate(keys):
        state, parts = stepper.init(k), [np.zeros((0,))]
        for _ in range(int(chunks)):
            state, e = advance(state)
            parts.append(np.asarray(e, np.float64))
        e = np.concatenate(parts)
        last = float(e[-1]) if e.shape[0] else 0.0
        last = last if np.isfinite(last) else np.inf  # a trial that blew up is never kept over a finite one
        if best is None or last < best[0]:
            best = (last, state, e, i)
    assert best is not None
    return best[1], best[2], best[3]


def _run_to_checks(
    advance: Callable[[MERAState], tuple[MERAState, Any]],
    state: MERAState,
    first: np.ndarray,
    e0: float,
    points: list[int],
    check: StuckCheck,
    steps_per_chunk: int,
    progress: Callable[[int, np.ndarray], None] | None,
) -> tuple[MERAState, np.ndarray, np.ndarray, int, str | None]:
    """One attempt of :func:`cold_start` from ``state`` (the energies per step of its trial steps ``first``) run in
    chunks up to each of the check ``points``, stopping at the first check that finds it stuck or once the error is
    below ``check.recheck_error``. Returns (state, energies per step, their errors against ``e0``, steps done, the
    stuck reason or None)."""
    parts: list[np.ndarray] = [first]
    done, reason = first.shape[0], None
    if progress is not None and done:
        progress(done, first)
    err = np.concatenate(parts) - e0
    for at in points:
        while done < at:
            state, e = advance(state)
            parts.append(np.asarray(e))
            done += int(steps_per_chunk)
            if progress is not None:
                progress(done, parts[-1])
        err = np.concatenate(parts) - e0
        reason = check.reason(err, done)
        if reason is not None or float(err[-1]) <= check.recheck_error:
            break
    return state, np.concatenate(parts), err, done, reason


def cold_start(
    stepper: Stepper,
    key: jax.Array,
    e0: float,
    steps_per_chunk: int,
    check: StuckCheck | None = None,
    log: Callable[[str], None] | None = None,
    limit: int | None = None,
    progress: Callable[[int, np.ndarray], None] | None = None,
) -> tuple[MERAState, np.ndarray, list[dict[str, Any]]]:
    """A checked cold start of an :func:`evenbly_vidal` stepper: ``stepper.init(key)`` run through
    ``chunked(stepper, steps_per_chunk)`` up to each check of ``check`` (:meth:`StuckCheck.checks`), re-initialised
    with the key ``fold_in(key, attempt)`` whenever a check finds it stuck. Each attempt begins as the best of
    ``check``'s short trial starts from its key (:class:`StuckCheck`: by default four for a symmetric MERA, one, the
    plain draw, for a dense one); the trials' steps, in whole chunks (at least one, at most up to the first check),
    count as the attempt's first steps.

    ``e0``: the exact energy per site the errors are measured against; ``limit``: the most steps an attempt may run
    (the caller's total; default ``check.until``). Returns (the kept attempt's state after its last check, its
    energies per step, one record per re-initialisation); the kept attempt has run ``check.after`` steps or more.
    Each re-initialisation is logged (``log``, default a warning on the ``ivhl_jax.physics.tensornet.mera`` logger);
    ``progress(step, energies)`` is called after every chunk of an attempt (its steps so far, that chunk's
    energies per step; once for the kept trial's steps) and may raise to stop the start.
    """
    check = (check or StuckCheck()).validate()
    check_scalar(steps_per_chunk, "steps_per_chunk", integer=True, minimum=1)
    log = log or _LOG.warning
    points = check.checks(limit)
    if not points:
        raise ValueError(f"cold_start: limit={limit} is below the first check at step {check.after}")
    advance = chunked(stepper, int(steps_per_chunk), save_every=1, observe=observe)
    restarts: list[dict[str, Any]] = []
    best: tuple[float, MERAState, np.ndarray] | None = None
    chi = stepper.params.config.top_chi
    trials = check.trials_for(stepper)
    # the trials' steps in whole chunks, at least one and within the first check
    chunks = 0 if trials == 1 else max(1, min(-(-check.trial_steps // steps_per_chunk), points[0] // steps_per_chunk))
    for attempt in range(check.max_restarts + 1):
        state, e, _ = _trial_start(
            advance, stepper, key if attempt == 0 else jax.random.fold_in(key, attempt), trials, chunks
        )
        state, e, err, done, reason = _run_to_checks(advance, state, e, e0, points, check, steps_per_chunk, progress)
        if reason is None:
            return state, e, restarts
        now = float(err[done - 1])
        if best is None or now < best[0]:
            best = (now, state, e)
        before = float(err[done - 1 - check.window])
        restarts.append(
            {
                "attempt": attempt,
                "chi": chi,
                "steps": done,
                "energy_error": now,
                "progress": (before - now) / before,
                "delta_sigma": float(scaling_dimensions(state.mera, 2)[1]),
                "reason": reason,
            }
        )
        last = attempt == check.max_restarts
        log(
            f"MERA chi={chi}: stuck start (attempt {attempt}): {reason}; "
            + (
                "keeping the best attempt (every start stalled: grow it from a smaller chi, mera.grow)"
                if last
                else f"re-initialising with key fold_in(key, {attempt + 1})"
            )
        )
    assert best is not None
    return best[1], best[2], restarts


def stuck_warning(errors: np.ndarray, what: str, check: StuckCheck | None = None) -> str | None:
    """One line saying that the cold start whose energy errors per step are ``errors`` stalled by ``check``'s tests
    (default :class:`StuckCheck`: at ``after`` steps, then every ``every`` while the error stays above
    ``recheck_error``), naming the remedies; None when it did not (or ran fewer than ``check.after`` steps).

    A flat error far above e₀ is either a stalled start (another key goes lower) or the limit of this χ; the
    message says both."""
    check = (check or StuckCheck()).validate()
    err = np.asarray(errors, dtype=np.float64)
    for at in check.checks(err.shape[0]):
        reason = check.reason(err, at)
        if reason is not None:
            return (
                f"{what}: the start looks stuck: {reason} (a stalled start, or the limit of this chi): use "
                "mera.cold_start (re-initialises a stuck start) or grow from a smaller chi (mera.grow)"
            )
        if float(err[at - 1]) <= check.recheck_error:
            return None
    return None
