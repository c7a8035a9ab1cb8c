"""Hausdorff and spectral dimensions of 2D CDT by finite-size scaling (host engine, fixed volume).

For each volume N2 (T = sqrt(N2)/2 slices of initial length 2T, so the shape of the universe is fixed
as N2 grows) ``--chains`` independent chains are thermalised with the host engine (2d-cdt's list
proposals, volume fixed at N2 with eps = 0.02), then measured ``--measurements`` times, ``--gap`` sweeps
apart (a sweep = N2 attempts). Each configuration gives:

* the mean graph distance <r> between random vertices (vertex graph) and triangles (dual graph) from
  exact BFS spheres (scipy, from ``--origins`` origins): <r> = a + b N^{1/d_H} (:func:`cdt.hausdorff_from_scaling`);
* the return probability P(σ) of the lazy walk (a = 1/2) from ``--origins`` origins on both graphs
  (:func:`ivhl_jax.physics.cdt.spectral.graph_return_probability`, exact diffusion per origin), hence
  d_s(σ) = −2 d ln P / d ln σ with jackknife errors over configurations, and the mixing time σ*
  (P(σ*) = 2/N) whose scaling σ* ∝ N^{2/d_s} is the finite-size estimate of d_s.

Writes ``bench/results/cdt_hausdorff_scaling.json`` and ``bench/results/cdt_spectral_dimension.json``
(each with the command that made it)::

    python -m ivhl_jax.bench.cdt_dimensions --volumes 1024 2048 4096 8192 16384 32768
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def _compact(src, dst, alive):
    """Live nodes relabelled 0..N-1 and the edges between them (NumPy)."""
    src, dst, alive = np.asarray(src), np.asarray(dst), np.asarray(alive)
    ids = np.nonzero(alive)[0]
    relabel = np.full(alive.shape[0], -1, np.int64)
    relabel[ids] = np.arange(ids.size)
    ok = (src < alive.shape[0]) & (dst < alive.shape[0])
    s, d = relabel[src[ok]], relabel[dst[ok]]
    keep = (s >= 0) & (d >= 0)
    return s[keep], d[keep], ids.size


def _bfs_mean_distance(s, d, n, origins):
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    adj = csr_matrix((np.ones(s.size), (s, d)), shape=(n, n))
    dist = shortest_path(adj, unweighted=True, indices=origins)
    return float(dist.mean())


def _graphs(state):
    from ivhl_jax.physics.cdt import graph
    from ivhl_jax.physics.cdt.observables import geometry_arrays

    tv, tnbr, tri_alive, vert_alive = geometry_arrays(state)
    vs, vd = graph.vertex_adjacency_edges(tv, tri_alive)
    ds, dd = graph.dual_adjacency_edges(tnbr, tri_alive)
    return {"vertex": _compact(vs, vd, vert_alive), "dual": _compact(ds, dd, tri_alive)}


def run(volumes, chains, thermal, measurements, gap, origins, sigma_factor, mix_limit, seed=0, log=print,
        dump=None):
    from ivhl_jax import cdt, trajectory
    from ivhl_jax.physics.cdt import spectral

    rng = np.random.default_rng(seed)
    out = []
    for n2 in volumes:
        t_slices = max(3, int(round(math.sqrt(n2) / 2)))
        length = max(3, n2 // (2 * t_slices))
        params = cdt.make_params(cdt.LN2, eps=0.02, target=float(n2), engine="host")
        stepper = cdt.metropolis(params)
        keys = jax.random.split(jax.random.key(seed + n2), chains)
        chain = jax.vmap(lambda k, st=stepper, t=t_slices, ln=length, n=n2: st.init(k, t, ln, n))(keys)

        def advance(c, sweeps, st=stepper):
            return jax.jit(jax.vmap(lambda x: trajectory(st, x, sweeps, save_every=sweeps, observe=cdt.observe)[0]))(c)

        t0 = time.perf_counter()
        chain = advance(chain, thermal)
        jax.block_until_ready(chain)
        t_therm = time.perf_counter() - t0
        sigma_max = int(sigma_factor * math.sqrt(n2))
        grid = np.unique(np.geomspace(2, sigma_max, 40).astype(int))
        rec = {"n2_target": n2, "n_slices": t_slices, "chains": chains, "thermal_sweeps": thermal,
               "thermal_seconds": round(t_therm, 1), "sigma_max": sigma_max, "sigma_grid": grid.tolist(),
               "n2": [], "mean_distance": {"vertex": [], "dual": []}, "p": {"vertex": [], "dual": []},
               "n_nodes": {"vertex": [], "dual": []}}
        for m in range(measurements):
            if m:
                chain = advance(chain, gap)
            for c in range(chains):
                geo = jax.tree_util.tree_map(lambda x, c=c: x[c], chain.geometry)
                rec["n2"].append(int(geo.n2))
                for name, (s, d, n) in _graphs(geo).items():
                    o = rng.choice(n, origins, replace=False)
                    rec["mean_distance"][name].append(_bfs_mean_distance(s, d, n, o))
                    # N steps (past the mixing time) where affordable, else the short-time window only
                    steps = n if n2 <= mix_limit else min(n, sigma_max)
                    p = spectral.graph_return_probability(jnp.asarray(s, jnp.int32), jnp.asarray(d, jnp.int32),
                                                    jnp.ones(n, bool), jnp.asarray(o, jnp.int32), steps)
                    rec["p"][name].append(np.asarray(p).mean(0).tolist())
                    rec["n_nodes"][name].append(n)
        rec["seconds"] = round(time.perf_counter() - t0, 1)
        log(f"N2={n2}: T={t_slices}, <N2>={np.mean(rec['n2']):.0f}, thermalised in {t_therm:.0f} s, "
            f"<r> vertex {np.mean(rec['mean_distance']['vertex']):.2f} dual {np.mean(rec['mean_distance']['dual']):.2f}"
            f", total {rec['seconds']:.0f} s")
        out.append(rec)
        if dump is not None:
            dump(out)
    return out


def analyse(records):
    from ivhl_jax import cdt
    from ivhl_jax.physics.cdt import spectral

    vols = [float(np.mean(r["n2"])) for r in records]
    haus: dict[str, Any] = {"volumes": vols}
    spec: dict[str, Any] = {"volumes": vols, "per_volume": []}
    for graph in ("vertex", "dual"):
        dist = [float(np.mean(r["mean_distance"][graph])) for r in records]
        derr = [float(np.std(r["mean_distance"][graph], ddof=1) / math.sqrt(len(r["mean_distance"][graph])))
                for r in records]
        fits = {}
        # <r> = a + b N2^(1/d_H) on every run of >= 4 consecutive volumes: dropping the smallest shows the
        # lattice drift, dropping the largest shows how far the largest volumes move the estimate
        for k in range(len(vols)):
            for j in range(k + 4, len(vols) + 1):
                d_h, err = cdt.hausdorff_from_scaling(vols[k:j], dist[k:j])
                fits[f"offset_fit_N2={vols[k]:.0f}..{vols[j - 1]:.0f}"] = [d_h, err]
        for k in range(len(vols) - 1):
            slope = math.log(dist[k + 1] / dist[k]) / math.log(vols[k + 1] / vols[k])
            rel = math.hypot(derr[k] / dist[k], derr[k + 1] / dist[k + 1]) / math.log(vols[k + 1] / vols[k])
            fits[f"local_{vols[k]:.0f}_{vols[k + 1]:.0f}"] = [1.0 / slope, rel / slope**2]
        haus[graph] = {"mean_distance": dist, "mean_distance_error": derr, "fits": fits}
    for graph in ("vertex", "dual"):
        mix, mix_err = [], []
        rows = []
        for r in records:
            width = min(len(row) for row in r["p"][graph])
            p = np.asarray([row[:width] for row in r["p"][graph]])  # (configs, steps + 1)
            grid = np.asarray(r["sigma_grid"])
            grid = grid[grid < p.shape[1]]
            res = spectral.spectral_dimension(p[:, grid], grid)
            n = np.asarray(r["n_nodes"][graph], float)
            t = np.asarray(spectral.mixing_time(p, n))
            reached = bool(np.all(np.isfinite(t)))
            mix.append(float(np.mean(t)) if reached else float("nan"))
            mix_err.append(float(np.std(t, ddof=1) / math.sqrt(t.size)) if reached else float("nan"))
            # plateau: a straight-line fit of ln P against ln sigma on [N/50, N/5] (past the lattice artefacts,
            # before the walk feels the finite volume) where the diffusion went that far, else on
            # [10, sqrt(N2)]; jackknife error over configurations
            n_mean = float(n.mean())
            if p.shape[1] - 1 >= n_mean / 5:
                lo, hi = n_mean / 50, n_mean / 5
            else:
                lo, hi = 10.0, math.sqrt(np.mean(r["n2"]))
            grid = np.unique(np.concatenate([grid, np.geomspace(lo, hi, 12).astype(int)]))
            g = grid[(grid >= lo) & (grid <= hi)]
            slopes = []
            for i in range(p.shape[0]):
                q = np.delete(p, i, 0).mean(0)[g]
                slopes.append(-2 * np.polyfit(np.log(g), np.log(q), 1)[0])
            full = -2 * np.polyfit(np.log(g), np.log(p.mean(0)[g]), 1)[0]
            m = p.shape[0]
            jerr = math.sqrt((m - 1) / m * np.sum((np.asarray(slopes) - np.mean(slopes)) ** 2))
            res = spectral.spectral_dimension(p[:, grid], grid)
            rows.append({"graph": graph, "n2": float(np.mean(r["n2"])), "sigma": res.sigma.tolist(),
                         "d_s": res.d_s.tolist(), "error": res.error.tolist(),
                         "window": [int(g[0]), int(g[-1])], "d_s_window_fit": [float(full), float(jerr)],
                         "mixing_time": mix[-1], "mixing_time_error": mix_err[-1]})
        spec["per_volume"] += rows
        have = [i for i, t in enumerate(mix) if np.isfinite(t)]
        nn = [float(np.mean(records[i]["n_nodes"][graph])) for i in have]
        mix, mix_err = [mix[i] for i in have], [mix_err[i] for i in have]
        fits = {}
        for k in range(len(nn)):
            for j in range(k + 3, len(nn) + 1):
                w = 1.0 / (np.asarray(mix_err[k:j]) / np.asarray(mix[k:j]))  # 1/sigma of ln(sigma*)
                coef, cov = np.polyfit(np.log(nn[k:j]), np.log(mix[k:j]), 1, w=w, cov="unscaled")
                slope, err = coef[0], math.sqrt(max(cov[0, 0], 0.0))
                fits[f"power_fit_N={nn[k]:.0f}..{nn[j - 1]:.0f}"] = [2.0 / slope, 2.0 * err / slope**2]
        for k in range(len(nn) - 1):
            slope = math.log(mix[k + 1] / mix[k]) / math.log(nn[k + 1] / nn[k])
            rel = math.hypot(mix_err[k] / mix[k], mix_err[k + 1] / mix[k + 1]) / math.log(nn[k + 1] / nn[k])
            fits[f"local_{nn[k]:.0f}_{nn[k + 1]:.0f}"] = [2.0 / slope, 2.0 * rel / slope**2]
        spec[graph] = {"n_nodes": nn, "mixing_time": mix, "mixing_time_error": mix_err,
                       "d_s_from_mixing_time_scaling": fits}
    return haus, spec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--volumes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--thermal", type=int, default=400, help="thermalisation sweeps (N2 attempts each)")
    ap.add_argument("--measurements", type=int, default=2)
    ap.add_argument("--gap", type=int, default=100, help="sweeps between measurements")
    ap.add_argument("--origins", type=int, default=4)
    ap.add_argument("--sigma-factor", type=float, default=4.0, help="sigma_max = factor * sqrt(N2)")
    ap.add_argument("--mix-limit", type=int, default=16384,
                    help="volumes N2 up to this diffuse N steps (past the mixing time: d_s by scaling)")
    ap.add_argument("--raw", default=None, help="also dump the raw records to this JSON file (after each volume)")
    ap.add_argument("--from-raw", nargs="+", default=None,
                    help="analyse raw record files of earlier runs (concatenated, sorted by volume) instead of running")
    ap.add_argument("--run-command", action="append", default=[],
                    help="with --from-raw: the command of each run that wrote them (recorded in the results)")
    args = ap.parse_args(argv)
    command = "python -m ivhl_jax.bench.cdt_dimensions " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.from_raw:
        command = "python -m ivhl_jax.bench.cdt_dimensions --from-raw " + " ".join(args.from_raw)
        # one record per volume: where several runs measured it, the one whose walks went furthest (on a tie
        # the first file given)
        best: dict = {}
        for f in args.from_raw:
            for r in json.loads(pathlib.Path(f).read_text()):
                steps = min(len(row) for row in r["p"]["dual"])
                if r["n2_target"] not in best or steps > best[r["n2_target"]][0]:
                    best[r["n2_target"]] = (steps, r)
        records = [best[v][1] for v in sorted(best)]
    else:
        def dump(recs):
            if args.raw:
                pathlib.Path(args.raw).write_text(json.dumps(recs))

        records = run(args.volumes, args.chains, args.thermal, args.measurements, args.gap, args.origins,
                      args.sigma_factor, args.mix_limit, log=lambda s: print(s, flush=True), dump=dump)
    haus, spec = analyse(records)
    meta: dict[str, Any] = {"command": command}
    if args.run_command:
        meta["runs"] = args.run_command
    meta["engine"] = "host (list proposals), eps = 0.02, lambda = ln 2, fixed N2 = target"
    meta["per_volume_schedule"] = [
        {"n2": r["n2_target"], "n_slices": r["n_slices"], "chains": r["chains"], "thermal_sweeps": r["thermal_sweeps"],
         "configurations": len(r["n2"]), "walk_steps": {g: min(len(q) for q in r["p"][g]) - 1 for g in r["p"]}}
        for r in records]
    (RESULTS / "cdt_hausdorff_scaling.json").write_text(json.dumps({**meta, **haus}, indent=1))
    spec_meta = {**meta, "walk": "lazy random walk, stay probability 1/2, exact diffusion per origin",
                 "d_s_error": "jackknife over configurations"}
    (RESULTS / "cdt_spectral_dimension.json").write_text(json.dumps({**spec_meta, **spec}, indent=1))
    print(json.dumps({"hausdorff": {g: haus[g]["fits"] for g in ("vertex", "dual")},
                      "spectral": {g: spec[g]["d_s_from_mixing_time_scaling"] for g in ("vertex", "dual")},
                      "plateau": [(r["graph"], r["n2"], r["d_s_window_fit"]) for r in spec["per_volume"]]},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
