"""NumPy port of the reference optimiser, Evenbly's tensors.net ``doVarMERA`` (modified binary MERA, v1.2), for
timing against :mod:`ivhl_jax.physics.tensornet.mera`: the same per-sweep work as the reference with ``refsym=True``.

One sweep (``numiter`` iteration) of ``doVarMERA``: ``sciter = 4`` power iterations of the scale-invariant layer's
descending superoperator (each hermitised, normalised and reflection-symmetrised); the density matrices descended
to the bottom; then bottom-up, for every layer, the disentangler from its environment (two 7-tensor networks: the
diagram with h on (f0, f1), reflected, and the one on (f1, f2); from iteration 10 on), the isometry w from its
four-network environment (from iteration 2 on; v = its mirror image), each by the SVD update x = −U Vᵀ, and the
Hamiltonian ascended (three networks). Contractions go through ``opt_einsum`` with the NumPy backend and optimal
pairwise paths (``numpy.tensordot``/BLAS, like the reference's ``ncon``), one cached expression per network and
shape; the networks are this library's diagrams (``mera.superoperators._T1``… and
``mera.sweep._ENV_U``/``_ENV_W``), written in its conventions (v = mirror(w)). Single-threaded when run with
``OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1`` (set by :func:`main` before NumPy loads). The energy is measured
before the updates, as in the library.

    .venv/bin/python -m bench.studies.mera_reference --schedule published=6/4/1/2000,8/6/2/1800 \\
        --out /tmp/mera_reference.json
    .venv/bin/python -m bench.studies.mera_reference --time-sweep 8/6/3 --time-sweep 12/8/3
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Any

_PATTERNS = {  # the reference's networks in this library's labels (see ivhl_jax.physics.tensornet.mera)
    # ascending: t1 (h_AB on f0 f1), t2 (h_BA on f1 f2), t4 (h_BA between cells); operands bras, h, kets
    "t1": "ekr,fckl,lds,efab,aip,bcij,jdq->rspq",
    "t2": "akr,efkl,lds,efbc,aip,bcij,jdq->rspq",
    "t4": "jer,fis,efda,jdp,aiq->rspq",
    # descending: the transposes of t1, t2, t4 with the coarse rho closing the coarse legs
    "d1": "ekr,fckl,lds,aip,bcij,jdq,pqrs->abef",
    "d2": "akr,efkl,lds,aip,bcij,jdq,pqrs->bcef",
    "d4": "jer,fis,jdp,aiq,pqrs->daef",
    # environments of u (t1, t2) and w (t1, t2, t3, t4)
    "u1": "ekr,lds,efab,aip,bcij,jdq,pqrs->fckl",
    "u2": "akr,lds,efbc,aip,bcij,jdq,pqrs->efkl",
    "w1": "fckl,lds,efab,aip,bcij,jdq,pqrs->ekr",
    "w2": "efkl,lds,efbc,aip,bcij,jdq,pqrs->akr",
    "w3": "bekl,lfs,efcd,aip,bcij,jdq,pqrs->akr",
    "w4": "jer,efda,jdp,aiq,pqrs->fis",
}


def _np():
    import numpy as np

    return np


@functools.cache
def _expr(name: str, shapes: tuple) -> Any:
    import opt_einsum

    return opt_einsum.contract_expression(_PATTERNS[name], *shapes, optimize="optimal")


def net(name: str, *ops):
    return _expr(name, tuple(o.shape for o in ops))(*ops, backend="numpy")


def _refl(o):
    return o.transpose(1, 0, 3, 2)


def _mirror(w):
    return w.transpose(1, 0, 2)


def _svd_update(env, k: int):
    np = _np()
    shape = env.shape
    lead = int(np.prod(shape[: len(shape) - k]))
    uu, _, vt = np.linalg.svd(env.reshape(lead, -1), full_matrices=False)
    return -(uu @ vt).reshape(shape)


def descend(rho_ab, rho_ba, u, w):
    v = _mirror(w)
    wb, ub, vb = w.conj(), u.conj(), v.conj()
    a = 0.5 * net("d1", wb, ub, vb, w, u, v, rho_ba)
    b = 0.5 * net("d2", wb, ub, vb, w, u, v, rho_ba) + 0.5 * net("d4", vb, wb, v, w, rho_ab)
    return a + _refl(a), b


def ascend(h_ab, h_ba, u, w):
    v = _mirror(w)
    wb, ub, vb = w.conj(), u.conj(), v.conj()
    t1 = net("t1", wb, ub, vb, h_ab, w, u, v)
    return net("t4", vb, wb, h_ba, v, w), t1 + _refl(t1) + net("t2", wb, ub, vb, h_ba, w, u, v)


def _herm_norm(r):
    np = _np()
    r = 0.5 * (r + r.transpose(2, 3, 0, 1).conj())
    d = r.shape[0] * r.shape[1]
    r = r / np.trace(r.reshape(d, d))
    return 0.5 * (r + _refl(r))


def sweep(state: dict, h: tuple, k: int, sciter: int = 4, u_delay: int = 10) -> float:
    """One doVarMERA iteration ``k`` in place on ``state`` (lists u, w; rho_ab, rho_ba at the top); returns the
    energy per site measured before the updates."""
    np = _np()
    us, ws = state["u"], state["w"]
    n = len(us)
    ra, rb = state["rho_ab"], state["rho_ba"]
    for _ in range(sciter):
        ra, rb = descend(ra, rb, us[-1], ws[-1])
        ra, rb = _herm_norm(ra), _herm_norm(rb)
    state["rho_ab"], state["rho_ba"] = ra, rb
    rhos: list[Any] = [None] * (n + 1)
    rhos[n] = (ra, rb)
    for z in range(n - 1, -1, -1):  # rho at the bottom of layer z (the SI layer, n - 1, too: as the reference)
        rhos[z] = descend(rhos[z + 1][0], rhos[z + 1][1], us[z], ws[z])
    h_ab, h_ba = h
    energy = float(np.einsum("abcd,cdab->", rhos[0][0], h_ab) + np.einsum("abcd,cdab->", rhos[0][1], h_ba)) / 4.0
    d = h_ab.shape[0]
    bias = float(np.max(np.linalg.eigvalsh(h_ab.reshape(d * d, d * d))))
    eye = np.eye(d * d).reshape(h_ab.shape)
    hz = (h_ab - bias * eye, h_ba - bias * eye)
    for z in range(n):
        r_ab, r_ba = rhos[z + 1]
        u, w = us[z], ws[z]
        v = _mirror(w)
        if k >= u_delay:
            # reference: Γ = Γ(t1) + RΓ(t1) + Γ(t2), then Γ + RΓ = 2(Γ(t1) + ½Γ(t2)) + R(…): t2 is its own mirror
            x = net("u1", w.conj(), v.conj(), hz[0], w, u, v, r_ba) + 0.5 * net(
                "u2", w.conj(), v.conj(), hz[1], w, u, v, r_ba
            )
            u = _svd_update(x + _refl(x), 2)
        if k > 1:
            ub, vb = u.conj(), v.conj()
            env = (
                net("w1", ub, vb, hz[0], w, u, v, r_ba)
                + net("w2", ub, vb, hz[1], w, u, v, r_ba)
                + net("w3", ub, vb, hz[0], w, u, v, r_ba)
                + net("w4", vb, hz[1], v, w, r_ab)
            )
            w = _svd_update(env, 1)
        us[z], ws[z] = u, w
        if z + 1 < n:
            hz = ascend(hz[0], hz[1], u, w)
    return energy


def _from_mera(mera) -> dict:
    np = _np()
    return {
        "u": [np.asarray(x, np.float64) for x in mera.u],
        "w": [np.asarray(x, np.float64) for x in mera.w],
        "rho_ab": np.asarray(mera.rho_ab, np.float64),
        "rho_ba": np.asarray(mera.rho_ba, np.float64),
    }


def _to_mera(state: dict, sweeps: int):
    import jax.numpy as jnp

    from ivhl_jax.physics.tensornet import mera as M
    from ivhl_jax.physics.tensornet.mera.superoperators import mirror_wv

    w = tuple(jnp.asarray(x) for x in state["w"])
    return M.MERA(
        tuple(jnp.asarray(x) for x in state["u"]),
        w,
        tuple(mirror_wv(x) for x in w),
        jnp.asarray(state["rho_ab"]),
        jnp.asarray(state["rho_ba"]),
        jnp.asarray(sweeps, jnp.int32),
    )


def run_ladder(stages: list[dict], seed: int = 0, marks_every: int = 50, fold: int = 0) -> dict:
    """The ladder with the reference sweep: cold start from ``init_tensors`` (as ``doVarMERA``'s random start; no
    stuck-start check, the reference has none), stages joined by this library's ``grow(..., refsym=True)``
    (JAX, included in the clock). ``fold`` > 0 starts from ``fold_in(key, fold)`` (the start ``cold_start`` keeps
    after ``fold`` re-initialisations). Returns per-stage times and energy errors every ``marks_every`` sweeps."""
    import jax

    from ivhl_jax.physics.tensornet import mera as M
    from ivhl_jax.physics.tensornet.mera.models import ising_two_site_hamiltonian

    np = _np()
    key = jax.random.key(seed)
    marks, summary = [], []
    t0 = time.perf_counter()
    done = 0
    state = None
    with jax.enable_x64(True):
        h = tuple(np.asarray(x, np.float64) for x in ising_two_site_hamiltonian(1.0))
        for k, st in enumerate(stages):
            ts = time.perf_counter()
            cfg = M.MERAConfig(chi=st["chi"], chi_mid=st["chi_mid"], layers=st["layers"])
            if state is None:
                state = _from_mera(M.init_tensors(jax.random.fold_in(key, fold) if fold else key, cfg))
                it0 = 0
            else:
                state = _from_mera(
                    M.grow(
                        _to_mera(state, done),
                        jax.random.fold_in(key, k),
                        st["chi"],
                        st["chi_mid"],
                        layers=st["layers"],
                        refsym=True,
                    )
                )
                it0 = 10**6  # a grown MERA: u and w updated from the first iteration (doVarMERA continues its count)
            for i in range(st["steps"]):
                e = sweep(state, h, it0 + i)
                done += 1
                if done % marks_every == 0:
                    marks.append((done, time.perf_counter() - t0, e - M.E0_CRITICAL_ISING))
            summary.append({**st, "wall_s": round(time.perf_counter() - ts, 2), "final_energy_error": marks[-1][2]})
            print(f"  reference stage {k}: {st} -> {marks[-1][2]:.3e} in {summary[-1]['wall_s']} s", flush=True)
    return {
        "stages": summary,
        "total_s": round(marks[-1][1], 2),
        "final_energy_error": marks[-1][2],
        "chunk_marks": [[s, round(t, 3), e] for s, t, e in marks],
    }


def time_sweep(chi: int, mid: int, layers: int, repeats: int = 5, seed: int = 0, window_s: float = 0.0) -> dict:
    """Median seconds of one reference sweep (u and w updates on) on a random start of these shapes.

    Each of the ``repeats`` samples runs sweeps back to back until it lasts at least ``window_s`` seconds
    (one sweep if 0) and reports their mean.
    """
    import jax

    from ivhl_jax.bench.harness import time_in_windows
    from ivhl_jax.physics.tensornet import mera as M
    from ivhl_jax.physics.tensornet.mera.models import ising_two_site_hamiltonian

    np = _np()
    with jax.enable_x64(True):
        state = _from_mera(M.init_tensors(jax.random.key(seed), M.MERAConfig(chi=chi, chi_mid=mid, layers=layers)))
        h = tuple(np.asarray(x, np.float64) for x in ising_two_site_hamiltonian(1.0))
    sweep(state, h, 100)  # builds the cached contraction paths
    times, per_sample = time_in_windows(lambda: sweep(state, h, 100), repeats=repeats, window_s=window_s)
    return {
        "chi": chi,
        "chi_mid": mid,
        "layers": layers,
        "median_s": float(np.median(times)),
        "sweeps_per_sample": per_sample,
        "times_s": [round(x, 5) for x in times],
    }


def main(argv=None) -> dict:
    from ivhl_jax.core import backend

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schedule", action="append", default=[], help="name=chi/chi_mid/layers/steps,...")
    ap.add_argument("--time-sweep", action="append", default=[], help="chi/chi_mid/layers")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--window", type=float, default=0.0, help="seconds per timed sample of --time-sweep")
    ap.add_argument("--threads", default="1", help="BLAS threads (set before NumPy loads if not yet loaded)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fold", type=int, default=0, help="start from fold_in(key(seed), fold) (0: key(seed))")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, args.threads)
    doc: dict = {
        "what": "NumPy port of tensors.net doVarMERA (refsym, sciter=4), see bench/studies/mera_reference.py",
        "command": "python -m bench.studies.mera_reference " + " ".join(argv if argv is not None else sys.argv[1:]),
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "host": f"{backend.machine_cores()}-CPU host",
        "ladders": {},
        "sweeps": [],
    }
    for text in args.time_sweep:
        chi, mid, layers = (int(x) for x in text.split("/"))
        doc["sweeps"].append(time_sweep(chi, mid, layers, args.repeats, args.seed, args.window))
        print(json.dumps(doc["sweeps"][-1]), flush=True)
    for text in args.schedule:
        name, _, body = text.partition("=")
        stages = []
        for part in body.split(","):
            chi, mid, layers, steps = (int(x) for x in part.split("/")[:4])
            stages.append({"chi": chi, "chi_mid": mid, "layers": layers, "steps": steps})
        doc["ladders"][name] = run_ladder(stages, args.seed, fold=args.fold)
    if args.out:
        from ivhl_jax.bench.harness import write_results

        write_results(args.out, doc, command=doc["command"])
    return doc


if __name__ == "__main__":
    main()
