"""CDT benchmarks: Metropolis attempts per second for one chain and for many vmapped chains.

Op ``cdt_sweeps``: volume-fixed 1+1D CDT (T = 16, target N2 = 512, lambda = ln 2, eps = 0.02),
``SWEEPS`` sweeps of N2 attempts for a batch of independent chains; the size picks the number of
chains (small 1, medium 16, large 128, extreme 1024). Peer: the same algorithm as a sequential
pure-Python loop over Python lists (the natural host-side implementation), one chain.

``python -m ivhl_jax.bench.ops_cdt [--chains 1,4,16,64,256] [--export FILE]`` measures the scaling
with the number of chains and counts *accepted* moves (per chain and in aggregate).
"""

from __future__ import annotations

import argparse
import math
import random
import time

import jax
import numpy as np

from ivhl_jax.bench.harness import BenchCase, summarize
from ivhl_jax.physics import cdt

T_SLICES, VOLUME, SWEEPS = 16, 512, 2
CHAINS = {"small": 1, "medium": 16, "large": 128, "extreme": 1024}


def _setup(n_chains: int):
    params = cdt.make_params(cdt.LN2, eps=0.02, target=VOLUME, attempts_per_sweep=VOLUME)
    states = cdt.replicate(cdt.initial_state(T_SLICES, VOLUME // (2 * T_SLICES), capacity=2 * VOLUME), n_chains)

    def fn(key, states):
        final, _ = cdt.run_chains(key, states, params, SWEEPS, SWEEPS)
        return final

    return fn, (jax.random.PRNGKey(0), states), params


def python_peer(n_attempts: int, seed: int = 0):
    """The same Metropolis chain (flip 1/2, add 1/4, delete 1/4; same acceptances) in plain Python.

    Returns a zero-argument callable running ``n_attempts`` attempts on a fresh copy; it returns
    the accept counts (flip, add, delete).
    """
    s0 = jax.device_get(cdt.initial_state(T_SLICES, VOLUME // (2 * T_SLICES), capacity=2 * VOLUME))
    lam, eps, target = cdt.LN2, 0.02, float(VOLUME)

    def run():
        ttype, ttime, tl, tr, tc = (list(map(int, a)) for a in (s0.ttype, s0.ttime, s0.tl, s0.tr, s0.tc))
        tv = [list(map(int, row)) for row in s0.tv]
        vtime, vtu = list(map(int, s0.vtime)), list(map(int, s0.vtu))
        tperm, tpos, vperm, vpos = (list(map(int, a)) for a in (s0.tperm, s0.tpos, s0.vperm, s0.vpos))
        lengths = list(map(int, s0.lengths))
        n2, n0 = int(s0.n2), int(s0.n0)
        rng = random.Random(seed)
        acc = [0, 0, 0]

        def bag_remove(perm, pos, n, x):
            i, last = pos[x], perm[n - 1]
            perm[i], perm[n - 1] = last, x
            pos[last], pos[x] = i, n - 1

        def ds(dn2):
            return lam * dn2 + eps * ((n2 + dn2 - target) ** 2 - (n2 - target) ** 2)

        for _ in range(n_attempts):
            m, c, a = rng.random(), rng.random(), rng.random()
            if m < 0.5:
                t1 = tperm[int(c * n2)]
                t2 = tr[t1]
                if ttype[t1] == ttype[t2]:
                    continue
                fl, fr = tl[t1], tr[t2]
                vc1, vc2 = tv[t2][1], tv[t1][0]
                tr[fl], tr[t2], tr[t1] = t2, t1, fr
                tl[t2], tl[t1], tl[fr] = fl, t2, t1
                tv[t1][2], tv[t2][2] = vc1, vc2
                acc[0] += 1
            elif m < 0.75:
                if math.log(max(a, 1e-38)) >= -ds(2) + math.log(n0 / (n0 + 1)):
                    continue
                t = tperm[int(c * n2)]
                u = t if ttype[t] == cdt.UP else tc[t]
                d = tc[u]
                x, y = tr[u], tr[d]
                b, cc, dd = tv[u][1], tv[u][2], tv[d][2]
                u2, d2, v = tperm[n2], tperm[n2 + 1], vperm[n0]
                tr[u], tr[u2], tr[d], tr[d2] = u2, x, d2, y
                tl[u2], tl[x], tl[d2], tl[y] = u, u2, d, d2
                tc[u2], tc[d2] = d2, u2
                tv[u][1] = tv[d][1] = v
                tv[u2], tv[d2] = [v, b, cc], [v, b, dd]
                ttype[u2], ttype[d2] = cdt.UP, cdt.DOWN
                ttime[u2], ttime[d2] = ttime[u], ttime[d]
                vtime[v], vtu[v] = ttime[u], u2
                lengths[ttime[u]] += 1
                n2, n0 = n2 + 2, n0 + 1
                acc[1] += 1
            else:
                v = vperm[int(c * n0)]
                u2 = vtu[v]
                u, d2 = tl[u2], tc[u2]
                d = tl[d2]
                if ttype[u] != cdt.UP or ttype[d] != cdt.DOWN or lengths[vtime[v]] <= 3:
                    continue
                if math.log(max(a, 1e-38)) >= -ds(-2) + math.log(n0 / (n0 - 1)):
                    continue
                x, y, b = tr[u2], tr[d2], tv[u2][1]
                tr[u], tr[d], tl[x], tl[y] = x, y, u, d
                tv[u][1] = tv[d][1] = b
                lengths[vtime[v]] -= 1
                bag_remove(tperm, tpos, n2, u2)
                bag_remove(tperm, tpos, n2 - 1, d2)
                bag_remove(vperm, vpos, n0, v)
                n2, n0 = n2 - 2, n0 - 1
                acc[2] += 1
        return acc

    return run


def _factory(size: str) -> BenchCase:
    n = CHAINS[size]
    fn, args, params = _setup(n)
    attempts = n * SWEEPS * params.attempts_per_sweep
    return BenchCase(
        op="cdt_sweeps", size=size, fn=fn, args=args,
        params={"chains": n, "T": T_SLICES, "target_N2": VOLUME, "lambda": cdt.LN2, "eps": 0.02,
                "sweeps": SWEEPS, "attempts_per_chain": SWEEPS * params.attempts_per_sweep},
        peers={"python_loop_1chain": lambda: python_peer(SWEEPS * params.attempts_per_sweep)},
        op_by_op=False, items_per_call=attempts, items_name="move attempts (all chains)",
        notes="peer runs ONE chain sequentially; compare per-chain rates. Accepted moves: see cdt_scaling.json",
    )


OPS = {"cdt_sweeps": _factory}


def scaling(chain_counts=(1, 4, 16, 64, 256), repeats: int = 5) -> dict:
    """Accepted and attempted moves per second, per chain and aggregate, vs the number of vmapped chains."""
    from ivhl_jax.run.device import device_report

    rows = []
    for n in chain_counts:
        fn, (key, states), params = _setup(n)
        compiled = jax.jit(fn).lower(key, states).compile()
        times, accepted = [], []
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            final = jax.block_until_ready(compiled(jax.random.PRNGKey(r), states))
            if r:  # the first call is a warm-up
                times.append(time.perf_counter() - t0)
                accepted.append(int(np.asarray(final.accepts).sum()))
        stats = summarize(times)
        att = n * SWEEPS * params.attempts_per_sweep
        acc = float(np.mean(accepted))
        rows.append({"chains": n, "attempts_per_call": att, "accepted_per_call": acc, "time": stats,
                     "attempts_per_s_aggregate": att / stats["median_s"],
                     "accepted_per_s_aggregate": acc / stats["median_s"],
                     "accepted_per_s_per_chain": acc / n / stats["median_s"],
                     "acceptance": acc / att})
        print(f"chains {n:5d}: {acc / stats['median_s']:.3e} accepted/s aggregate, "
              f"{acc / n / stats['median_s']:.3e} per chain (median {stats['median_s'] * 1e3:.1f} ms)")
    peer = python_peer(SWEEPS * VOLUME)
    t0 = time.perf_counter()
    pacc = sum(peer())
    tpeer = time.perf_counter() - t0
    return {"op": "cdt_scaling", "environment": device_report(),
            "system": {"T": T_SLICES, "target_N2": VOLUME, "lambda": cdt.LN2, "eps": 0.02, "sweeps": SWEEPS},
            "rows": rows,
            "python_loop_peer_1chain": {"time_s": tpeer, "accepted": pacc, "accepted_per_s": pacc / tpeer},
            "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv=None) -> int:
    from ivhl_jax.run.io import write_json

    p = argparse.ArgumentParser(description="CDT chain-scaling benchmark")
    p.add_argument("--chains", default="1,4,16,64,256")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--export", default="bench/results/cdt_scaling.json")
    a = p.parse_args(argv)
    doc = scaling(tuple(int(c) for c in a.chains.split(",")), a.repeats)
    print("wrote", write_json(a.export, doc))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
