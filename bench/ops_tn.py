"""Benchmarks for ivhl_jax.physics.tensornet.tn and .mera: network contraction, one MERA sweep at χ = 4, 8, 12 (16).

* ``tn_contract``: the seven-tensor contraction of one ascending-superoperator term (the MERA's dominant
  network) via :func:`ivhl_jax.physics.tensornet.tn.contract` (cached optimal path); peer: NumPy ``einsum`` with the
  same path.
* ``mera_sweep``: one full Evenbly–Vidal sweep (steady state, descend, 3 environments + SVD updates per layer,
  ascend) of a 2-transitional-layer modified binary MERA.
* the machine's matmul ceiling to compare GFLOP/s against is ``matmul_peak_f32`` (``bench/ops_machine.py``).

FLOP counts: opt_einsum's path cost for ``tn_contract``; XLA's ``cost_analysis`` of the compiled sweep for
``mera_sweep``; 2n³ for the matmul. Float32 (the library's default dtype; the MERA drivers use float64).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.bench.harness import BenchCase
from ivhl_jax.core import backend
from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics.tensornet import mera as M
from ivhl_jax.physics.tensornet import tn
from ivhl_jax.run.measure import cost_record

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

    return BenchCase(
        op="tn_contract",
        size=size,
        fn=lambda *t: tn.contract(_SPEC, *t),
        args=args,
        params={"chi": chi, "subscripts": _SPEC, "path": path},
        flops=flops,
        peers={"numpy": numpy_peer},
        notes="ascending-superoperator term, optimal path cached",
    )


def _sweep_case(size: str) -> BenchCase:
    chi = _CHI[size]
    cfg = M.MERAConfig(chi=chi, layers=2, u_delay=0)
    st = M.evenbly_vidal(M.ising(), cfg, policy="f32")
    state = st.init(jax.random.key(0))
    return BenchCase(
        op="mera_sweep",
        size=size,
        fn=st.step_fn,
        args=(state, st.params),
        params={
            "chi": chi,
            "chi_mid": cfg.mid,
            "transitional_layers": cfg.layers,
            "si_scales": cfg.si_scales,
            "power_iters": cfg.power_iters,
        },
        op_by_op=chi <= 8,
        items_per_call=1,
        items_name="sweeps",
        notes="float32; flops from XLA cost_analysis (SVDs/eigh counted as XLA reports them)",
    )


OPS = {"tn_contract": _contract_case, "mera_sweep": _sweep_case}


def _sweep_shape(chi: int) -> M.MERAConfig:
    """The MERA a χ sweep is timed on: χ ≤ 16 fits one transitional layer above the d² = 16 bottom; above, the bottom
    carries 16 and a second layer reaches χ (χ above the layers: 16, χ, χ); χ_mid ≈ ¾ χ."""
    mid = max(2, (3 * chi) // 4)
    if chi <= 16:
        return M.MERAConfig(chi=chi, chi_mid=mid, layers=1, u_delay=0)
    return M.MERAConfig(chi=(16, chi, chi), chi_mid=(4, min(mid, 16), mid), layers=2, u_delay=0)


def _time_sweeps(cfg: M.MERAConfig, dtype: Any, sweeps: int, repeats: int) -> dict[str, Any]:
    """Compile time and median ms per sweep of ``sweeps`` Evenbly–Vidal sweeps (one ``trajectory``: one compiled
    program, no host round trip inside it) on a cold start of ``cfg`` in ``dtype``."""
    with jax.enable_x64(True):
        st = M.evenbly_vidal(M.ising(), cfg, policy="f32" if jnp.dtype(dtype) == jnp.float32 else "f64")
        s0 = st.init(jax.random.key(0))
        t0 = time.perf_counter()
        # compiled ahead of time: the same program trajectory() runs, kept for its cost_analysis() (the roofline)
        run = jax.jit(lambda s: trajectory(st, s, sweeps, observe=M.observe)).lower(s0).compile()
        s, e = run(s0)
        jax.block_until_ready(e)
        first = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            s, e = run(s)
            jax.block_until_ready(e)
            times.append(time.perf_counter() - t0)
        ms = 1e3 * float(np.median(times)) / sweeps
        iso = max(M.isometry_errors(s.mera).values())
    return {
        "chi": cfg.top_chi,
        "layer_chis": list(s.mera.chis),
        "layer_chi_mids": list(s.mera.chi_mids),
        "dtype": jnp.dtype(dtype).name,
        "sweeps_timed": sweeps,
        "compile_s": round(first - ms * sweeps / 1e3, 3),
        "ms_per_sweep": round(ms, 3),
        "isometry_error": iso,
        "cost": cost_record(run, float(np.median(times)), dtype="f32" if jnp.dtype(dtype) == jnp.float32 else "f64"),
    }


def ladder_stages(
    model: Any, stages: list[tuple[Any, int]], key: int = 0, log: Any = None, report_every: int = 0, start: Any = None
):
    """Run a bond-dimension ladder ``[(MERAConfig, steps), ...]`` of ``model`` in float64: a cold start checked for
    stuck starts (when the first stage reaches the check) or the MERA ``start``, then :func:`mera.grow` into each
    stage's configuration. Yields ``(k, mera, energies)`` after each stage (energies per sweep of the stage). With
    ``report_every`` > 0 the sweeps run in pieces of that many and each piece's energy error goes to ``log``
    (call inside ``jax.enable_x64(True)``)."""
    mera = start
    for k, (cfg, steps) in enumerate(stages):
        st = M.evenbly_vidal(model, cfg)
        t0 = time.perf_counter()
        first = np.zeros((0,))
        if mera is None:
            if steps >= M.StuckCheck.after:
                state, first, _ = M.cold_start(st, jax.random.key(key), model.e0, 50, log=log, limit=steps)
            else:
                state = st.init(jax.random.key(key))
        else:
            state = st.init(
                mera=M.grow(
                    mera,
                    jax.random.fold_in(jax.random.key(key), k),
                    cfg.chi,
                    cfg.chi_mid,
                    layers=cfg.layers,
                    refsym=cfg.refsym,
                )
            )
        energies = [first]
        rest = steps - first.shape[0]
        while rest > 0:
            n = min(report_every, rest) if report_every > 0 else rest
            state, e = trajectory(st, state, n, observe=M.observe)
            energies.append(np.asarray(e))
            rest -= n
            if report_every > 0 and log is not None:
                log(
                    f"chi={cfg.chi}: {steps - rest}/{steps} sweeps, energy error {float(e[-1]) - model.e0:.3e} "
                    f"({time.perf_counter() - t0:.0f} s)"
                )
        mera = state.mera
        yield k, mera, np.concatenate(energies)


def _ladder(stages: list[tuple[int, int, int]], key: int = 0) -> dict[str, Any]:
    """A float64 Ising ladder ``[(chi, chi_mid, steps), ...]`` (:func:`ladder_stages`), every compilation included
    in the clock: energy error and Δσ after each stage."""
    out = []
    t0 = time.perf_counter()
    configs = []
    for k, (chi, mid, steps) in enumerate(stages):
        layers = 1 if len(stages) < 3 else min(1 + k, 3)
        # u_delay=0 as in the timed sweeps (a quick run reuses their compiled program for its first stage)
        if chi > 16:  # the bottom carries 16 (d²); a second layer reaches χ
            cfg = M.MERAConfig(chi=(16, chi, chi), chi_mid=(4, min(mid, 16), mid), layers=2, u_delay=0)
        else:
            cfg = M.MERAConfig(chi=chi, chi_mid=mid, layers=layers, u_delay=0)
        configs.append((cfg, steps))
    with jax.enable_x64(True):
        for k, mera, e in ladder_stages(M.ising(), configs, key):
            out.append(
                {
                    "chi": stages[k][0],
                    "layer_chis": list(mera.chis),
                    "steps": stages[k][2],
                    "energy_error": float(e[-1]) - M.E0_CRITICAL_ISING,
                    "delta_sigma": float(M.scaling_dimensions(mera, 2)[1]),
                    "elapsed_s": round(time.perf_counter() - t0, 2),
                }
            )
    total = round(time.perf_counter() - t0, 2)
    # the conformal data of the last stage (outside the ladder's clock): OPE C_σσε and the central charge
    t1 = time.perf_counter()
    conformal: dict[str, Any] = {}
    with jax.enable_x64(True):
        try:
            conformal["C_σσε"] = M.ope_coefficients(mera, "ising")["C_σσε"]["measured"]
        except ValueError as exc:  # a MERA too rough for its operators to match (the quick run): said
            conformal["ope_error"] = str(exc)[:200]
        conformal["c"] = M.central_charge(mera, M.ising())["c"]
    conformal["seconds"] = round(time.perf_counter() - t1, 2)
    return {"stages": out, "total_s": total, "conformal": conformal}


def gpu_check(quick: bool) -> dict[str, Any]:
    """MERA sweeps and one ladder for ``bench/gpu_checks.py``: ms per sweep and compile time at χ = 16, 24, 32
    (float32 and float64; χ_mid ≈ ¾ χ; above χ = 16 the bond dimension per layer is 16, χ, χ) and a float64 Ising
    ladder χ = 8 → 16 → 24 with its energy error and Δσ per stage, then the last stage's C_σσε and central charge
    (:mod:`ivhl_jax.physics.tensornet.mera.conformal`). ``quick``: χ = 2 and a 2 → 3 ladder of one
    sweep (CPU-sized, for the test). Returns the records and a ``summary`` (one line per record)."""
    chis = (2,) if quick else (16, 24, 32)
    sweeps, repeats = (1, 1) if quick else (10, 3)
    doc: dict[str, Any] = {"platform": backend.platform(), "device": str(jax.devices()[0]), "sweeps": []}
    summary = []
    for chi in chis:
        for dtype in (jnp.float32, jnp.float64):
            try:
                rec = _time_sweeps(_sweep_shape(chi), dtype, sweeps, repeats)
            except Exception as exc:  # noqa: BLE001 - a failing size is recorded, the check goes on
                rec = {"chi": chi, "dtype": jnp.dtype(dtype).name, "error": f"{type(exc).__name__}: {exc}"[:300]}
            doc["sweeps"].append(rec)
            summary.append(
                f"sweep chi={chi} {rec['dtype']}: "
                + (
                    f"{rec['ms_per_sweep']:.2f} ms/sweep, compile {rec['compile_s']:.1f} s"
                    if "error" not in rec
                    else rec["error"]
                )
            )
    stages = [(2, 2, 1), (3, 2, 1)] if quick else [(8, 6, 1000), (16, 12, 600), (24, 16, 400)]
    try:
        doc["ladder"] = _ladder(stages)
        last = doc["ladder"]["stages"][-1]
        conf = doc["ladder"]["conformal"]
        ope = f"C_σσε {conf['C_σσε']:.4f}" if "C_σσε" in conf else "C_σσε not extracted"
        summary.append(
            f"ladder to chi={last['chi']}: energy error {last['energy_error']:.2e}, Δσ "
            f"{last['delta_sigma']:.5f}, {doc['ladder']['total_s']:.1f} s incl. compilation; {ope}, "
            f"c {conf['c']:.4f} ({conf['seconds']:.0f} s)"
        )
    except Exception as exc:  # noqa: BLE001
        doc["ladder"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        summary.append(f"ladder: {doc['ladder']['error']}")
    doc["summary"] = summary
    return doc
