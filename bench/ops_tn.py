"""Benchmarks for ivhl_jax.physics.tn and .mera: network contraction, one MERA sweep at χ = 4, 8, 12 (16).

* ``tn_contract``: the seven-tensor contraction of one ascending-superoperator term (the MERA's dominant
  network) via :func:`ivhl_jax.physics.tn.contract` (cached optimal path); peer: NumPy ``einsum`` with the same path.
* ``mera_sweep``: one full Evenbly–Vidal sweep (steady state, descend, 3 environments + SVD updates per layer,
  ascend) of a 2-transitional-layer modified binary MERA.
* the machine's matmul ceiling to compare GFLOP/s against is ``matmul_peak_f32`` (``bench/ops_machine.py``).

FLOP counts: opt_einsum's path cost for ``tn_contract``; XLA's ``cost_analysis`` of the compiled sweep for
``mera_sweep``; 2n³ for the matmul. Float32 (the library's default dtype; the MERA drivers use float64).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.bench.harness import BenchCase
from ivhl_jax.physics import mera as M
from ivhl_jax.physics import tn

_CHI = {"small": 4, "medium": 8, "large": 12, "extreme": 16}
_SPEC = "ekr,fckl,lds,efab,aip,bcij,jdq->rspq"


def _contract_case(size: str) -> BenchCase:
    chi = _CHI[size]
    key = jax.random.split(jax.random.key(0), 7)
    shapes = [(chi, chi, chi), (chi,) * 4, (chi, chi, chi), (chi,) * 4, (chi, chi, chi), (chi,) * 4, (chi, chi, chi)]
    args = tuple(jax.random.normal(k, s, jnp.float32) for k, s in zip(key, shapes))
    path, flops = tn.contraction_path(_SPEC, *shapes)

    def numpy_peer():
        nargs = [np.asarray(a) for a in args]
        return lambda: np.einsum(_SPEC, *nargs, optimize=["einsum_path", *path])

    return BenchCase(op="tn_contract", size=size, fn=lambda *t: tn.contract(_SPEC, *t), args=args,
                     params={"chi": chi, "subscripts": _SPEC, "path": path}, flops=flops,
                     peers={"numpy": numpy_peer}, notes="ascending-superoperator term, optimal path cached")


def _sweep_case(size: str) -> BenchCase:
    chi = _CHI[size]
    cfg = M.MERAConfig(chi=chi, layers=2, u_delay=0)
    st = M.evenbly_vidal(M.ising(), cfg, dtype=jnp.float32)
    state = st.init(key=jax.random.key(0))
    return BenchCase(op="mera_sweep", size=size, fn=st.step_fn, args=(state, st.params),
                     params={"chi": chi, "chi_mid": cfg.mid, "transitional_layers": cfg.layers,
                             "si_scales": cfg.si_scales, "power_iters": cfg.power_iters},
                     op_by_op=chi <= 8, items_per_call=1, items_name="sweeps",
                     notes="float32; flops from XLA cost_analysis (SVDs/eigh counted as XLA reports them)")


OPS = {"tn_contract": _contract_case, "mera_sweep": _sweep_case}
