"""Before/after timings of the range-checked sincos and the GP default step, interleaved in one process.

    python -m bench.studies.defaults_fields_gp --against REV --rounds 21 --out bench/results/fields_gp_defaults_cpu.json

loads ``ivhl_jax/numerics/fastmath.py`` and ``ivhl_jax/numerics/splitstep.py`` of ``<rev>`` (``git show``) next to
the current ones and times, in interleaved rounds (``bench.harness.interleaved_rounds``):

* ``point_source_sum`` (the kernel of ``fields.superpose``) at 8192 × 50 and 65536 × 256, default block size;
* the GP real-time multi-step path (``condensate.strang`` default: range-checked kicks, norm restored per block)
  against ``<rev>``'s ``strang_run`` with its sincos, on 1D 4096, 2D 256² and 3D 64³ (g = 100, dt = 1e-3).

Reports per-round ratios new/old (median and quartiles) and the largest difference of the results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from bench.harness import before_after_setup, before_after_study, blocking_call
from ivhl_jax.numerics import fastmath as new_fm
from ivhl_jax.numerics import splitstep
from ivhl_jax.physics import condensate as C
from ivhl_jax.physics import fields
from ivhl_jax.physics.condensate import stepper as S


def main() -> None:
    a, old = before_after_setup(
        {"fastmath_before": "ivhl_jax/numerics/fastmath.py", "splitstep_before": "ivhl_jax/numerics/splitstep.py"},
        rounds=21,
    )
    old_fm, old_ss = old["fastmath_before"], old["splitstep_before"]
    old_ss.sincos = old_fm.sincos
    calls: dict[str, Callable[[], Any]] = {}
    meta: dict[str, dict[str, Any]] = {}
    rng = np.random.default_rng(0)
    for n, m in ((8192, 50), (65536, 256)):
        pts = jax.numpy.asarray(rng.uniform(-2, 2, (n, 3)), jax.numpy.float32)
        src = fields.helix_sources(m)
        amp = jax.numpy.ones(m, jax.numpy.float32)
        k = jax.numpy.full(m, 8.0, jax.numpy.float32)
        th = jax.numpy.asarray(rng.uniform(-1, 1, m) - 24.0, jax.numpy.float32)
        chunk = fields.default_chunk(m)
        outs = {}
        for tag, mod in (("old", old_fm), ("new", new_fm)):
            f = jax.jit(lambda *x, mod=mod, chunk=chunk: mod.point_source_sum(*x, 0.1, chunk=chunk))
            args = (pts, src, amp, k, th)
            outs[tag] = np.asarray(jax.block_until_ready(f(*args))[0])
            calls[f"superpose {n}x{m} {tag}"] = blocking_call(f, *args)
        meta[f"superpose {n}x{m}"] = {"max_abs_diff_re": float(np.abs(outs["new"] - outs["old"]).max())}
    for shape, length, steps in (((4096,), 200.0, 200), ((256, 256), 20.0, 40), ((64, 64, 64), 20.0, 10)):
        grid = C.Grid.uniform(shape, length)
        system = C.GPSystem.create(grid, C.harmonic(grid), 100.0)
        st = C.strang(system, 1e-3)
        psi = st.init(C.gaussian(grid, 1.0))

        def old_run(q, p, n=steps):
            return old_ss.strang_run(
                q,
                S.local_energy(p.system),
                lambda x: splitstep.kinetic(x, p.plan),
                p.dt,
                n,
            )

        f_old = jax.jit(old_run)
        f_new = jax.jit(lambda q, p, n=steps, run=st.run_fn: run(q, p, n))
        for tag, f in (("old", f_old), ("new", f_new)):
            jax.block_until_ready(f(psi, st.params))
            calls[f"gp {shape} {tag}"] = blocking_call(f, psi, st.params)
        meta[f"gp {shape}"] = {"steps_per_call": steps}
    before_after_study(calls, meta, rounds=a.rounds, against=a.against, out=a.out)


if __name__ == "__main__":
    main()
