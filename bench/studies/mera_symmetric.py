"""Symmetric (block-sparse) MERA ladders with conformal data labelled by charge: Z2 Ising, U(1) XX, Z3 Potts.

Each stage runs float64 Evenbly–Vidal sweeps of the symmetric MERA (:mod:`ivhl_jax.physics.tensornet.mera.symmetric`);
the first stage's sectors split χ evenly over the charges given, every later stage is grown from the previous one with
sectors chosen from the reduced density matrices' spectra
(:func:`~ivhl_jax.physics.tensornet.mera.symmetric.grow_by_spectrum`). After each stage: the energy error, the scaling
dimensions with their charges and CFT labels (:func:`~ivhl_jax.physics.tensornet.mera.symmetric.conformal_table`), the
OPE coefficients allowed by the charges (Ising C_σσε), the central charge
(:func:`~ivhl_jax.physics.tensornet.mera.conformal.central_charge` on the dense embedding) and the wall time of the
stage (compile included) and of the measurements. ``--compare-dense N``: the first N sweeps of every stage are also run
densely from the stage's start embedded, and the largest energy difference is recorded. The JSON is rewritten after
every stage (a run cut short keeps what it measured)::

    python -m bench.studies.mera_symmetric --model ising --ladder 8/6/2000 12/9/400 16/12/300 \\
        --budget-min 30 --out bench/results/mera_symmetric_ising_ladder.json

A stage is chi/chi_mid/sweeps; Ising and Potts use two transitional layers (χ per layer (min(χ, d²), χ, χ),
χ_mid (d², min(χ_mid, that), χ_mid)), XX one (χ_mid (4, χ_mid)); ``--layers L`` sets L transitional layers
(χ per layer (min(χ, d²·d²), χ, …, χ)); with ``--load``, L above the loaded MERA's transitional layers inserts
copies of its scale-invariant layer below the top first
(:func:`~ivhl_jax.physics.tensornet.mera.symmetric.insert_layers`).

``--track N`` records the energy error and the charged scaling dimensions every N sweeps of a stage (how far a stage
is from converged in its conformal data, not only in its energy). ``--save``/``--load`` continue a stage: a loaded
MERA at the same χ keeps its sectors (its ρ mixed with 𝟙/χ² by 1e-3), e.g. the χ = 16 stage of the three-layer XX
ladder continued for 2000 sweeps::

    python -m bench.studies.mera_symmetric --model xx --layers 3 --ladder 8/6/1000 12/9/1000 16/12/3000 \
        --save runs/symm_xx --out runs/xx_chi16.json
    python -m bench.studies.mera_symmetric --model xx --layers 3 --load runs/symm_xx_chi16.pkl --ladder 16/12/2000 \
        --track 250 --light --out bench/results/mera_symmetric_xx_chi16_continued_2000.json

``--grow-sectors``/``--grow-mid-sectors`` (JSON ``{charge: dim}``) replace the grown sectors of every bond of that size
(a comparison against the spectra's choice); ``--stage-index`` numbers the first stage (a loaded MERA grown with the
key of the stage it continues). For XX the results also hold the exact charge content of the largest Schmidt values
of a block of the chain at each stage's χ (:func:`xx_block_charges`), what the grown sectors are compared with.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from typing import Any

import jax
import numpy as np

MODELS = {"ising": ("Z2", (0, 1), 2), "xx": ("U1", (-1, 0, 1), 1), "potts": ("Z3", (0, 1, 2), 2)}


def _model(name: str) -> Any:
    from ivhl_jax import mera as M
    from ivhl_jax.physics.tensornet.mera import symmetric as MS

    return {"ising": M.ising, "xx": M.xx, "potts": MS.potts_charge_basis}[name]()


def _shape(
    name: str, chi: int, mid: int, d2: int, layers: int | None = None
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    layers = MODELS[name][2] if layers is None else layers
    if layers == 1:
        return (chi, chi), (d2, mid), 1
    bottom = min(chi, d2 * d2)  # the bottom layer carries at most d² · d² states
    return (bottom,) + (chi,) * layers, (d2, min(mid, bottom)) + (mid,) * (layers - 1), layers


def _even_split(n: int, charges: tuple[int, ...]) -> dict[int, int]:
    k = len(charges)
    if set(charges) == {-1, 0, 1}:  # U(1): ±1 equal (the chains' charge conjugation), 0 takes the remainder
        side = (n - n // 3) // 2
        return {0: n - 2 * side, -1: side, 1: side}
    return {q: n // k + (1 if i < n % k else 0) for i, q in enumerate(charges)}


def first_config(name: str, chi: int, mid: int, d2: int, layers: int | None = None) -> Any:
    """The first stage: χ and χ_mid split evenly over the charges (for U(1) the charges −1, 0, 1 with ±1 of equal
    size, 0 taking the remainder)."""
    from ivhl_jax import mera as M

    group, charges, _ = MODELS[name]
    if group == "U1":
        charges = (0, -1, 1)
    chis, mids, layers = _shape(name, chi, mid, d2, layers)
    sectors = [_even_split(c, charges) for c in chis]
    mid_sectors = [None] + [_even_split(m, charges) for m in mids[1:]]
    model = _model(name)
    return M.MERAConfig(
        chi=chis,
        chi_mid=mids,
        layers=layers,
        refsym=model.reflection_symmetric,
        symmetry=M.Symmetry(group, sectors=sectors, mid_sectors=mid_sectors),
    )


def xx_block_charges(sites: int, chi: int, modes: int = 14) -> dict[str, Any]:
    """The charges (S^z) of the ``chi`` largest Schmidt values of a block of ``sites`` consecutive spins of the
    infinite XX chain, exactly: the chain is free fermions at half filling (Jordan–Wigner), the block's reduced
    density matrix is Gaussian, fixed by the correlation matrix C_ij = sin(π(i−j)/2)/(π(i−j)), C_ii = ½, whose
    eigenvalues ν_k are the mode occupations (Peschel, J. Phys. A 36, L205 (2003)); a Schmidt value is
    Π_occupied ν_k Π_empty (1 − ν_k), its charge the occupied count − sites/2. The ``modes`` modes nearest ν = ½
    are enumerated (the others frozen at their likelier occupation, which keeps every Schmidt value above 1e-7
    for up to 64 sites). Returns ``kept`` (charge: count of the values above the χ-th), ``tied`` (charge: count of
    the values equal to the χ-th to 1e-9, among which the last states are chosen) and the χ-th value."""
    i = np.arange(sites)
    d = i[:, None] - i[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(d == 0, 0.5, np.sin(np.pi * d / 2) / (np.pi * d))
    nu = np.clip(np.linalg.eigvalsh(c), 1e-300, 1 - 1e-16)
    near = np.argsort(np.abs(nu - 0.5))[: min(sites, modes)]
    occ = np.tile(nu > 0.5, (2 ** len(near), 1))
    occ[:, near] = (np.arange(2 ** len(near))[:, None] >> np.arange(len(near))[None, :]) & 1
    logw = np.where(occ, np.log(nu), np.log1p(-nu)).sum(axis=1)
    charge = occ.sum(axis=1) - sites // 2
    order = np.argsort(-logw, kind="stable")
    cut = logw[order[chi - 1]]
    above, tie = logw > cut + 1e-9, np.abs(logw - cut) <= 1e-9

    def count(mask: np.ndarray) -> dict[str, int]:
        qs, n = np.unique(charge[mask], return_counts=True)
        return {str(int(q)): int(k) for q, k in zip(qs, n)}

    return {"sites": sites, "chi": chi, "kept": count(above), "tied": count(tie), "chi_th_value": float(np.exp(cut))}


def measure(m: Any, model: Any, cfg: Any, name: str, light: bool = False) -> dict[str, Any]:
    from ivhl_jax import mera as M
    from ivhl_jax.physics.tensornet.mera import symmetric as MS

    t0 = time.perf_counter()
    h = MS.symmetric_terms(model, cfg.symmetry)
    rec: dict[str, Any] = {
        "energy_error": float(M.energy_per_site(m, h)) - float(model.e0),
        "conformal_table": [
            {k: r[k] for k in ("delta", "charge", "label", "exact")} for r in M.conformal_table(m, name, 10)
        ],
    }
    if light:
        rec["seconds_to_measure"] = round(time.perf_counter() - t0, 1)
        return rec
    dense = M.to_dense(m, model, cfg.symmetry)

    def attempt(fn: Any) -> Any:
        try:
            return fn()
        except ValueError as exc:  # an unconverged stage: its data are not measurable, the ladder goes on
            return {"error": str(exc)[:300]}

    if name == "ising":
        ope = attempt(lambda: M.ope_coefficients(m, name))
        rec["ope"] = (
            ope
            if "error" in ope
            else {k: {kk: v[kk] for kk in ("measured", "exact", "allowed") if kk in v} for k, v in ope.items()}
        )
    cc = attempt(lambda: M.central_charge(dense, model))
    rec["central_charge"] = {k: v for k, v in cc.items() if isinstance(v, (int, float, str, list))}
    rec["isometry_error"] = max(M.isometry_errors(dense).values())
    rec["seconds_to_measure"] = round(time.perf_counter() - t0, 1)
    return rec


def _sweep(st, state, model, cfg, args, rec, spec, sweeps, chi, t0, t_start):
    """One stage's sweeps (the first ``--compare-dense`` of them beside a dense copy, recording the largest energy
    difference in ``rec``), in chunks that print progress and respect ``--budget-min``: (state, energy chunks)."""
    import dataclasses

    from ivhl_jax import mera as M
    from ivhl_jax import trajectory

    energies = []
    if args.compare_dense:
        n = min(args.compare_dense, sweeps)
        dst = M.evenbly_vidal(model, dataclasses.replace(cfg, symmetry=None))
        d0 = dst.init(mera=M.to_dense(state.mera, model, cfg.symmetry))
        _, de = trajectory(dst, d0, n, observe=M.observe)
        state, e = trajectory(st, state, n, observe=M.observe)
        rec["dense_compare_sweeps"] = n
        diff = np.abs(np.asarray(e)[1:] - np.asarray(de)[1:])
        rec["max_energy_difference_sym_vs_dense"] = float(np.max(diff))
        energies.append(np.asarray(e))
        done = n
    else:
        done = 0
    chunk = 100 if chi <= 12 else 25
    if args.track:
        chunk = math.gcd(chunk, args.track)
    while done < sweeps:
        if args.budget_min is not None and time.perf_counter() - t_start > 60 * args.budget_min and done:
            rec["stopped"] = f"wall-time budget of {args.budget_min} min spent after {done} sweeps"
            break
        n = min(chunk, sweeps - done)
        state, e = trajectory(st, state, n, observe=M.observe)
        energies.append(np.asarray(e))
        done += n
        if args.track and (done % args.track == 0 or done == sweeps):
            dims, qs = M.scaling_dimensions(state.mera, 6, charges=True)
            rec.setdefault("tracked", []).append(
                {
                    "sweeps": done,
                    "energy_error": float(e[-1]) - model.e0,
                    "scaling_dimensions": [[round(float(x), 5), int(q)] for x, q in zip(dims, qs)],
                }
            )
        print(
            f"[{spec}] {done} sweeps, energy error {float(e[-1]) - model.e0:.3e}, {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    return state, energies


def _start_stage(args, model, key, k, chi, mid, m, cfg):
    """Stage ``k``'s stepper, first state and config: a fresh MERA for the first stage, else ``m`` grown to
    (``chi``, ``mid``) with sectors from its spectra (mera.symmetric.grow_by_spectrum)."""
    from ivhl_jax import mera as M
    from ivhl_jax.physics.tensornet.mera import symmetric as MS

    if m is None:
        cfg = first_config(args.model, chi, mid, model.d**2, args.layers)
        st = M.evenbly_vidal(model, cfg)
        return st, st.init(key=key), cfg
    else:
        chis, mids, nl = _shape(args.model, chi, mid, model.d**2, args.layers)
        more = nl if nl > m.num_layers - 1 else None  # --layers above a loaded MERA's: insert copies
        assert cfg is not None  # set with m (loaded, or built by the previous stage)
        m0 = m
        k += args.stage_index
        m, cfg = MS.grow_by_spectrum(m, jax.random.fold_in(key, k), model, cfg, chis, mids, layers=more)
        if args.grow_sectors or args.grow_mid_sectors:  # hand-given sectors in place of the spectra's
            cfg = dataclasses.replace(cfg, symmetry=given_sectors(cfg, args.grow_sectors, args.grow_mid_sectors))
            m = MS.grow_symmetric(MS.insert_layers(m0, cfg.layers), jax.random.fold_in(key, k), model, cfg)
        st = M.evenbly_vidal(model, cfg)
        return st, st.init(mera=m), cfg


def given_sectors(cfg: Any, sectors: str | None, mid_sectors: str | None) -> Any:
    """``cfg.symmetry`` with the sectors given as JSON ``{charge: dim}`` on every bond (χ or χ_mid) whose size they
    add up to; the other bonds keep the sectors grown from the spectra."""
    from ivhl_jax.physics.tensornet.mera import symmetric as MS

    sym = cfg.symmetry
    n = cfg.layers + 1
    out = {}
    for name, given in (("sectors", sectors), ("mid_sectors", mid_sectors)):
        now = list(sym.per_layer(name, n))
        if given:
            want = tuple(sorted((int(q), int(d)) for q, d in json.loads(given).items()))
            size = sum(d for _, d in want)
            now = [want if s is not None and sum(d for _, d in s) == size else s for s in now]
        out[name] = tuple(now)
    return MS.Symmetry(sym.group, out["sectors"], out["mid_sectors"], sym.spin_charges)


def _parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--ladder", nargs="*", default=[], help="stages chi/chi_mid/sweeps (none with --load: measure it)")
    ap.add_argument("--key", type=int, default=0)
    ap.add_argument("--compare-dense", type=int, default=0, help="sweeps per stage also run densely")
    ap.add_argument(
        "--budget-min", type=float, default=None, help="stop sweeping (then measure) once this wall time is spent"
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--load", default=None, help="continue from a --save pickle (the first stage grows it)")
    ap.add_argument("--light", action="store_true", help="measure only the energy and the charged dimensions")
    ap.add_argument("--save", default=None, help="pickle each stage's MERA and config to <SAVE>_chi<chi>.pkl")
    ap.add_argument("--layers", type=int, default=None, help="transitional layers (default: the model's, see above)")
    ap.add_argument(
        "--stage-index", type=int, default=0, help="index of the first stage (its growth key is fold_in(key, index))"
    )
    ap.add_argument("--track", type=int, default=0, help="record the energy and charged dimensions every N sweeps")
    ap.add_argument(
        "--grow-sectors", default=None, help="JSON {charge: dim} for the grown bonds of that size (e.g. '{\"0\": 4}')"
    )
    ap.add_argument("--grow-mid-sectors", default=None, help="the same for the grown chi_mid bonds")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    from ivhl_jax.bench.harness import write_results

    command = "python -m bench.studies.mera_symmetric " + " ".join(sys.argv[1:] if argv is None else argv)
    model = _model(args.model)
    doc: dict[str, Any] = {
        "what": f"symmetric ({MODELS[args.model][0]}) MERA ladder of {model.name}, float64; sectors of every stage "
        "after the first grown from the reduced density matrices' spectra (mera.symmetric.grow_by_spectrum); "
        "conformal data labelled by charge",
        "e0_exact": model.e0,
        "stages": [],
    }
    if args.model == "xx":  # the exact charge content of the largest Schmidt values of a block, per stage's χ
        chis = sorted({int(spec.split("/")[0]) for spec in args.ladder})
        doc["exact_block_charges"] = [xx_block_charges(n, c) for c in chis for n in (4, 8, 16, 32, 64)]
    t_start = time.perf_counter()
    key = jax.random.key(args.key)
    with jax.enable_x64(True):
        m, cfg = None, None
        if args.load:
            import pickle

            with open(args.load, "rb") as f:
                m, cfg = pickle.load(f)
            m = jax.tree.map(jax.numpy.asarray, m)
            doc["loaded"] = args.load
            if not args.ladder:  # measure the saved stage as it is
                t0 = time.perf_counter()
                rec: dict[str, Any] = {
                    "stage": f"loaded {args.load}",
                    "layer_chis": list(m.chis),
                    "layer_chi_mids": list(m.chi_mids),
                }
                rec.update(measure(m, model, cfg, args.model, light=args.light))
                doc["stages"].append(rec)
                doc["total_seconds"] = round(time.perf_counter() - t0, 1)
                write_results(args.out, doc, command=command)
                return 0
        for k, spec in enumerate(args.ladder):
            if args.budget_min is not None and time.perf_counter() - t_start > 60 * args.budget_min:
                doc["stopped"] = f"wall-time budget of {args.budget_min} min spent before stage {spec}"
                break
            chi, mid, sweeps = (int(x) for x in spec.split("/"))
            t0 = time.perf_counter()
            st, state, cfg = _start_stage(args, model, key, k, chi, mid, m, cfg)
            rec = {
                "stage": spec,
                "layer_chis": list(state.mera.chis),
                "layer_chi_mids": list(state.mera.chi_mids),
                "sectors": [{str(q): d for q, d in s} for s in cfg.symmetry.per_layer("sectors", cfg.layers + 1)],
                "mid_sectors": [
                    None if s is None else {str(q): d for q, d in s}
                    for s in cfg.symmetry.per_layer("mid_sectors", cfg.layers + 1)
                ],
            }
            state, energies = _sweep(st, state, model, cfg, args, rec, spec, sweeps, chi, t0, t_start)
            err = np.concatenate(energies) - model.e0
            rec["sweeps_done"] = int(len(err))
            rec["stage_seconds"] = round(time.perf_counter() - t0, 1)
            every = max(1, len(err) // 10)
            rec["energy_error_at_sweep"] = {str(i + 1): float(err[i]) for i in range(0, len(err), every)}
            rec["energy_error_at_sweep"][str(len(err))] = float(err[-1])
            m = state.mera
            if args.save:
                import pickle

                with open(f"{args.save}_chi{chi}.pkl", "wb") as f:
                    pickle.dump((jax.tree.map(np.asarray, m), cfg), f)
            rec.update(measure(m, model, cfg, args.model, light=args.light))
            doc["stages"].append(rec)
            doc["total_seconds"] = round(time.perf_counter() - t_start, 1)
            print(json.dumps({kk: rec[kk] for kk in ("stage", "energy_error", "stage_seconds")}), flush=True)
            write_results(args.out, doc, command=command)
        if "stopped" in doc:
            write_results(args.out, doc, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
