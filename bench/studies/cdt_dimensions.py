"""Hausdorff and spectral dimensions of 2D CDT by finite-size scaling (host engine, fixed volume).

For each volume N2 (T = sqrt(N2)/2 slices of initial length 2T, so the shape of the universe is fixed
as N2 grows) ``--chains`` independent chains are thermalised with the host engine (2d-cdt's list
proposals, volume term eps (N2 - N2_target)^2, ``--eps`` 0.02 by default), then measured ``--measurements``
times, ``--gap`` sweeps apart (a sweep = N2 attempts, a fixed count). The fixed-volume ensemble is the chains'
law restricted to N2 = target: at each measurement the chains at the target volume are measured and the others
skipped (a sweep extended until N2 first hits the target would be biased), so a measurement yields about a sixth
of the chains at eps = 0.02 (the fraction is recorded as ``at_target``). The law at N2 = target does not depend
on eps (the volume term vanishes there): a larger eps puts more measurements at the target and slows the volume
moves. Each configuration gives:

* the mean graph distance <r> between random vertices (vertex graph) and triangles (dual graph) from
  exact BFS spheres (scipy, from ``--origins`` origins): <r> = a + b N^{1/d_H} (:func:`cdt.hausdorff_from_scaling`);
* the return probability P(σ) of the lazy walk (a = 1/2) from ``--origins`` origins on both graphs
  (:func:`ivhl_jax.physics.cdt.spectral.graph_return_probability`, exact diffusion per origin), hence
  d_s(σ) = −2 d ln P / d ln σ with jackknife errors over configurations, and the mixing time σ*
  (P(σ*) = 2/N) whose scaling σ* ∝ N^{2/d_s} is the finite-size estimate of d_s.

``--thermal-every K`` records N0 and <r> of every chain after each block of K thermalisation sweeps (has the
start, a regular torus, been forgotten?). ``--walk-origins`` diffuses only the first few BFS origins (the
walk costs O(sigma_max E) per origin, the BFS O(E)); ``--seed`` makes independent chains, and ``--from-raw``
pools the configurations of runs with different seeds at one volume.

Finite-size scaling (:func:`analyse`): besides the unweighted offset fit of :func:`cdt.hausdorff_from_scaling`
on every run of >= 4 consecutive volumes and the local exponents between neighbouring volumes, each form of
:func:`_forms` is fitted weighted by the standard errors of the mean over configurations (chi2/dof reported),
over N2 >= each volume and over 4096 .. each larger volume, with a bootstrap over configurations for the
widest ranges.

Writes ``bench/results/cdt_hausdorff_scaling.json`` and ``bench/results/cdt_spectral_dimension.json``
(each with the command that made it; ``--name`` replaces the ``cdt`` of the names)::

    python -m bench.studies.cdt_dimensions --volumes 1024 2048 4096 8192 16384 32768
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import pathlib
import sys
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"  # bench/results


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


def _configuration(geo, rng, origins, walk_origins, steps_for, rec=None):
    """Mean BFS distances (and, with ``rec``, the return probabilities) of one configuration."""
    from ivhl_jax.physics.cdt import spectral

    r = {}
    for name, (s, d, n) in _graphs(geo).items():
        o = rng.choice(n, origins, replace=False)
        r[name] = _bfs_mean_distance(s, d, n, o)
        if rec is None:
            continue
        rec["mean_distance"][name].append(r[name])
        rec["n_nodes"][name].append(n)
        if walk_origins:
            p = spectral.graph_return_probability(
                jnp.asarray(s, jnp.int32),
                jnp.asarray(d, jnp.int32),
                jnp.ones(n, bool),
                jnp.asarray(o[:walk_origins], jnp.int32),
                steps_for(n),
            )
            rec["p"][name].append(np.asarray(p).mean(0).tolist())
    return r


def _advance(stepper, chain, sweeps: int):
    """``sweeps`` sweeps of every chain (vmapped), the chains returned."""
    from ivhl_jax import cdt, trajectory

    return jax.jit(jax.vmap(lambda x: trajectory(stepper, x, sweeps, save_every=sweeps, observe=cdt.observe)[0]))(chain)


def _chain_geometry(chain, c: int):
    """The geometry (state) of chain ``c`` of a vmapped batch."""
    return jax.tree_util.tree_map(lambda x: x[c], chain.geometry)


def _thermalise(stepper, chain, n2: int, thermal: int, thermal_every: int, rng, origins: int, log, t0: float):
    """``thermal`` sweeps in blocks of ``thermal_every``, each followed by N0 and <r> of every chain: the series
    shows whether the start (a regular torus) has been forgotten. Returns the chains and the series."""
    chains = int(np.shape(chain.geometry.n2)[0])
    series: dict[str, list] = {"sweeps": [], "n0": [], "vertex": [], "dual": []}
    done = 0
    while done < thermal:
        block = thermal - done if thermal_every <= 0 else min(thermal_every, thermal - done)
        chain = _advance(stepper, chain, block)
        jax.block_until_ready(chain)
        done += block
        if thermal_every > 0:
            rows = [
                (int(g.n0), _configuration(g, rng, origins, 0, None))
                for g in (_chain_geometry(chain, c) for c in range(chains))
            ]
            series["sweeps"].append(done)
            series["n0"].append([n0 for n0, _ in rows])
            for name in ("vertex", "dual"):
                series[name].append([r[name] for _, r in rows])
            log(
                f"N2={n2}: {done}/{thermal} thermalisation sweeps ({time.perf_counter() - t0:.0f} s), "
                f"N0 {np.mean(series['n0'][-1]):.0f}, <r> vertex {np.mean(series['vertex'][-1]):.3f} "
                f"dual {np.mean(series['dual'][-1]):.3f}"
            )
    return chain, series


def _record(n2: int, t_slices: int, chains: int, thermal: int, t_therm: float, sigma_max: int, **settings) -> dict:
    """The raw record of one volume, before its measurements."""
    return {
        "n2_target": n2,
        "n_slices": t_slices,
        "chains": chains,
        "thermal_sweeps": thermal,
        "thermal_seconds": round(t_therm, 1),
        "sigma_max": sigma_max,
        "sigma_grid": np.unique(np.geomspace(2, sigma_max, 40).astype(int)).tolist(),
        **settings,
        "n2": [],
        "at_target": [],
        "mean_distance": {"vertex": [], "dual": []},
        "p": {"vertex": [], "dual": []},
        "n_nodes": {"vertex": [], "dual": []},
        "chain": [],
    }


def _measure(stepper, chain, rec: dict, m: int, total: int, gap: int, rng, steps_for, log, t0: float):
    """Measurement ``m`` of ``total``: ``gap`` sweeps (none before the first), then every chain at the target
    volume measured into ``rec`` (the others skipped: the fixed-volume ensemble). Returns the chains."""
    n2, chains = rec["n2_target"], rec["chains"]
    if m:
        chain = _advance(stepper, chain, gap)
    at = np.asarray(chain.geometry.n2) == n2
    rec["at_target"].append(int(at.sum()))
    for c in np.nonzero(at)[0]:
        geo = _chain_geometry(chain, int(c))
        rec["n2"].append(int(geo.n2))
        rec["chain"].append(int(c))
        _configuration(geo, rng, rec["origins"], rec["walk_origins"], steps_for, rec)
    k = int(at.sum())
    log(
        f"N2={n2}: measurement {m + 1}/{total} ({time.perf_counter() - t0:.0f} s), {k}/{chains} chains at the target"
        + (
            f", <r> vertex {np.mean(rec['mean_distance']['vertex'][-k:]):.3f} "
            f"dual {np.mean(rec['mean_distance']['dual'][-k:]):.3f}"
            if k
            else ""
        )
    )
    return chain


def run(
    volumes,
    chains,
    thermal,
    measurements,
    gap,
    origins,
    sigma_factor,
    mix_limit,
    seed=0,
    log=print,
    dump=None,
    walk_origins=None,
    thermal_every=0,
    eps=0.02,
):
    """Per volume: ``chains`` chains thermalised, then measured ``measurements`` times ``gap`` sweeps apart; the
    raw records (``dump`` gets them after every measurement)."""
    from ivhl_jax import cdt

    walk_origins = origins if walk_origins is None else walk_origins
    rng = np.random.default_rng(seed)
    out: list[dict] = []
    for n2 in volumes:
        t_slices = max(3, int(round(math.sqrt(n2) / 2)))
        length = max(3, n2 // (2 * t_slices))
        stepper = cdt.metropolis(cdt.LN2, eps=eps, target=float(n2), engine="host")
        keys = jax.random.split(jax.random.key(seed + n2), chains)
        chain = jax.vmap(lambda k, st=stepper, t=t_slices, ln=length, n=n2: st.init(k, t, ln, n))(keys)
        t0 = time.perf_counter()
        chain, series = _thermalise(stepper, chain, n2, thermal, thermal_every, rng, origins, log, t0)
        t_therm = time.perf_counter() - t0
        sigma_max = int(sigma_factor * math.sqrt(n2))
        settings = {"gap": gap, "origins": origins, "walk_origins": walk_origins, "seed": seed, "eps": eps}
        rec = _record(n2, t_slices, chains, thermal, t_therm, sigma_max, **settings)
        rec["thermal_series"] = series

        def steps_for(n, n2=n2, sigma_max=sigma_max):
            # N steps (past the mixing time) where affordable, else the short-time window only
            return n if n2 <= mix_limit else min(n, sigma_max)

        for m in range(measurements):
            chain = _measure(stepper, chain, rec, m, measurements, gap, rng, steps_for, log, t0)
            if dump is not None:
                dump([*out, rec])
        rec["seconds"] = round(time.perf_counter() - t0, 1)
        log(
            f"N2={n2}: T={t_slices}, <N2>={np.mean(rec['n2']):.0f}, thermalised in {t_therm:.0f} s, "
            f"<r> vertex {np.mean(rec['mean_distance']['vertex']):.2f} dual {np.mean(rec['mean_distance']['dual']):.2f}"
            f", total {rec['seconds']:.0f} s"
        )
        out.append(rec)
        if dump is not None:
            dump(out)
    return out


# correction-to-scaling forms of <r>(N) tried for d_H (each reported; none is singled out): name ->
# (model(N, *params), start values from (N, <r>)); 1/d_H is the parameter ``p``
def _forms():
    def power(n, b, p):
        return b * n**p

    def offset(n, a, b, p):
        return a + b * n**p

    def offset_sqrt(n, a, b, p, c):
        return a + b * n**p + c * n**-0.5

    def power_omega(n, b, p, c, w):
        return b * n**p * (1.0 + c * n**-w)

    return {
        "power: <r> = b N^(1/d_H)": (power, lambda x, y: (y[-1] / math.sqrt(x[-1]), 0.5)),
        "offset: <r> = a + b N^(1/d_H)": (offset, lambda x, y: (0.0, y[-1] / math.sqrt(x[-1]), 0.5)),
        "offset + 1/sqrt(N): <r> = a + b N^(1/d_H) + c N^(-1/2)": (
            offset_sqrt,
            lambda x, y: (0.0, y[-1] / math.sqrt(x[-1]), 0.5, 0.0),
        ),
        "power x (1 + c N^-omega), 0.05 <= omega <= 2": (
            power_omega,
            lambda x, y: (y[-1] / math.sqrt(x[-1]), 0.5, 0.1, 0.5),
        ),
    }


_BOUNDS = {"power_omega": ([0.0, 0.05, -np.inf, 0.05], [np.inf, 2.0, np.inf, 2.0])}


def _weighted_fit(model, start, x, y, e):
    """Least squares weighted by the standard errors ``e`` (absolute): (d_H, error, chi2/dof) or None."""
    from scipy.optimize import curve_fit

    x, y, e = np.asarray(x, float), np.asarray(y, float), np.asarray(e, float)
    k = len(start(x, y))
    if x.size <= k:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a degenerate fit shows as an infinite or huge error, reported
            par, cov = curve_fit(
                model,
                x,
                y,
                p0=start(x, y),
                sigma=e,
                absolute_sigma=True,
                maxfev=2000,
                bounds=_BOUNDS.get(model.__name__, (-np.inf, np.inf)),
            )
    except (RuntimeError, ValueError):
        return None
    i = 1 if model.__name__ in ("power", "power_omega") else 2
    p, perr = par[i], math.sqrt(max(cov[i, i], 0.0))
    chi2 = float(np.sum(((model(x, *par) - y) / e) ** 2))
    if not (np.isfinite(p) and p > 0):
        return None
    lo, hi = _BOUNDS.get(model.__name__, ([-np.inf] * len(par), [np.inf] * len(par)))
    if np.any(np.isclose(par, lo) | np.isclose(par, hi)):
        return None  # ran into a bound of the search: no fit
    # an undetermined parameter (a degenerate form) has an infinite error: reported as None
    return float(1.0 / p), (float(perr / p**2) if np.isfinite(perr) else None), chi2 / (x.size - k)


def _chain_labels(r):
    """The chain of each configuration of a record (older records: measurement-major, chain-minor order)."""
    return [str(c) for c in r.get("chain") or [j % r["chains"] for j in range(len(r["n2"]))]]


def _mean_error(samples, labels):
    """(standard error over configurations, standard error over chain means or None with < 2 chains).

    Configurations of one chain are correlated, so the first can be too small; the chain means are independent."""
    x = np.asarray(samples, float)
    se_conf = float(np.std(x, ddof=1) / math.sqrt(x.size))
    chains = sorted(set(labels))
    if len(chains) < 2:
        return se_conf, None
    means = np.asarray([x[[lab == c for lab in labels]].mean() for c in chains])
    return se_conf, float(np.std(means, ddof=1) / math.sqrt(means.size))


def _fit_ranges(vols) -> tuple[list[tuple[int, int]], int]:
    """The index ranges [k, j) of the scaling fits: N2 >= each volume (to the largest), and 4096 .. each volume
    at least four volumes further; and the index of the first volume >= 4096."""
    k4 = int(np.searchsorted(np.asarray(vols, float), 4000.0))
    ranges = {(k, len(vols)) for k in range(len(vols))} | {(k4, j) for j in range(k4 + 4, len(vols) + 1)}
    return sorted(ranges), k4


def _local_exponent(v0: float, v1: float, r0: float, r1: float, e0: float, e1: float) -> list[float]:
    """d_H = ln(v1/v0) / ln(r1/r0) between neighbouring volumes, with its error from the errors e0, e1 of <r>."""
    slope = math.log(r1 / r0) / math.log(v1 / v0)
    rel = math.hypot(e0 / r0, e1 / r1) / math.log(v1 / v0)
    return [1.0 / slope, rel / slope**2]


def _scaling_fits(vols, samples, errors=None, n_boot=200, seed=0):
    """Weighted fits of every form over the ranges N2 >= each volume (to the largest) and 4096 .. each of the
    larger volumes, weighted by ``errors`` (default: the standard errors over configurations); for the fits
    from 4096 and from the smallest volume to the largest a bootstrap over configurations (each volume's
    configurations resampled, the fit repeated) gives a second error."""
    vols = np.asarray(vols, float)
    mean = np.asarray([np.mean(s) for s in samples])
    err = np.asarray([np.std(s, ddof=1) / math.sqrt(len(s)) for s in samples] if errors is None else errors)
    ranges, k4 = _fit_ranges(vols)
    rng = np.random.default_rng(seed)
    boot = [np.asarray([np.mean(rng.choice(s, len(s))) for s in samples]) for _ in range(n_boot)]
    out: dict[str, Any] = {}
    for name, (model, start) in _forms().items():
        rows = {}
        for k, j in ranges:
            fit = _weighted_fit(model, start, vols[k:j], mean[k:j], err[k:j])
            if fit is None:
                continue
            row: dict[str, float | None] = {"d_H": fit[0], "error": fit[1], "chi2_per_dof": fit[2]}
            # (no bootstrap for the bounded four-parameter form: each of its fits is a slow bounded search)
            if (k in (0, k4)) and j == len(vols) and model.__name__ not in _BOUNDS:
                fits = [_weighted_fit(model, start, vols[k:j], b[k:j], err[k:j]) for b in boot]
                d = np.asarray([f[0] for f in fits if f])
                # a fit that ran away (far outside the bulk of the resamples) is dropped and counted
                d = d[np.abs(d - np.median(d)) < 10 * (np.percentile(d, 84) - np.percentile(d, 16)) + 1e-12]
                row["bootstrap_error"] = float(np.std(d))
                row["bootstrap_fits"] = int(d.size)
            rows[f"N2={vols[k]:.0f}..{vols[j - 1]:.0f}"] = row
        out[name] = rows
    return out


def _hausdorff(records: list[dict], vols: list[float], graph: str) -> dict[str, Any]:
    """<r> per volume on ``graph`` with its error (the larger of the standard errors over configurations and over
    chain means), the unweighted offset fits and local exponents, and the weighted fits of every form."""
    from ivhl_jax import cdt

    dist = [float(np.mean(r["mean_distance"][graph])) for r in records]
    both = [_mean_error(r["mean_distance"][graph], _chain_labels(r)) for r in records]
    derr = [max(c, ch if ch is not None else 0.0) for c, ch in both]
    fits = {}
    # <r> = a + b N2^(1/d_H) on every run of >= 4 consecutive volumes: dropping the smallest shows the
    # lattice drift, dropping the largest shows how far the largest volumes move the estimate
    for k in range(len(vols)):
        for j in range(k + 4, len(vols) + 1):
            d_h, err = cdt.hausdorff_from_scaling(vols[k:j], dist[k:j])
            fits[f"offset_fit_N2={vols[k]:.0f}..{vols[j - 1]:.0f}"] = [d_h, err]
    for k in range(len(vols) - 1):
        fits[f"local_{vols[k]:.0f}_{vols[k + 1]:.0f}"] = _local_exponent(
            vols[k], vols[k + 1], dist[k], dist[k + 1], derr[k], derr[k + 1]
        )
    return {
        "mean_distance": dist,
        "mean_distance_error": derr,
        "fits": fits,
        "mean_distance_error_configurations": [c for c, _ in both],
        "mean_distance_error_chains": [ch for _, ch in both],
        "weighted_fits": _scaling_fits(vols, [r["mean_distance"][graph] for r in records], derr),
    }


def _spectral_row(r: dict, graph: str) -> dict[str, Any]:
    """d_s(σ) of one volume's walks on ``graph``, the plateau fit with its jackknife error, and the mixing time.

    The plateau is a straight-line fit of ln P against ln σ on [N/50, N/5] (past the lattice artefacts, before
    the walk feels the finite volume) where the diffusion went that far, else on [10, sqrt(N2)]."""
    from ivhl_jax.physics.cdt import spectral

    width = min(len(row) for row in r["p"][graph])
    p = np.asarray([row[:width] for row in r["p"][graph]])  # (configs, steps + 1)
    grid = np.asarray(r["sigma_grid"])
    grid = grid[grid < p.shape[1]]
    n = np.asarray(r["n_nodes"][graph], float)
    t = np.asarray(spectral.mixing_time(p, n))
    reached = bool(np.all(np.isfinite(t)))
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
    return {
        "graph": graph,
        "n2": float(np.mean(r["n2"])),
        "sigma": res.sigma.tolist(),
        "d_s": res.d_s.tolist(),
        "error": res.error.tolist(),
        "window": [int(g[0]), int(g[-1])],
        "d_s_window_fit": [float(full), float(jerr)],
        "mixing_time": float(np.mean(t)) if reached else float("nan"),
        "mixing_time_error": float(np.std(t, ddof=1) / math.sqrt(t.size)) if reached else float("nan"),
    }


def _mixing_time_scaling(nn: list[float], mix: list[float], mix_err: list[float]) -> dict[str, list[float]]:
    """d_s from σ* ∝ N^(2/d_s): weighted power fits over every run of >= 3 volumes, and local exponents."""
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
    return fits


def analyse(records):
    """The Hausdorff results (<r> and its fits per graph) and the spectral ones (d_s(σ), plateaus, mixing times
    and d_s from their scaling per graph) of the records, one per volume."""
    vols = [float(np.mean(r["n2"])) for r in records]
    haus: dict[str, Any] = {"volumes": vols}
    spec: dict[str, Any] = {"volumes": vols, "per_volume": []}
    for graph in ("vertex", "dual"):
        haus[graph] = _hausdorff(records, vols, graph)
    for graph in ("vertex", "dual"):
        walked = [r for r in records if r["p"][graph]]  # runs with --walk-origins 0 have no walks
        rows = [_spectral_row(r, graph) for r in walked]
        spec["per_volume"] += rows
        have = [i for i, row in enumerate(rows) if np.isfinite(row["mixing_time"])]
        nn = [float(np.mean(walked[i]["n_nodes"][graph])) for i in have]
        mix = [rows[i]["mixing_time"] for i in have]
        mix_err = [rows[i]["mixing_time_error"] for i in have]
        spec[graph] = {
            "n_nodes": nn,
            "mixing_time": mix,
            "mixing_time_error": mix_err,
            "d_s_from_mixing_time_scaling": _mixing_time_scaling(nn, mix, mix_err),
        }
    return haus, spec


def _pool(records):
    """Records of one volume (same walk length) as one: configurations concatenated, schedules listed."""
    if len(records) == 1:
        return records[0]
    out = {**records[0], "n2": [], "chain": [], "runs": []}
    for key in ("mean_distance", "p", "n_nodes"):
        out[key] = {g: [x for r in records for x in r[key][g]] for g in records[0][key]}
    for i, r in enumerate(records):
        out["n2"] += r["n2"]
        out["chain"] += [f"{i}.{c}" for c in r.get("chain", [j % r["chains"] for j in range(len(r["n2"]))])]
        out["runs"].append(
            {"seed": r.get("seed", 0)}
            | {k: r[k] for k in ("chains", "thermal_sweeps", "gap", "origins", "walk_origins", "eps") if k in r}
            | {"configurations": len(r["n2"])}
        )
    out["thermal_series_runs"] = [{"seed": r.get("seed", 0), **r.get("thermal_series", {})} for r in records]
    out["chains"] = sum(r["chains"] for r in records)
    out["thermal_sweeps"] = min(r["thermal_sweeps"] for r in records)
    return out


def load_raw(paths):
    """Raw record files of earlier runs as one record per volume, sorted by volume.

    A file whose name ends in ``.gz`` is read through gzip (the raw files kept in ``bench/results/raw``).
    Where several runs measured a volume, those whose walks went furthest are used; runs with different
    seeds (independent chains) have their configurations pooled, of runs with the same seed (the same
    chains) the first file's is kept.
    """
    best: dict = {}
    for f in paths:
        data = pathlib.Path(f).read_bytes()
        for r in json.loads(gzip.decompress(data) if str(f).endswith(".gz") else data):
            steps = min((len(row) for row in r["p"]["dual"]), default=0)
            v = r["n2_target"]
            if v not in best or steps > best[v][0]:
                best[v] = (steps, [r])
            elif steps == best[v][0] and r.get("seed", 0) not in [q.get("seed", 0) for q in best[v][1]]:
                best[v][1].append(r)
    return [_pool(best[v][1]) for v in sorted(best)]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--volumes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--thermal", type=int, default=400, help="thermalisation sweeps (N2 attempts each)")
    ap.add_argument("--measurements", type=int, default=2)
    ap.add_argument("--gap", type=int, default=100, help="sweeps between measurements")
    ap.add_argument("--origins", type=int, default=4)
    ap.add_argument("--sigma-factor", type=float, default=4.0, help="sigma_max = factor * sqrt(N2)")
    ap.add_argument(
        "--mix-limit",
        type=int,
        default=16384,
        help="volumes N2 up to this diffuse N steps (past the mixing time: d_s by scaling)",
    )
    ap.add_argument(
        "--eps",
        type=float,
        default=0.02,
        help="volume term eps (N2 - target)^2: larger puts more measurements at the target (same law there)",
    )
    ap.add_argument("--seed", type=int, default=0, help="chains use keys seed + N2; origins rng(seed)")
    ap.add_argument(
        "--walk-origins",
        type=int,
        default=None,
        help="origins (of the --origins BFS origins) diffused by the walk; 0: no walk (default: all)",
    )
    ap.add_argument(
        "--thermal-every",
        type=int,
        default=0,
        help="record N0 and <r> of every chain every this many thermalisation sweeps (0: never)",
    )
    ap.add_argument("--raw", default=None, help="also dump the raw records to this JSON file (after each measurement)")
    ap.add_argument(
        "--name",
        default="cdt",
        help="results files bench/results/<name>_hausdorff_scaling.json and <name>_spectral_dimension.json",
    )
    ap.add_argument(
        "--from-raw",
        nargs="+",
        default=None,
        help="analyse raw record files of earlier runs (concatenated, sorted by volume) instead of running",
    )
    ap.add_argument(
        "--run-command",
        action="append",
        default=[],
        help="with --from-raw: the command of each run that wrote them (recorded in the results)",
    )
    ap.add_argument(
        "--compare",
        default=None,
        help="the name (prefix) of earlier results files in bench/results: each volume measured in both gets its "
        "<r>, local exponents and d_s plateaus (same sigma window) old and new with z (recorded as compared_with)",
    )
    ap.add_argument(
        "--combine",
        nargs="+",
        default=None,
        help="names (prefixes) of earlier results files in bench/results whose <r> per volume join this run's for "
        "local exponents and weighted fits over all their volumes (recorded as combined_with; with --compare, the "
        "fits over the ranges the compared file also fitted, old and new with z)",
    )
    ap.add_argument("--note", default=None, help="a note recorded in the results (what was and was not measured)")
    return ap


def _z(new: float, new_err: float, old: float, old_err: float) -> float:
    return (new - old) / math.hypot(new_err, old_err)


def _compared_with(name: str, haus: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """What moved against the earlier results ``bench/results/<name>_*.json``: per volume measured in both, <r>
    (with the errors of each file), the local exponents between neighbouring volumes of both, and the d_s
    plateau fits over the same sigma window; new - old over the combined error as ``z``."""
    old_h = json.loads((RESULTS / f"{name}_hausdorff_scaling.json").read_text())
    old_s = json.loads((RESULTS / f"{name}_spectral_dimension.json").read_text())
    out: dict[str, Any] = {"files": f"bench/results/{name}_*.json", "commit": old_h["provenance"]["commit"]}
    both = [v for v in haus["volumes"] if v in old_h["volumes"]]
    for graph in ("vertex", "dual"):
        rows: dict[str, Any] = {}
        for v in both:
            i, j = haus["volumes"].index(v), old_h["volumes"].index(v)
            new = (haus[graph]["mean_distance"][i], haus[graph]["mean_distance_error"][i])
            old = (old_h[graph]["mean_distance"][j], old_h[graph]["mean_distance_error"][j])
            rows[f"{v:.0f}"] = {"new": list(new), "old": list(old), "z": _z(*new, *old)}
        out[f"mean_distance_{graph}"] = rows
        old_fits = old_h[graph]["fits"]
        out[f"local_exponents_{graph}"] = {
            k: {"new": f, "old": old_fits[k], "z": _z(*f, *old_fits[k])}
            for k, f in haus[graph]["fits"].items()
            if k.startswith("local_") and k in old_fits
        }
    old_rows = {(r["graph"], r["n2"], tuple(r["window"])): r for r in old_s["per_volume"]}
    plateaus = {}
    for r in spec["per_volume"]:
        o = old_rows.get((r["graph"], r["n2"], tuple(r["window"])))
        if o is not None:
            plateaus[f"{r['graph']} {r['n2']:.0f} sigma {r['window'][0]}..{r['window'][1]}"] = {
                "new": r["d_s_window_fit"],
                "old": o["d_s_window_fit"],
                "z": _z(*r["d_s_window_fit"], *o["d_s_window_fit"]),
            }
    out["d_s_plateaus_same_window"] = plateaus
    return out


def _combined(names: list[str], haus: dict[str, Any], compare: str | None = None) -> dict[str, Any]:
    """<r> of this run together with the earlier results ``bench/results/<name>_hausdorff_scaling.json`` of each of
    ``names`` (a volume in several: this run's, else the last file's), the local exponents between neighbouring
    volumes and the weighted fits of every form over the ranges of :func:`_fit_ranges` (weighted by each file's
    errors of <r>; no bootstrap: the files keep no configurations). With ``compare``, each fit whose range the
    results ``<compare>_hausdorff_scaling.json`` also fitted, old and new with z (``weighted_fits_same_range``)."""
    files = {n: json.loads((RESULTS / f"{n}_hausdorff_scaling.json").read_text()) for n in names}
    old = json.loads((RESULTS / f"{compare}_hausdorff_scaling.json").read_text()) if compare else None
    out: dict[str, Any] = {"files": [f"bench/results/{n}_hausdorff_scaling.json" for n in names]}
    out["commits"] = {n: f["provenance"]["commit"] for n, f in files.items()}
    for graph in ("vertex", "dual"):
        points: dict[float, tuple[float, float, str]] = {}
        for n, f in [*files.items(), ("this run", haus)]:
            for v, r, e in zip(f["volumes"], f[graph]["mean_distance"], f[graph]["mean_distance_error"]):
                points[float(v)] = (float(r), float(e), n)
        vols = sorted(points)
        r, e, src = (list(x) for x in zip(*(points[v] for v in vols)))
        local = {
            f"local_{vols[k]:.0f}_{vols[k + 1]:.0f}": _local_exponent(
                vols[k], vols[k + 1], *r[k : k + 2], *e[k : k + 2]
            )
            for k in range(len(vols) - 1)
        }
        fits: dict[str, Any] = {}
        for form, (model, start) in _forms().items():
            rows = {}
            for k, j in _fit_ranges(vols)[0]:
                fit = _weighted_fit(model, start, vols[k:j], r[k:j], e[k:j])
                if fit is not None:
                    rows[f"N2={vols[k]:.0f}..{vols[j - 1]:.0f}"] = {
                        "d_H": fit[0],
                        "error": fit[1],
                        "chi2_per_dof": fit[2],
                    }
            fits[form] = rows
        block: dict[str, Any] = {"volumes": vols, "mean_distance": r, "mean_distance_error": e, "source": src}
        block |= {"local_exponents": local, "weighted_fits": fits}
        if old is not None:
            same = {}
            for form, rows in fits.items():
                for rng, row in rows.items():
                    o = old[graph]["weighted_fits"].get(form, {}).get(rng)
                    if o is not None and row["error"] is not None and o["error"] is not None:
                        new_fit, old_fit = (row["d_H"], row["error"]), (o["d_H"], o["error"])
                        same[f"{form} {rng}"] = {
                            "new": list(new_fit),
                            "old": list(old_fit),
                            "z": _z(*new_fit, *old_fit),
                        }
            block["weighted_fits_same_range"] = same
        out[graph] = block
    return out


def _meta(records: list[dict], command: str, run_commands: list[str]) -> dict[str, Any]:
    """What the results files say besides the fits: the command (and the runs'), the engine and rule, each
    volume's schedule, and the thermalisation series (N0 and <r>, mean over a run's chains, per block)."""
    meta: dict[str, Any] = {"command": command}
    if run_commands:
        meta["runs"] = run_commands
    # records written before eps was a setting ran at 0.02
    eps = sorted({e for r in records for e in [r.get("eps", 0.02)] + [q.get("eps", 0.02) for q in r.get("runs", [])]})
    meta["engine"] = (
        f"host (list proposals), eps = {' / '.join(f'{e:g}' for e in eps)}, lambda = ln 2, sweeps of N2 attempts; "
        "configurations: the chains at N2 = target at each measurement"
    )
    meta["per_volume_schedule"] = [
        {
            "n2": r["n2_target"],
            "n_slices": r["n_slices"],
            "chains": r["chains"],
            "thermal_sweeps": r["thermal_sweeps"],
            "configurations": len(r["n2"]),
            "gap": r.get("gap"),
            "origins": r.get("origins"),
            "walk_origins": r.get("walk_origins", r.get("origins")),
            "eps": r.get("eps", 0.02),
            "walk_steps": {g: min((len(q) for q in r["p"][g]), default=1) - 1 for g in r["p"]},
        }
        | ({"runs": r["runs"]} if "runs" in r else {})
        for r in records
    ]
    series = {
        str(r["n2_target"]): [
            {
                "seed": t.get("seed", 0),
                "sweeps": t["sweeps"],
                **{k: [float(np.mean(v)) for v in t[k]] for k in ("n0", "vertex", "dual")},
            }
            for t in r.get("thermal_series_runs", [{"seed": r.get("seed", 0), **r.get("thermal_series", {})}])
            if t.get("sweeps")
        ]
        for r in records
    }
    meta["thermalisation_series"] = {k: v for k, v in series.items() if v}
    return meta


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    command = "python -m bench.studies.cdt_dimensions " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.from_raw:
        command = "python -m bench.studies.cdt_dimensions --from-raw " + " ".join(args.from_raw)
        command += (f" --name {args.name}" if args.name != "cdt" else "") + (
            f" --compare {args.compare}" if args.compare else ""
        )
        command += f" --combine {' '.join(args.combine)}" if args.combine else ""
        records = load_raw(args.from_raw)
    else:

        def dump(recs):
            if args.raw:
                pathlib.Path(args.raw).write_text(json.dumps(recs))

        records = run(
            args.volumes,
            args.chains,
            args.thermal,
            args.measurements,
            args.gap,
            args.origins,
            args.sigma_factor,
            args.mix_limit,
            log=lambda s: print(s, flush=True),
            dump=dump,
            walk_origins=args.walk_origins,
            thermal_every=args.thermal_every,
            seed=args.seed,
            eps=args.eps,
        )
    haus, spec = analyse(records)
    meta = _meta(records, command, args.run_command)
    if args.note:
        meta["note"] = args.note
    if args.compare:
        meta["compared_with"] = _compared_with(args.compare, haus, spec)
    if args.combine:
        meta["combined_with"] = _combined(args.combine, haus, args.compare)
    from ivhl_jax.bench.harness import write_results

    write_results(RESULTS / f"{args.name}_hausdorff_scaling.json", {**meta, **haus}, command=command)
    spec_meta = {
        **meta,
        "walk": "lazy random walk, stay probability 1/2, exact diffusion per origin",
        "d_s_error": "jackknife over configurations",
    }
    write_results(RESULTS / f"{args.name}_spectral_dimension.json", {**spec_meta, **spec}, command=command)
    print(
        json.dumps(
            {
                "hausdorff": {g: haus[g]["fits"] for g in ("vertex", "dual")},
                "spectral": {g: spec[g]["d_s_from_mixing_time_scaling"] for g in ("vertex", "dual")},
                "plateau": [(r["graph"], r["n2"], r["d_s_window_fit"]) for r in spec["per_volume"]],
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
