"""Dense against symmetric MERA on the same bond-dimension ladder (Z2 Ising, U(1) XX, Z3 Potts), the symmetric one
with its default sectors (grown from the spectra) and its default cold start.

Each run is the ladder of ``ivhl sim mera`` (the library calls it makes, float64, reflection symmetry on): the first
stage a checked cold start (:func:`~ivhl_jax.physics.tensornet.mera.cold_start`, key ``--key``), every later stage grown
from the one before (:func:`~ivhl_jax.physics.tensornet.mera.grow`, key ``fold_in(key, stage)``; a symmetric MERA's
sectors chosen from its spectra) and swept on. A stage is chi/chi_mid/layers/steps; the default is the sim's default
ladder, 6/4/1/2000 then 8/6/2/1800. Per run and stage: the energy error per site, the order parameter of one spin
and the six lowest scaling dimensions (no charges); at the end the order parameter of
one spin (⟨X⟩ for Ising and XX, Re⟨σ⟩ for Potts; zero in the exact ground state and in every symmetric MERA), the
scaling dimensions (with their charges for the symmetric MERA) and the central charge
(:func:`~ivhl_jax.physics.tensornet.mera.central_charge`, on the dense embedding). Also recorded: the symmetric first
stage's single draws (``init(key)`` and the four default trials of the first attempt); with ``--compare-trials 1`` the
symmetric ladder with single-draw attempts (the cold start before :class:`~ivhl_jax.physics.tensornet.mera.StuckCheck`
had ``trials``); with ``--dense-from-symmetric N`` N dense sweeps from the symmetric MERA's end, as it is and nudged
(:func:`dense_from_symmetric`). The JSON is rewritten after every run::

    python -m bench.studies.mera_symmetric_starts --models xx --compare-trials 1 --dense-from-symmetric 1000 \
        --out bench/results/mera_symmetric_starts_xx.json

The dense MERA on the three-layer U(1) XX ladder of ``bench.studies.mera_symmetric`` (same χ, χ_mid, layers and
sweeps per stage; its symmetric counterpart is ``bench/results/mera_symmetric_xx_chi16.json``)::

    python -m bench.studies.mera_symmetric_starts --models xx --kinds dense \
        --ladder 8/6/3/1000 12/9/3/1000 16/12/3/3000 --out bench/results/mera_dense_xx_chi16.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import jax
import numpy as np

GROUPS = {"ising": "Z2", "xx": "U1", "potts": "Z3"}


def _model(name: str, symmetric: bool) -> Any:
    from ivhl_jax import mera as M
    from ivhl_jax.physics.tensornet.mera import symmetric as MS

    if name == "potts":  # the symmetric MERA runs the chain in its charge basis (same spectrum and CFT)
        return MS.potts_charge_basis() if symmetric else M.potts()
    return {"ising": M.ising, "xx": M.xx}[name]()


def order_parameter(m: Any, model: Any) -> float:
    """The real part of one spin's order parameter in a dense MERA (the bottom two-site density matrix descended from
    the top, traced to one spin): ⟨X⟩ for Ising and XX (Z2-odd, U(1) charge ±1), Re⟨σ⟩ for Potts (σ = diag(1, ω,
    ω²) in the σ basis; the shift S|k⟩ = |k+1⟩ in the charge basis, whose Re is (S + Sᵀ)/2). Zero in the exact
    ground state and in every symmetric MERA."""
    from ivhl_jax import mera as M

    d = model.d
    if d == 2:
        op = np.array([[0.0, 1.0], [1.0, 0.0]])
    elif model.name.startswith("potts_z3"):
        shift = np.roll(np.eye(3), 1, axis=0)
        op = 0.5 * (shift + shift.T)
    else:
        op = np.diag(np.cos(2.0 * np.pi * np.arange(3) / 3.0))
    rhos = (m.rho_ab, m.rho_ba)
    for z in reversed(range(m.num_layers - 1)):
        rhos = M.descend(rhos, m.layer(z))
    one = np.einsum("abcb->ac", np.asarray(rhos[0]))
    spin = np.einsum("abcb->ac", one.reshape(d, d, d, d))
    return float(np.trace(spin @ op))


def steady_energy(m: Any, model: Any, iters: int = 3000) -> float:
    """The MERA's variational energy per site: its top density matrix iterated to the steady state of the
    scale-invariant layer's descending superoperator (``iters`` power iterations), then descended to the bottom.
    The energy a sweep records uses the top density matrix after its few power iterations, which lags the tensors
    and is not variational while they change."""
    from ivhl_jax import mera as M
    from ivhl_jax.physics.tensornet.mera.models import blocked_terms
    from ivhl_jax.physics.tensornet.mera.superoperators import fixed_point_density

    dense = M.to_dense(m, model)
    rho = jax.jit(fixed_point_density, static_argnums=2)(
        dense.layer(dense.num_layers - 1), (dense.rho_ab, dense.rho_ba), iters
    )
    steady = dense.replace(rho_ab=rho[0], rho_ba=rho[1])
    return float(M.energy_per_site(steady, blocked_terms(model, np.float64)))


def _stage(model: Any, name: str, symmetric: bool, spec: tuple[int, ...], si_scales: int = 1) -> Any:
    from ivhl_jax import mera as M

    chi, mid, layers, _ = spec
    cfg = M.MERAConfig(
        chi=chi,
        chi_mid=mid,
        layers=layers,
        refsym=True,
        si_scales=si_scales,
        symmetry=M.Symmetry(GROUPS[name]) if symmetric else None,
    )
    return M.evenbly_vidal(model, cfg)


def run_ladder(
    name: str, symmetric: bool, ladder: list[tuple[int, ...]], key: int, trials: int | None, si_scales: int = 1
) -> tuple[dict, Any]:
    """One ladder run: (energy error per stage and the conformal data of the last stage, the last MERA)."""
    from ivhl_jax import mera as M
    from ivhl_jax.numerics.rollout import chunked

    model = _model(name, symmetric)
    k0 = jax.random.key(key)
    rec: dict[str, Any] = {"kind": f"symmetric {GROUPS[name]}" if symmetric else "dense", "stages": []}
    if symmetric:
        rec["trials"] = "default" if trials is None else trials
    m = None
    for k, spec in enumerate(ladder):
        t0 = time.perf_counter()
        st = _stage(model, name, symmetric, spec, si_scales)
        advance = chunked(st, 50, save_every=1, observe=M.observe)
        n = spec[3]
        if m is None:
            check = M.StuckCheck(trials=trials) if symmetric else M.StuckCheck()
            state, first, restarts = M.cold_start(st, k0, model.e0, 50, check, log=print, limit=n)
        else:
            grown = M.grow(m, jax.random.fold_in(k0, k), spec[0], spec[1], layers=spec[2], refsym=True, model=model)
            state, first, restarts = st.init(k0, mera=grown), np.zeros((0,)), []
        e = [first]
        for c in range((n - first.shape[0]) // 50):
            state, chunk = advance(state)
            e.append(np.asarray(chunk))
            if (c + 1) % 10 == 0:  # long stages: show progress
                print(
                    f"  {spec}: {first.shape[0] + 50 * (c + 1)} sweeps, {time.perf_counter() - t0:.0f} s, "
                    f"energy error {float(chunk[-1]) - model.e0:.3e}",
                    flush=True,
                )
        err = np.concatenate(e) - model.e0
        m = state.mera
        stage = {"stage": "/".join(str(x) for x in spec), "energy_error": float(err[-1]), "restarts": len(restarts)}
        stage["energy_error_at"] = {str(i): float(err[i - 1]) for i in (100, 300, 1000, len(err)) if i <= len(err)}
        stage["energy_error_min"] = {"error": float(err.min()), "sweep": int(err.argmin()) + 1}
        stage["energy_error_steady_rho"] = steady_energy(m, model) - model.e0
        if symmetric:
            stage["sectors"] = [{str(q): d for q, d in zip(w.legs[2].charges, w.legs[2].dims)} for w in m.w]
            stage["mid_sectors"] = [{str(q): d for q, d in zip(u.legs[2].charges, u.legs[2].dims)} for u in m.u]
        stage["seconds_loaded_host"] = round(time.perf_counter() - t0, 1)
        # per stage (cheap, no central charge): how the order and the lowest dimensions move along the ladder
        stage["order_parameter_X"] = order_parameter(M.to_dense(m, model) if symmetric else m, model)
        stage["scaling_dimensions"] = [round(float(x), 4) for x in M.scaling_dimensions(m, 6)]
        rec["stages"].append(stage)
        print(name, rec["kind"], stage, flush=True)
    rec.update(_conformal(m, model, name, symmetric))
    return rec, m


def trial_table(name: str, spec: tuple[int, ...], key: int) -> dict[str, Any]:
    """The symmetric first stage's single draws: ``init(key)`` (the start without trials) and the draws of
    ``split(key, 4)`` (the default trials of the first attempt), each run 300 steps with no re-initialisation: the
    energy error after 50, 100 and 300 steps."""
    from ivhl_jax import mera as M
    from ivhl_jax.numerics.rollout import chunked

    model = _model(name, True)
    st = _stage(model, name, True, spec)
    advance = chunked(st, 50, save_every=1, observe=M.observe)
    k0 = jax.random.key(key)
    out = {}
    for label, k in [("key", k0)] + [(f"split(key, 4)[{i}]", k) for i, k in enumerate(jax.random.split(k0, 4))]:
        state, at = st.init(k), {}
        for c in range(6):
            state, e = advance(state)
            if c + 1 in (1, 2, 6):
                at[str(50 * (c + 1))] = float(e[-1]) - model.e0
        out[label] = at
    return out


def dense_from_symmetric(m: Any, name: str, spec: tuple[int, ...], sweeps: int, eps: float, key: int) -> dict:
    """Dense sweeps from the symmetric MERA's embedding (in the symmetric run's basis), as it is and with every u, w,
    v moved by ``eps`` times a normal draw (then made isometric again,
    :func:`~ivhl_jax.physics.tensornet.mera.config.polar_factor`): whether the symmetric state is a minimum of the
    dense energy or the dense sweep lowers it by breaking the symmetry (⟨X⟩ growing from 0). The energy error after
    100, 300, 1000 and ``sweeps`` sweeps, and ⟨X⟩ at the end."""
    from ivhl_jax import mera as M
    from ivhl_jax.numerics.rollout import chunked
    from ivhl_jax.physics.tensornet.mera.config import polar_factor

    model = _model(name, True)
    start = M.to_dense(m, model)
    st = _stage(model, name, False, spec)
    advance = chunked(st, 50, save_every=1, observe=M.observe)
    keys = iter(jax.random.split(jax.random.key(key), 3 * start.num_layers))

    def nudge(t: Any, k: int) -> Any:
        mat = t.reshape(-1, int(np.prod(t.shape[-k:])))
        mat = mat + eps * jax.random.normal(next(keys), mat.shape, mat.dtype)
        return polar_factor(mat).reshape(t.shape)

    moved = start.replace(
        u=tuple(nudge(u, 2) for u in start.u),
        w=tuple(nudge(w, 1) for w in start.w),
        v=tuple(nudge(v, 1) for v in start.v),
    )
    out = {}
    for label, m0 in (("as_is", start), (f"moved_by_{eps:g}", moved)):
        state, errs = st.init(mera=m0), {}
        for c in range(sweeps // 50):
            state, e = advance(state)
            if (c + 1) * 50 in (100, 300, 1000) or c + 1 == sweeps // 50:
                errs[str((c + 1) * 50)] = float(e[-1]) - model.e0
        out[label] = {"energy_error_at": errs, "order_parameter_X": order_parameter(state.mera, model)}
        print(name, "dense from symmetric", label, out[label], flush=True)
    return out


def _conformal(m: Any, model: Any, name: str, symmetric: bool) -> dict[str, Any]:
    from ivhl_jax import mera as M

    out: dict[str, Any] = {}
    dense = M.to_dense(m, model) if symmetric else m
    out["order_parameter_X"] = order_parameter(dense, model)
    if symmetric:
        dims, charges = M.scaling_dimensions(m, 10, charges=True)
        out["scaling_dimensions"] = [[round(float(x), 4), int(q)] for x, q in zip(dims, charges)]
    else:
        out["scaling_dimensions"] = [round(float(x), 4) for x in M.scaling_dimensions(m, 10)]
    try:
        cc = M.central_charge(dense, model)
        out["central_charge"] = {"c": float(cc["c"]), "exact": cc.get("exact")}
    except ValueError as exc:
        out["central_charge"] = {"error": str(exc)[:300]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=["xx", "potts", "ising"], choices=sorted(GROUPS))
    ap.add_argument("--ladder", nargs="*", default=["6/4/1/2000", "8/6/2/1800"], help="stages chi/chi_mid/layers/steps")
    ap.add_argument("--key", type=int, default=0)
    ap.add_argument("--kinds", nargs="*", default=["dense", "symmetric"], choices=["dense", "symmetric"])
    ap.add_argument("--compare-trials", type=int, default=None, help="also run the symmetric ladder with these trials")
    ap.add_argument(
        "--dense-from-symmetric", type=int, default=0, help="dense sweeps from the symmetric MERA's end (0: none)"
    )
    ap.add_argument(
        "--si-scales",
        type=int,
        default=1,
        help="scales whose environments the scale-invariant layer's update sums (MERAConfig.si_scales; 1: the default)",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from ivhl_jax.bench.harness import write_results
    from ivhl_jax.run.device import enable_compilation_cache

    # the symmetric sweeps compile for minutes, sweeping them takes seconds: keep the compiled chunks
    enable_compilation_cache(os.environ.get("IVHL_COMPILATION_CACHE_DIR") or None)
    command = "python -m bench.studies.mera_symmetric_starts " + " ".join(sys.argv[1:] if argv is None else argv)
    ladder = [tuple(int(x) for x in s.split("/")) for s in args.ladder]
    doc: dict[str, Any] = {
        "what": "dense vs symmetric MERA on the same ladder (the sim's calls: checked cold start, then grow), float64, "
        "refsym; energy error per site per stage, one-spin <X>, scaling dimensions, central charge",
        "ladder": args.ladder,
        "key": args.key,
        "si_scales": args.si_scales,
        "runs": {},
    }
    with jax.enable_x64(True):
        for name in args.models:
            runs = doc["runs"].setdefault(name, [])
            kinds = [(kind == "symmetric", None) for kind in args.kinds]
            if args.compare_trials is not None:
                kinds.append((True, args.compare_trials))
            if "symmetric" in args.kinds:
                doc.setdefault("single_draws_first_stage", {})[name] = trial_table(name, ladder[0], args.key)
            for symmetric, trials in kinds:
                rec, m = run_ladder(name, symmetric, ladder, args.key, trials, args.si_scales)
                runs.append(rec)
                if symmetric and trials is None and args.dense_from_symmetric:
                    rec["dense_sweeps_from_it"] = dense_from_symmetric(
                        m, name, ladder[-1], args.dense_from_symmetric, 1e-3, args.key
                    )
                write_results(args.out, doc, command=command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
