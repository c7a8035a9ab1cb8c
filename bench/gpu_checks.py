"""GPU checks and timings in one run: correctness of the GPU code paths, then their speed.

Run on a machine with a GPU (``python -m ivhl_jax.bench.gpu_checks --out DIR``); every section is
independent (a failing one records its traceback and the run goes on) and writes
``DIR/gpu_checks.json``. ``--quick`` shrinks every size so the script itself can be tested on a CPU.

One run sees every family (goal: under 6 minutes on one H100). ``--budget SECONDS`` (with ``--sections a,b``)
plans the sections into device calls of at most 6 minutes each, ``ivhl tune --quick`` first (:func:`plan_calls`:
each section's estimate from its size, or from an earlier run's wall times with ``--costs``), prints the plan and
one command per call, and runs the first call here (``--plan``: print only); ``--merge`` joins the calls' files
into one whose ``figures`` list each section's figure and its fractions of the limits measured in its call.
Sections
  env          devices, versions, ``nvidia-smi``, the per-backend defaults in force.
  ceilings     measured bf16 / f32 matmul rate and device-to-device copy bandwidth (the MFU and
               bandwidth denominators; datasheet numbers are only leads). The run also starts by measuring
               ``limits`` (``ivhl_jax.run.measure.measure_limits``), recorded at the top of the JSON.
  tune         ``ivhl tune`` on this device (fields, GP, CDT engines, attention): winners stored in the tuning
               cache, each kernel as a fraction of the measured roofline (``cost_analysis()`` bytes / flops).
  attention_ok every attention implementation (xla, cudnn, chunked, pallas compiled — not interpret)
               in f32 and bf16, causal and padding-masked, forward and all three gradients, against a
               float64 NumPy reference: max-norm relative error.
  attention    forward and forward+backward time and TFLOP/s (causal, bf16) per implementation.
  transformer  one AdamW train step of the ``base`` preset (768/12/12) in bf16 (fp32 master weights):
               tokens/s, model TFLOP/s (6N + 12LdT per token) and MFU against the measured bf16 peak.
  parallel     the same step through ``ivhl_jax.train.parallel.jit_train_step`` (1-device ``data`` and
               ``fsdp`` meshes) over the plain ``jax.jit`` step: the overhead of the parallel code path.
  fields       ``fields.superpose`` at 32768x100, 262144x256, 1048576x512: default vs best chunk vs
               ``torch.compile`` on the same device, error vs float64 (``bench/ops_fields.py``).
  gp           GP 3D Strang steps at 256³ and 512³, step by step and merged, vs the same algorithm in
               PyTorch on the same device (``bench/ops_condensate.py``).
  gp_modes     condensate vortex tracking (2-D frames in one batched call, a 3-D ring's length) and BdG spectra
               (homogeneous dispersion, Kohn mode) on the device: error vs analytic, ms per call
               (``bench/ops_condensate_modes.py``).
  gp_terms     condensate terms through ``condensate.strang`` (a damped rotating GP, a mixture, spin-1, dipolar):
               ms per step, drift of what each conserves, the float32 state against float64
               (``bench/ops_condensate_terms.py``).
  cdt          CDT many chains (1024 … 65536 at N₂ = 2048): accepted moves/s of the JAX, Pallas and host
               engines (and 2d-cdt when its sources are given) (``bench/ops_cdt.py``).
  cdt3         2+1D CDT many chains on the JAX engine (1 … 4096 at target N(3,1) = 1000): attempts/s, and no host
               callback in its compiled step (``bench/ops_cdt3_jax.py``).
  mera         MERA sweeps at χ = 16, 24, 32 in f32/f64 and one ladder (``bench/ops_tn.py``).
  mera_symmetric  Z2-symmetric (block-sparse) MERA sweeps at χ = 24, 32, 48 (``bench/ops_symmetric.py``).
  steppers     one short ``trajectory`` per stepper family (fields, condensate, gft, cdt, mera, adaptive,
               gru): first call, ms per step, finite observations.
  adaptive     the adaptive-model fused training chunk (seed configuration): samples/s (``bench/ops_adaptive.py``).
  pallas_blocks compiled Pallas attention per tile size: error vs XLA and time.
  gp_rounding  float32 norm and energy drift of the real-time GP scheme on this device and on the CPU.

Each family section is the ``gpu_check(quick)`` of its ``bench/ops_<area>.py`` (the op, its peer and its GPU
measurement change together); the script prints one summary table at the end.

Timing: warm-up calls first (compile apart), then ``repeats`` calls each ending in
``block_until_ready`` / ``torch.cuda.synchronize`` (the harness's ``time_callable``); median, IQR, min
and the raw samples are recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ivhl_jax.bench.harness import memory_bytes, time_callable
from ivhl_jax.core import backend

H100_BF16_DENSE_TFLOPS = 989.4  # datasheet (SXM, dense); the measured peak is the MFU denominator


def _median_time(call: Callable[[], Any], repeats: int) -> dict[str, Any]:
    return time_callable(call, repeats=repeats, warmup=2)


def _jax_call(fn, *args):
    import jax

    return lambda: jax.block_until_ready(fn(*args))


# ------------------------------------------------------------------------------------------------ env
def section_env(quick: bool) -> dict:

    from ivhl_jax.run.device import device_report

    out: dict[str, Any] = {"report": device_report(), "default_backend": backend.platform()}
    try:
        out["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        out["nvidia_smi"] = f"unavailable: {e}"
    try:
        import torch

        out["torch"] = {"version": torch.__version__, "cuda": torch.cuda.is_available()}
    except ImportError:
        out["torch"] = None
    return out


# ------------------------------------------------------------------------------------------ ceilings
def section_ceilings(quick: bool) -> dict:
    import jax
    import jax.numpy as jnp

    n = 512 if quick else 8192
    reps = 3 if quick else 10
    out = {}
    ka, kb = jax.random.split(jax.random.key(0))
    for name, dt, prec in (
        ("bf16", jnp.bfloat16, None),
        ("f32_default", jnp.float32, None),
        ("f32_highest", jnp.float32, jax.lax.Precision.HIGHEST),
    ):
        a = jax.random.normal(ka, (n, n), dt)
        b = jax.random.normal(kb, (n, n), dt)
        f = jax.jit(lambda a, b, p=prec: jnp.matmul(a, b, precision=p))
        t = _median_time(_jax_call(f, a, b), reps)
        out[f"matmul_{name}"] = {"n": n, **t, "tflops": 2 * n**3 / t["median_s"] / 1e12}
    try:  # the same product through PyTorch (cuBLAS), for comparison with the JAX figure
        import torch

        if torch.cuda.is_available():
            ta, tb = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))

            def tcall():
                torch.matmul(ta, tb)
                torch.cuda.synchronize()

            t = _median_time(tcall, reps)
            out["matmul_bf16_torch"] = {"n": n, **t, "tflops": 2 * n**3 / t["median_s"] / 1e12}
    except ImportError:
        pass
    nbytes = (1 << 24) if quick else (1 << 31)
    x = jnp.ones((nbytes // 4,), jnp.float32)
    f = jax.jit(lambda x: x * 1.0000001)
    t = _median_time(_jax_call(f, x), reps)
    out["copy"] = {"bytes": nbytes, **t, "gbps_read_plus_write": 2 * nbytes / t["median_s"] / 1e9}
    return out


# ------------------------------------------------------------------------------------- attention_ok
def _np_attention(q, k, v, allowed, scale):
    """float64 forward; returns (o, p) with q,k,v [B,T,N,H] and allowed [B,N,Tq,Tk] or None."""
    s = np.einsum("bqnh,bknh->bnqk", q, k) * scale
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnqk,bknh->bqnh", p, v), p


def _np_attention_grads(q, k, v, do, p, scale):
    """Gradients of sum(o * do) for softmax attention (float64)."""
    dv = np.einsum("bnqk,bqnh->bknh", p, do)
    dp = np.einsum("bqnh,bknh->bnqk", do, v)
    ds = p * (dp - np.sum(dp * p, -1, keepdims=True))
    dq = np.einsum("bnqk,bknh->bqnh", ds, k) * scale
    dk = np.einsum("bnqk,bqnh->bknh", ds, q) * scale
    return dq, dk, dv


def _rel(a, b) -> float:
    a = np.asarray(a, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def section_attention_ok(quick: bool) -> dict:
    import jax
    import jax.numpy as jnp

    from ivhl_jax.nn.attention import attention

    B, T, N, H = (2, 128, 2, 64) if quick else (2, 512, 4, 64)
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((B, T, N, H)) for _ in range(4))
    lengths = np.array([T, T * 3 // 4])
    pad = np.arange(T)[None, :] < lengths[:, None]  # [B, Tk]: key padding
    scale = 1.0 / math.sqrt(H)
    results = []
    for masking in ("causal", "padding"):
        causal = masking == "causal"
        allowed = (
            np.tril(np.ones((T, T), bool))[None, None]
            if causal
            else np.broadcast_to(pad[:, None, None, :], (B, N, T, T))
        )
        o_ref, p = _np_attention(q, k, v, allowed, scale)
        grads_ref = _np_attention_grads(q, k, v, do, p, scale)
        mask = None if causal else jnp.asarray(pad[:, None, None, :])
        for dtype in ("float32", "bfloat16"):
            for impl in ("xla", "cudnn", "chunked", "pallas"):
                rec: dict[str, Any] = {"impl": impl, "dtype": dtype, "masking": masking, "shape": [B, T, N, H]}
                try:
                    qj, kj, vj, doj = (jnp.asarray(a, dtype) for a in (q, k, v, do))
                    kw = dict(mask=mask, causal=causal, implementation=impl)
                    if impl == "pallas":
                        kw["interpret"] = False

                    def loss(q_, k_, v_, kw=kw, doj=doj):
                        return jnp.sum(attention(q_, k_, v_, **kw).astype(jnp.float32) * doj.astype(jnp.float32))

                    o = jax.jit(lambda a, b, c, kw=kw: attention(a, b, c, **kw))(qj, kj, vj)
                    g = jax.jit(jax.grad(loss, (0, 1, 2)))(qj, kj, vj)
                    rec["fwd_rel_err"] = _rel(o, o_ref)
                    rec.update({f"d{n}_rel_err": _rel(gg, gr) for n, gg, gr in zip("qkv", g, grads_ref)})
                    worst = max(rec["fwd_rel_err"], rec["dq_rel_err"], rec["dk_rel_err"], rec["dv_rel_err"])
                    # f32 on GPU: XLA may use TF32 for f32 dots (error ~1e-3); bf16 operands ~1e-2.
                    rec["tolerance"] = 5e-3 if dtype == "float32" else 3e-2
                    rec["ok"] = bool(np.isfinite(worst) and worst <= rec["tolerance"])
                except Exception as e:  # recorded, the run goes on
                    rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                    rec["ok"] = False
                results.append(rec)
    return {"results": results, "all_ok": all(r["ok"] for r in results)}


# ---------------------------------------------------------------------------------------- attention
def section_attention(quick: bool) -> dict:
    import jax
    import jax.numpy as jnp

    from ivhl_jax.nn.attention import attention, attention_flops

    shapes = [(1, 256, 2, 64)] if quick else [(4, 4096, 16, 64), (4, 4096, 16, 128), (1, 16384, 16, 128)]
    reps = 3 if quick else 20
    out = []
    for B, T, N, H in shapes:
        ks = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(kk, (B, T, N, H), jnp.bfloat16) for kk in ks)
        for impl in ("xla", "cudnn", "chunked", "pallas"):
            rec: dict[str, Any] = {"impl": impl, "shape": [B, T, N, H], "dtype": "bfloat16", "causal": True}
            kw = dict(causal=True, implementation=impl)
            if impl == "pallas":
                kw["interpret"] = False
            try:
                fwd = jax.jit(lambda q, k, v, kw=kw: attention(q, k, v, **kw))
                tf = _median_time(_jax_call(fwd, q, k, v), reps)
                rec["fwd"] = {**tf, "tflops": attention_flops(B, T, T, N, H, causal=True) / tf["median_s"] / 1e12}

                def loss(q, k, v, kw=kw):
                    return jnp.sum(attention(q, k, v, **kw).astype(jnp.float32))

                bwd = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))
                tb = _median_time(_jax_call(bwd, q, k, v), reps)
                rec["fwd_bwd"] = {
                    **tb,
                    "tflops": attention_flops(B, T, T, N, H, causal=True, backward=True) / tb["median_s"] / 1e12,
                }
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            out.append(rec)
    return {"results": out, "flops_note": "causal half of 4·B·N·T²·H (forward), x3.5 with backward"}


# -------------------------------------------------------------------------------------- transformer
def _lm_step(cfg, B, T, seed=0):
    import jax

    from ivhl_jax.models.transformer import init_params, lm_loss_fn
    from ivhl_jax.train import training

    opt = training.make_optimizer(name="adamw", learning_rate=1e-4, warmup_steps=1, total_steps=100)
    params = init_params(cfg, jax.random.key(seed))
    state = training.init_train_state(params, opt, key=jax.random.key(1), policy=cfg.precision)
    step = training.make_train_step(lm_loss_fn(cfg), opt, cfg.precision)
    batch = jax.random.randint(jax.random.key(2), (B, T + 1), 0, cfg.vocab_size)
    return step, state, batch, params


def _time_train(step_jit, state, batch, reps):
    import jax

    holder = {"s": state}

    def call():  # carry the state forward: every timed step is a real, dependent update
        holder["s"], m = step_jit(holder["s"], batch)
        jax.block_until_ready(m["loss"])
        jax.block_until_ready(holder["s"].params)

    t = _median_time(call, reps)
    return t, holder["s"]


def section_transformer(quick: bool, peak_bf16_tflops: float | None) -> dict:
    import jax

    from ivhl_jax.models.transformer import count_params, flops_per_token, preset

    out = []
    runs = (
        [("tiny", 2, 64, "xla", "none")]
        if quick
        else [
            ("base", 8, 2048, "cudnn", "none"),
            ("base", 8, 2048, "xla", "none"),
            ("base", 16, 2048, "cudnn", "dots_saveable"),
            ("base", 8, 2048, "chunked", "none"),
        ]
    )
    reps = 3 if quick else 10
    for name, B, T, att, remat in runs:
        rec: dict[str, Any] = {
            "preset": name,
            "batch": B,
            "seq_len": T,
            "attention": att,
            "remat": remat,
            "precision": "bf16",
        }
        try:
            cfg = preset(name, max_len=T, precision="bf16", attention=att, remat=remat)
            step, state, batch, params = _lm_step(cfg, B, T)
            step_jit = jax.jit(step, donate_argnums=(0,))
            t0 = time.perf_counter()
            compiled = step_jit.lower(state, batch).compile()
            rec["compile_s"] = time.perf_counter() - t0
            mem = memory_bytes(compiled)
            if mem:
                rec["temp_bytes"] = mem.get("temp_size_in_bytes", 0)
            t, _ = _time_train(step_jit, state, batch, reps)
            flops = flops_per_token(cfg, T) * B * T
            rec.update(
                {
                    "n_params": count_params(params),
                    **t,
                    "tokens_per_s": B * T / t["median_s"],
                    "model_tflops": flops / t["median_s"] / 1e12,
                }
            )
            if peak_bf16_tflops:
                rec["mfu_vs_measured_peak"] = rec["model_tflops"] / peak_bf16_tflops
            rec["mfu_vs_datasheet_989"] = rec["model_tflops"] / H100_BF16_DENSE_TFLOPS
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            rec["traceback"] = traceback.format_exc()[-1500:]
        out.append(rec)
    return {"results": out, "flops_note": "model FLOPs 6N + 12·L·d·T per token (PaLM appendix B)"}


# ----------------------------------------------------------------------------------------- parallel
def section_parallel(quick: bool) -> dict:
    import jax

    from ivhl_jax.models.transformer import param_logical_axes, preset
    from ivhl_jax.train import parallel

    name, B, T = ("tiny", 4, 64) if quick else ("base", 8, 1024)
    reps = 3 if quick else 10
    cfg = preset(name, max_len=T, precision="bf16", attention="auto")
    step, state, batch, _ = _lm_step(cfg, B, T)
    plain = jax.jit(step)
    t_plain, _ = _time_train(plain, state, batch, reps)
    out: dict[str, Any] = {"preset": name, "batch": B, "seq_len": T, "plain": t_plain, "modes": []}
    for spec in ({"data": 1}, {"fsdp": 1}):
        rec: dict[str, Any] = {"mesh": spec}
        try:
            mesh = parallel.make_mesh(spec)
            sh = parallel.state_shardings(state, mesh, param_logical_axes(cfg))
            gstate = parallel.shard_tree(state, sh)
            gbatch = parallel.shard_batch(batch, mesh)
            pstep = parallel.jit_train_step(step, sh, gbatch.sharding, mesh, donate=False)
            t, _ = _time_train(pstep, gstate, gbatch, reps)
            rec.update(t)
            rec["overhead_vs_plain"] = t["median_s"] / t_plain["median_s"] - 1.0
            # Interleave a second plain measurement so a drift of the GPU clock shows as spread.
            t_plain2, _ = _time_train(plain, state, batch, reps)
            rec["plain_again"] = t_plain2
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            rec["traceback"] = traceback.format_exc()[-1500:]
        out["modes"].append(rec)
    return out


# ------------------------------------------------------------------------------------------ families
# Each family's GPU measurement lives beside its benchmark ops (``bench/ops_<area>.py: gpu_check(quick)``), so
# the op, its peer and its GPU section change together; this script only runs them in one process.
def _family(module: str, quick: bool) -> dict:
    import importlib

    return importlib.import_module(f"ivhl_jax.bench.{module}").gpu_check(quick)


# section -> the module whose ``gpu_check(quick)`` it runs (what each measures: this module's docstring)
FAMILY_MODULES = {
    "fields": "ops_fields",
    "gp": "ops_condensate",
    "gp_modes": "ops_condensate_modes",
    "gp_terms": "ops_condensate_terms",
    "cdt": "ops_cdt",
    "cdt3": "ops_cdt3_jax",
    "mera": "ops_tn",
    "mera_symmetric": "ops_symmetric",
    "adaptive": "ops_adaptive",
}


# ------------------------------------------------------------------------------------------ steppers
def _stepper_cases(quick: bool) -> dict[str, Callable[[], tuple]]:
    """family -> a zero-argument builder of (stepper, start state, observe, steps): one short trajectory each."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax import adaptive, cdt, condensate, fields, gft, gru, mera

    def wave():
        n, m = (256, 8) if quick else (262_144, 64)
        rng = np.random.default_rng(0)
        st = fields.superposition(
            rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            rng.uniform(-1, 1, (m, 3)).astype(np.float32),
            amplitudes=1.0,
            wavenumbers=rng.uniform(5, 7, m),
            phases=0.0,
            dt=0.05,
        )
        return st, st.init(), fields.observe, 10

    def gp():
        grid = condensate.Grid.uniform((16, 16, 16) if quick else (128, 128, 128), 12.0)
        st = condensate.strang(condensate.GPSystem.create(grid, condensate.harmonic(grid, 1.0), 20.0), 1e-3)
        return st, st.init(condensate.gaussian(grid).astype(jnp.complex64)), condensate.observe, 20

    def gft_case():
        shape = (8, 8, 8) if quick else (64, 64, 64)
        st = gft.strang(gft.GFTSystem.create(shape, -0.5, 0.1), 1e-2)
        kr, ki = jax.random.split(jax.random.key(0))
        phi = 0.1 * jax.lax.complex(jax.random.normal(kr, shape), jax.random.normal(ki, shape))
        return st, st.init(phi), gft.observe, 20

    def cdt_case():
        # one chain through trajectory (the many-chain race is the cdt section); a sweep is N₂ attempts
        st = cdt.metropolis(cdt.LN2, eps=0.02, target=128 if quick else 2048)
        return (
            st,
            st.init(jax.random.key(0), 8 if quick else 16, 8 if quick else 64, 256 if quick else 4096),
            cdt.observe,
            10,
        )

    def mera_case():
        cfg = mera.MERAConfig(chi=4 if quick else 16, chi_mid=3 if quick else 12, layers=2 if quick else 3)
        st = mera.evenbly_vidal(mera.ising(), cfg, policy="f32")  # float32 like the other families
        return st, st.init(jax.random.key(0)), mera.observe, 4

    def adaptive_case():
        cfg = adaptive.AdaptiveConfig(
            num_nodes=8 if quick else 128, hidden_dim=4 if quick else 64, input_dim=5, output_dim=3
        )
        st = adaptive.dynamics(
            adaptive.init_params(jax.random.key(0), cfg),
            jax.random.normal(jax.random.key(1), (4 if quick else 256, 5)),
            cfg,
        )
        return st, st.init(jax.random.key(2)), adaptive.observe, 10

    def gru_case():
        d, h, b, t = (3, 8, 2, 16) if quick else (64, 512, 256, 128)
        w = gru.init_params(jax.random.key(0), d, h)
        st = gru.recurrence(w, jax.random.normal(jax.random.key(1), (t, b, d)))
        return st, st.init(jnp.zeros((b, h))), gru.observe, t

    return {
        "fields": wave,
        "condensate": gp,
        "gft": gft_case,
        "cdt": cdt_case,
        "mera": mera_case,
        "adaptive": adaptive_case,
        "gru": gru_case,
    }


def section_steppers(quick: bool) -> dict:
    """One short ``trajectory`` per stepper family on this device: first call (compile + run), steady time per
    step, and whether every observation is finite — so one run sees every family."""
    import jax

    from ivhl_jax import trajectory

    reps = 3 if quick else 5
    out: dict[str, Any] = {}
    for family, build in _stepper_cases(quick).items():
        rec: dict[str, Any] = {}
        try:
            st, s0, observe, steps = build()
            t0 = time.perf_counter()
            final, obs = jax.block_until_ready(trajectory(st, s0, steps, observe=observe))
            rec["first_call_s"] = time.perf_counter() - t0
            t = _median_time(
                _jax_call(lambda s, st=st, steps=steps, observe=observe: trajectory(st, s, steps, observe=observe), s0),
                reps,
            )
            rec["ms_per_step"] = 1e3 * t["median_s"] / steps
            rec["steps"] = steps
            leaves = [np.asarray(x) for x in jax.tree.leaves(obs) if np.issubdtype(np.asarray(x).dtype, np.inexact)]
            rec["finite"] = bool(all(np.all(np.isfinite(x)) for x in leaves))
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            rec["traceback"] = traceback.format_exc()[-1500:]
        out[family] = rec
    out["summary"] = {
        f: (round(r["ms_per_step"], 4), r["finite"]) if "ms_per_step" in r else r.get("error", "")[:80]
        for f, r in out.items()
    }
    return out


# ------------------------------------------------------------------------------------ pallas_blocks
def section_pallas_blocks(quick: bool) -> dict:
    """Compiled Pallas attention forward per (block_q, block_k): compiles?, error vs the XLA path, time."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.nn.attention import attention

    shapes = [(1, 256, 2, 64)] if quick else [(4, 4096, 16, 64), (4, 4096, 16, 128)]
    reps = 3 if quick else 20
    out = []
    for B, T, N, H in shapes:
        ks = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(kk, (B, T, N, H), jnp.bfloat16) for kk in ks)
        # causal only: with a boolean mask "pallas" runs the chunked path, so there is no tile to choose
        for masking in ("causal",):
            kw = dict(causal=True)
            ref = jax.jit(lambda q, k, v, kw=kw: attention(q, k, v, implementation="xla", **kw))(q, k, v)
            for bq, bk in ((128, 128), (128, 64), (64, 64), (64, 32), (32, 32)):
                rec = {"shape": [B, T, N, H], "masking": masking, "block_q": bq, "block_k": bk}
                try:
                    f = jax.jit(
                        lambda q, k, v, kw=kw, bq=bq, bk=bk: attention(
                            q, k, v, implementation="pallas", interpret=False, block_q=bq, block_k=bk, **kw
                        )
                    )
                    o = f(q, k, v)
                    rec["rel_err_vs_xla"] = float(
                        jnp.max(jnp.abs(o.astype(jnp.float32) - ref.astype(jnp.float32)))
                        / jnp.max(jnp.abs(ref.astype(jnp.float32)))
                    )
                    t = _median_time(_jax_call(f, q, k, v), reps)
                    rec.update(t)
                except Exception as e:
                    rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                out.append(rec)
    return {"results": out}


# ------------------------------------------------------------------------------------- gp_rounding
def section_gp_rounding(quick: bool) -> dict:
    """Norm and energy drift of the raw float32 real-time scheme on this backend and on the CPU.

    The configuration of tests/physics/condensate/test_stepper.py::test_real_time_conserves_norm_and_energy
    (1D, 128 points, g = 5, dipole kick, dt = 2e-3, 1000 steps), for each ``project_norm``: False (the raw
    scheme), None (the default: the norm restored once per block between observations) and True (every step).
    """
    import jax
    import jax.numpy as jnp

    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.physics import condensate as C

    grid = C.Grid.uniform((128,), 16.0)
    system = C.GPSystem.create(grid, C.harmonic(grid), 5.0)
    out = {}
    for dev in [jax.devices()[0], jax.devices("cpu")[0]] if backend.platform() != "cpu" else [jax.devices()[0]]:
        with jax.default_device(dev):
            psi0, _ = C.ground_state(system, 1.0, dt=0.01, tol=1e-6, max_steps=3000)
            psi0 = psi0 * jnp.exp(1j * 0.7 * jnp.asarray(grid.coords[0], jnp.float32))
            n0 = float(C.norm(psi0, grid))
            e0 = float(C.energy(psi0, system)["total"])
            for proj in (False, None, True):
                st = C.strang(system, 2e-3, project_norm=proj, norm=None if proj is False else n0)
                _, obs = jax.jit(lambda p, st=st: trajectory(st, p, 1000, save_every=100, observe=C.observe))(psi0)
                out[f"{dev.platform}_project_{proj}"] = {
                    "norm_rel_drift": (np.asarray(obs["norm"]) / n0 - 1).tolist(),
                    "energy_rel_drift": (np.asarray(obs["energy_total"]) / e0 - 1).tolist(),
                }
    return out


# ------------------------------------------------------------------------------------------ tune
def section_tune(quick: bool) -> dict:
    """``ivhl tune`` on this device (fields, GP, CDT engines, attention): every candidate checked against the
    table default's output, timed in interleaved rounds, each winner as a fraction of the limits measured now
    (:mod:`ivhl_jax.run.tune`). Stored in the tuning cache ($IVHL_CACHE_DIR) unless ``quick`` (CPU-sized, not
    stored)."""
    from ivhl_jax.run import tune

    saved = os.environ.get("IVHL_TUNE_TINY")
    if quick:
        os.environ["IVHL_TUNE_TINY"] = "1"
    try:
        res = tune.tune(["fields", "gp", "cdt", "attention"], quick=True, save=not quick)
    finally:
        if saved is None:
            os.environ.pop("IVHL_TUNE_TINY", None)
        else:
            os.environ["IVHL_TUNE_TINY"] = saved
    lines = [
        f"{key}: {e['winner']} {1e3 * e['median_s']:.3f} ms, table default "
        f"x{e.get('table_default_over_best', 1):.2f}, {100 * (e['roofline']['fraction'] or 0):.1f} % of the "
        f"{e['roofline']['bound']} roofline"
        for key, e in sorted(res["entries"].items())
    ]
    lines += [f"{area}: not tuned: {err}" for area, err in res["errors"].items()]
    return {**res, "summary": lines}


SECTIONS = (
    "env",
    "ceilings",
    "tune",
    "attention_ok",
    "attention",
    "transformer",
    "parallel",
    "fields",
    "gp",
    "gp_modes",
    "gp_terms",
    "cdt",
    "cdt3",
    "mera",
    "mera_symmetric",
    "steppers",
    "adaptive",
    "pallas_blocks",
    "gp_rounding",
)
FAMILY_SECTIONS = (*FAMILY_MODULES, "tune")  # the sections a bench/ops_<area>.py module (or ivhl tune) runs


# ------------------------------------------------------------------------------------------ plan
#: Seconds one device call may take (the device tool's per-call limit is 10 minutes; calls are planned to 6 so that a
#: rerun of the slowest one still fits).
CALL_LIMIT_S = 360.0
#: Seconds every call spends before its first section: Python start, importing JAX, the GPU client and
#: ``measure_limits`` (the H100 and H200 records: 15-25 s).
CALL_OVERHEAD_S = 25.0
#: Estimate of ``ivhl tune --quick`` on one GPU (fields, GP, CDT and attention areas): the H200 record's fields
#: and GP areas took 120 s, its CDT and attention areas were cut at 85 s; planned as 180 s.
TUNE_ESTIMATE_S = 180.0
#: Factor on every estimate when packing calls (compile times vary by driver and by what the cache holds).
PLAN_MARGIN = 1.25


@dataclasses.dataclass(frozen=True)
class SectionCost:
    """A section's size on one GPU: ``compiles`` distinct programs (a compile is ~``COMPILE_S``) and
    ``work_s`` seconds of timed runs (repeats x size over the measured rate); ``measured_s`` where a committed
    record (bench/results/gpu_h100.json, gpu_h200_tune_checks.json) has its wall time. The estimate is the
    larger of the two, so a section never measured is planned from its size alone."""

    compiles: int
    work_s: float
    measured_s: float | None = None

    @property
    def estimate_s(self) -> float:
        size = self.compiles * COMPILE_S + self.work_s
        return max(size, self.measured_s or 0.0)


#: Seconds one jit compile of a mid-sized program takes on a GPU host (XLA + ptxas; the H100 record's first
#: attention call: 2-4 s); Pallas and MERA programs take longer and are counted as two.
COMPILE_S = 3.0

#: Per section (GPU sizes): the compiles and the seconds of timed work it runs, from its sizes in this file and in
#: its ``bench/ops_<area>.py``; ``measured_s`` from the committed GPU records.
SECTION_COSTS: dict[str, SectionCost] = {
    "env": SectionCost(0, 5.0, measured_s=5.6),
    "ceilings": SectionCost(4, 6.0, measured_s=24.1),
    "tune": SectionCost(0, TUNE_ESTIMATE_S),
    "attention_ok": SectionCost(16, 4.0, measured_s=44.9),  # 4 impls x 2 dtypes x 2 maskings, fwd + 3 grads
    "attention": SectionCost(16, 20.0, measured_s=69.2),
    "transformer": SectionCost(8, 20.0, measured_s=51.1),  # 4 settings, each a train step compile + 10 steps
    "parallel": SectionCost(3, 5.0, measured_s=18.0),
    "fields": SectionCost(12, 6.0, measured_s=21.2),  # 3 sizes x (default, 2-3 chunks, torch.compile)
    "gp": SectionCost(8, 30.0, measured_s=96.7),  # 256³ and 512³, step by step and merged, and PyTorch
    "gp_modes": SectionCost(8, 10.0),  # vortex tracking 2-D/3-D, BdG homogeneous and Kohn
    "gp_terms": SectionCost(8, 20.0),  # 4 terms x (f32 run, f64 reference)
    "cdt": SectionCost(12, 40.0, measured_s=22.8),  # 3 engines x 4-7 chain counts (the H200 run failed early)
    "cdt3": SectionCost(6, 40.0),  # host thermalisation, 5 chain counts x 4 calls of 200 attempts, one host row
    "mera": SectionCost(14, 30.0),  # chi 16/24/32 x f32/f64 sweeps and one ladder
    "mera_symmetric": SectionCost(12, 30.0),  # chi 24/32/48 block-sparse sweeps
    "steppers": SectionCost(14, 5.0),  # 7 families, a first call (compile) and a timed trajectory each
    "adaptive": SectionCost(2, 4.0, measured_s=6.1),
    "pallas_blocks": SectionCost(10, 5.0, measured_s=31.1),
    "gp_rounding": SectionCost(2, 3.0, measured_s=4.8),
}


def plan_calls(
    sections: Sequence[str],
    *,
    budget_s: float | None = None,
    call_limit_s: float = CALL_LIMIT_S,
    with_tune: bool = True,
    costs: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Pack ``sections`` into device calls of at most ``call_limit_s`` seconds each (estimated, times
    :data:`PLAN_MARGIN`, plus :data:`CALL_OVERHEAD_S` per call), ``ivhl tune --quick`` first when ``with_tune``.

    First-fit decreasing over the estimates (``costs``: seconds per section, e.g. the ``section_wall_s`` of an
    earlier run, else :data:`SECTION_COSTS`); within a call the sections keep :data:`SECTIONS` order. With
    ``budget_s`` (device seconds for all calls together) the calls beyond it are left out, named in
    ``left_out``. A section whose estimate alone exceeds a call gets a call of its own (``over_limit``).

    Returns ``{"calls": [{"tune": bool, "sections": [...], "estimate_s": float}], "left_out": [...],
    "over_limit": [...], "estimate_s": total}``; pure (no device, no clock).
    """
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"sections: unknown {unknown}; choose from {', '.join(SECTIONS)}")
    if call_limit_s <= CALL_OVERHEAD_S:
        raise ValueError(f"call_limit_s must exceed the per-call overhead {CALL_OVERHEAD_S:g} s, got {call_limit_s:g}")
    if budget_s is not None and budget_s <= 0:
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s:g}")

    def cost(name: str) -> float:
        base = (costs or {}).get(name)
        return PLAN_MARGIN * (SECTION_COSTS[name].estimate_s if base is None else float(base))

    room = call_limit_s - CALL_OVERHEAD_S
    calls: list[dict[str, Any]] = []
    if with_tune:
        calls.append({"tune": True, "sections": [], "estimate_s": PLAN_MARGIN * TUNE_ESTIMATE_S})
    wanted = [s for s in dict.fromkeys(sections) if not (with_tune and s == "tune")]
    over = [s for s in wanted if cost(s) > room]
    for name in sorted(wanted, key=lambda s: (-cost(s), SECTIONS.index(s))):
        home = next((c for c in calls if c["estimate_s"] + cost(name) <= room and name not in over), None)
        if home is None:
            home = {"tune": False, "sections": [], "estimate_s": 0.0}
            calls.append(home)
        home["sections"].append(name)
        home["estimate_s"] += cost(name)
    for c in calls:
        c["sections"].sort(key=SECTIONS.index)
        c["estimate_s"] = round(c["estimate_s"] + CALL_OVERHEAD_S, 1)
    left_out: list[str] = []
    if budget_s is not None:
        kept, spent = [], 0.0
        for c in calls:
            if spent + c["estimate_s"] <= budget_s:
                kept.append(c)
                spent += c["estimate_s"]
            else:
                left_out += (["tune"] if c["tune"] else []) + c["sections"]
        calls = kept
    return {
        "calls": calls,
        "left_out": sorted(left_out, key=SECTIONS.index),
        "over_limit": over,
        "call_limit_s": call_limit_s,
        "estimate_s": round(sum(c["estimate_s"] for c in calls), 1),
    }


def plan_commands(
    plan: Mapping[str, Any], out: str = "gpu_out", quick: bool = False, script: bool = False
) -> list[str]:
    """One shell command per planned call, each under ``timeout`` of the call limit; call k writes
    ``OUT/gpu_checks_call{k}.json`` (``--merge`` joins them into one results file). ``script``: the same calls
    through ``bench/gpu_tune_and_check.sh`` (runs from a copy of the source tree with nothing installed)."""
    q = " --quick" if quick else ""
    lines = []
    for k, c in enumerate(plan["calls"], 1):
        limit = int(plan["call_limit_s"])
        if script:
            tune_s = int(PLAN_MARGIN * TUNE_ESTIMATE_S) if c["tune"] else 0
            checks = (
                f"{q.strip()} --name gpu_checks_call{k}.json --sections {','.join(c['sections'])} "
                f"--budget-s {max(1, limit - tune_s - 15 - int(CALL_OVERHEAD_S))}"
            ).strip()
            env = f"OUT={out} TUNE_TIMEOUT={tune_s}" if c["tune"] else f"OUT={out} SKIP_TUNE=1"
            if c["sections"]:
                # the script also checks the import and runs `ivhl info` (a few seconds each) inside the call
                env += f" CHECKS_TIMEOUT={limit - tune_s - 15} CHECKS_ARGS='{checks}'"
            else:
                env += " CHECKS_TIMEOUT=1 CHECKS_ARGS='--sections env'"
            lines.append(f"{env} bash bench/gpu_tune_and_check.sh")
            continue
        parts = []
        if c["tune"]:
            tune_s = int(PLAN_MARGIN * TUNE_ESTIMATE_S)
            parts.append(f"timeout {tune_s} python -m ivhl_jax.cli tune --quick --export {out}/tune_gpu.json")
            limit -= tune_s
        if c["sections"]:
            parts.append(
                f"timeout {limit} python -m ivhl_jax.bench.gpu_checks{q} --out {out} --name gpu_checks_call{k}.json"
                f" --sections {','.join(c['sections'])} --budget-s {max(1, limit - int(CALL_OVERHEAD_S))}"
            )
        lines.append(" ; ".join(parts))
    return lines


def format_plan(plan: Mapping[str, Any], commands: Sequence[str]) -> str:
    """The plan as text: one line per call (estimate and sections) and its command."""
    lines = [f"plan: {len(plan['calls'])} call(s) of <= {plan['call_limit_s']:g} s, about {plan['estimate_s']:g} s"]
    for k, (c, cmd) in enumerate(zip(plan["calls"], commands, strict=True), 1):
        what = (["ivhl tune --quick"] if c["tune"] else []) + list(c["sections"])
        lines.append(f"  call {k} (~{c['estimate_s']:g} s): {', '.join(what)}")
        lines.append(f"    {cmd}")
    if plan["over_limit"]:
        lines.append(f"  estimated over one call on their own: {', '.join(plan['over_limit'])}")
    if plan["left_out"]:
        lines.append(f"  left out by the budget: {', '.join(plan['left_out'])}")
    return "\n".join(lines)


_FRACTION_KEYS = (
    "fraction",
    "fraction_of_bf16_matmul_rate",
    "fraction_of_copy_bandwidth_ideal",
    "mfu_vs_measured_peak",
)


def _fractions(node: Any) -> list[float]:
    """Every fraction of a measured limit under ``node``: roofline ``fraction`` s, attention over the bf16 matmul
    rate, GP over the copy bandwidth, transformer MFU."""
    found: list[float] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _FRACTION_KEYS and isinstance(value, (int, float)) and math.isfinite(value):
                found.append(float(value))
            elif key != "limits_of_this_run":
                found += _fractions(value)
    elif isinstance(node, list):
        for value in node:
            found += _fractions(value)
    return found


def figures(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per section of a results document: its figure (the summary line) and its fractions of the limits measured
    in that run (min / median / max over every timed kernel; None where the section times nothing against them)."""
    out = {}
    for name, res in doc.get("sections", {}).items():
        fr = _fractions(res)
        try:
            figure: Any = _summary(name, res)
        except (KeyError, TypeError, IndexError, ValueError) as e:  # a record of another layout (an older run)
            figure = f"no figure: {type(e).__name__}: {e}"
        out[name] = {
            "figure": figure,
            "fraction_of_limits": None
            if not fr
            else {"min": min(fr), "median": float(np.median(fr)), "max": max(fr), "kernels": len(fr)},
            "wall_s": res.get("section_wall_s"),
        }
    return out


def merge(paths: Sequence[str]) -> dict[str, Any]:
    """One results document from several calls' ``gpu_checks_call*.json``: sections in :data:`SECTIONS` order (a
    section run twice keeps the later run's result; ``call_file`` names its call), each call's limits in ``calls``,
    and :func:`figures`."""
    doc: dict[str, Any] = {"calls": [], "sections": {}}
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        doc["calls"].append(
            {"file": os.path.basename(path), "limits": part.get("limits"), "sections": list(part.get("sections", {}))}
        )
        for name, res in part.get("sections", {}).items():
            doc["sections"][name] = {**res, "call_file": os.path.basename(path)}  # its limits: that call's
    doc["sections"] = {n: doc["sections"][n] for n in SECTIONS if n in doc["sections"]}
    doc["figures"] = figures(doc)
    return doc


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results", help="folder for gpu_checks.json")
    ap.add_argument("--only", action="append", choices=SECTIONS, help="run only these sections (repeatable)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (to test the script on a CPU)")
    ap.add_argument("--name", default="gpu_checks.json", help="output file name")
    ap.add_argument(
        "--skip",
        action="append",
        choices=SECTIONS,
        default=[],
        help="leave out these sections (repeatable; e.g. tune when `ivhl tune` ran just before)",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="skip the sections left once this many seconds have passed (0: no limit)",
    )
    ap.add_argument(
        "--sections",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        help="comma-separated sections to plan / run (default: every section)",
    )
    ap.add_argument(
        "--budget",
        type=float,
        help="device seconds for all calls: print the plan (calls of <= 6 min, `ivhl tune --quick` first) and its "
        "commands, then run its first call here",
    )
    ap.add_argument("--plan", action="store_true", help="with --budget: print the plan and commands only")
    ap.add_argument("--no-tune", action="store_true", help="plan without the `ivhl tune --quick` call")
    ap.add_argument("--costs", help="an earlier gpu_checks JSON whose section_wall_s replace the estimates")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="join several calls' results into --out/--name")
    return ap


def _plan(args: argparse.Namespace, ap: argparse.ArgumentParser) -> tuple[dict | None, bool]:
    """With ``--budget`` or ``--plan``: the calls planned and their commands printed, and ``args`` narrowed to
    the first call (its sections and time budget); None without a plan. Second: whether sections run here
    (not after ``--plan`` alone, nor when the plan has no call)."""
    if args.budget is None and not args.plan:
        if args.sections:
            args.only = args.sections
        return None, True
    if args.budget is not None and args.budget <= 0:
        ap.error(f"--budget must be > 0 seconds, got {args.budget:g}")
    costs = None
    if args.costs:
        with open(args.costs) as f:
            earlier = json.load(f).get("sections", {})
        costs = {n: r["section_wall_s"] for n, r in earlier.items() if "section_wall_s" in r and "error" not in r}
    wanted = [n for n in (args.sections or args.only or SECTIONS) if n not in args.skip]
    planned = plan_calls(wanted, budget_s=args.budget, with_tune=not args.no_tune, costs=costs)
    print(format_plan(planned, plan_commands(planned, args.out, args.quick)), flush=True)
    print("  from a copy of the source tree (nothing installed), the same calls:")
    for cmd in plan_commands(planned, args.out, args.quick, script=True):
        print(f"    {cmd}")
    if args.plan or not planned["calls"]:
        return planned, False
    first = planned["calls"][0]
    args.only = (["tune"] if first["tune"] else []) + first["sections"]
    if not args.budget_s:
        args.budget_s = max(1.0, first["estimate_s"] - CALL_OVERHEAD_S)
    return planned, True


def _limits() -> dict[str, Any]:
    """This machine's limits, measured now: every section's figures can be read as a fraction of them."""
    try:
        from ivhl_jax.run.measure import measure_limits

        limits = measure_limits(quick=True)
        print(
            f"[gpu_checks] limits: copy {limits['copy_gbps']:.1f} GB/s, matmul f32 "
            f"{limits['matmul_f32_tflops']:.2f} / bf16 {limits['matmul_bf16_tflops']:.2f} TFLOP/s",
            flush=True,
        )
        return limits
    except Exception as e:  # noqa: BLE001 - the checks still run without a roofline
        return {"error": f"{type(e).__name__}: {e}"}


def _section(name: str, quick: bool, peak: float | None) -> dict:
    """One section's result; a section that fails as a whole is recorded with its traceback."""
    try:
        if name == "transformer":
            return section_transformer(quick, peak)
        if name in FAMILY_MODULES:
            return _family(FAMILY_MODULES[name], quick)
        return globals()[f"section_{name}"](quick)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, args.name)
    from ivhl_jax.bench.harness import write_results

    if args.merge:
        write_results(path, merge(args.merge))
        print(f"wrote {path}")
        return 0
    if args.sections:
        bad = [s for s in args.sections if s not in SECTIONS]
        if bad:
            ap.error(f"--sections: unknown {bad}; choose from {','.join(SECTIONS)}")
    planned, run_here = _plan(args, ap)
    if not run_here:
        return 0
    doc: dict[str, Any] = {"timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sections": {}}
    if planned is not None:
        doc["plan"] = planned
    start = time.perf_counter()
    doc["limits"] = _limits()
    peak = None
    for name in [n for n in (args.only or SECTIONS) if n not in args.skip]:
        t0 = time.perf_counter()
        if args.budget_s and t0 - start > args.budget_s:
            doc["sections"][name] = {"skipped": f"over the --budget-s {args.budget_s:g} s", "section_wall_s": 0.0}
            print(f"[gpu_checks] {name}: skipped (over the time budget)", flush=True)
            continue
        print(f"[gpu_checks] {name} ...", flush=True)
        res = _section(name, args.quick, peak)
        if name == "ceilings":
            peak = res.get("matmul_bf16", {}).get("tflops")
        res["section_wall_s"] = time.perf_counter() - t0
        _add_fractions(name, res, doc.get("limits", {}))
        doc["sections"][name] = res
        doc["figures"] = figures(doc)
        write_results(path, doc)  # after every section: a later crash loses nothing
        print(json.dumps(_summary(name, res), default=str)[:1500], flush=True)
    print(format_summary(doc))
    print(f"wrote {path}")
    return 0


def _add_fractions(name: str, res: dict, limits: dict) -> None:
    """Each timed kernel as a fraction of the limits measured at the start of this run (``doc["limits"]``):
    attention TFLOP/s over the bf16 matmul rate; GP steps' ideal traffic (3 passes of read + write of the
    complex64 field per merged step) over the copy bandwidth; every timed family section carries the limits beside
    its figures, and each kernel that recorded its ``cost`` (fields per block size, cdt per engine and chain count,
    mera per sweep, adaptive per chunk: ``cost_analysis()`` of the compiled call) gets its ``roofline``
    (:func:`_add_rooflines`). The tune section has a roofline per kernel; transformer MFU is against the measured
    bf16 peak already."""
    bw = float(limits.get("copy_gbps") or 0.0) * 1e9
    bf16 = float(limits.get("matmul_bf16_tflops") or 0.0)
    if name == "attention" and bf16:
        for rec in res.get("results", []):
            for phase in ("fwd", "fwd_bwd"):
                if phase in rec:
                    rec[phase]["fraction_of_bf16_matmul_rate"] = rec[phase]["tflops"] / bf16
    if name == "gp" and bw:
        for rec in res.get("results", []):
            if "fused_ms_per_step" in rec:
                n = float(np.prod(rec["shape"]))
                rec["fraction_of_copy_bandwidth_ideal"] = 3 * 2 * 8 * n / (1e-3 * rec["fused_ms_per_step"]) / bw
    if name in ("attention", "gp", "fields", "cdt", "mera", "transformer", "adaptive") and limits:
        res["limits_of_this_run"] = {k: v for k, v in limits.items() if not isinstance(v, dict)}
    if limits and "copy_gbps" in limits:
        _add_rooflines(res, limits)


def _add_rooflines(node: Any, limits: dict) -> None:
    """Beside every timed kernel's ``cost`` (``ivhl_jax.run.measure.cost_record``: XLA's flops and bytes of the compiled
    call and its median time) its ``roofline`` (``ivhl_jax.run.measure.roofline_of``: ``fraction`` of the memory or
    compute limit measured at the start of this run); a ``costs`` mapping (one per candidate) gets ``rooflines``."""
    from ivhl_jax.run.measure import roofline_of

    def one(c: dict) -> dict:
        return roofline_of(c["flops"], c["bytes"], c["seconds"], limits, dtype=c.get("dtype", "f32"))

    if isinstance(node, dict):
        if isinstance(node.get("cost"), dict) and "seconds" in node["cost"]:
            node["roofline"] = one(node["cost"])
        if isinstance(node.get("costs"), dict):
            node["rooflines"] = {k: one(c) for k, c in node["costs"].items() if isinstance(c, dict) and "seconds" in c}
        for key, value in node.items():
            if key not in ("cost", "costs", "roofline", "rooflines"):
                _add_rooflines(value, limits)
    elif isinstance(node, list):
        for value in node:
            _add_rooflines(value, limits)


def format_summary(doc: dict[str, Any]) -> str:
    """One table of every section's headline (``gpu_checks.json`` has everything)."""
    lines = ["", f"{'section':<14} {'s':>7}  summary", "-" * 100]
    for name, res in doc["sections"].items():
        text = json.dumps(_summary(name, res), default=str)
        lines.append(f"{name:<14} {res.get('section_wall_s', 0.0):7.1f}  {text[:400]}")
    return "\n".join(lines)


def _result_rows(name: str, res: dict) -> list[tuple]:
    """The console's row of each result of the sections that time several variants."""
    rows = res["results"]
    if name == "attention":
        return [
            (
                r["impl"],
                r["shape"],
                round(r.get("fwd", {}).get("tflops", 0), 1),
                round(r.get("fwd_bwd", {}).get("tflops", 0), 1),
                r.get("error", "")[:80],
            )
            for r in rows
        ]
    if name == "transformer":
        return [
            (
                r["attention"],
                r["batch"],
                r["remat"],
                round(r.get("tokens_per_s", 0)),
                round(r.get("model_tflops", 0), 1),
                round(r.get("mfu_vs_measured_peak", 0), 3),
                r.get("error", "")[:80],
            )
            for r in rows
        ]
    return [  # pallas_blocks
        (
            r["shape"][-1],
            r["masking"],
            r["block_q"],
            r["block_k"],
            r.get("rel_err_vs_xla"),
            r.get("median_s"),
            r.get("error", "")[:60],
        )
        for r in rows
    ]


def _summary(name: str, res: dict) -> dict:
    """A short line per section for the console (the JSON has everything)."""
    if "error" in res:
        return {name: res["error"]}
    if "skipped" in res:
        return {name: res["skipped"]}
    if name == "ceilings":
        return {
            k: round(float(v["tflops"] if "tflops" in v else v.get("gbps_read_plus_write", 0)), 1)
            for k, v in res.items()
            if isinstance(v, dict)
        }
    if name == "attention_ok":
        return {
            "all_ok": res["all_ok"],
            "bad": [
                (r["impl"], r["dtype"], r["masking"], r.get("error", ""), r.get("fwd_rel_err"), r.get("dq_rel_err"))
                for r in res["results"]
                if not r["ok"]
            ],
        }
    if name in ("attention", "transformer", "pallas_blocks"):
        return {name: _result_rows(name, res)}
    if name == "parallel":
        return {
            "plain_ms": 1e3 * res["plain"]["median_s"],
            "modes": [
                (m["mesh"], round(m.get("overhead_vs_plain", float("nan")), 4), m.get("error", "")[:80])
                for m in res["modes"]
            ],
        }
    if name in FAMILY_SECTIONS or name == "steppers":
        return {name: res.get("summary", "no summary")}
    if name == "gp_rounding":
        return {
            k: (v["norm_rel_drift"][-1], max(abs(x) for x in v["energy_rel_drift"]))
            for k, v in res.items()
            if isinstance(v, dict)
        }
    return {name: "done"}


if __name__ == "__main__":
    sys.exit(main())
