"""Benchmarks and measurements of :mod:`ivhl_jax.train.parallel` on emulated (or real) devices.

Harness ops (``ivhl bench --op NAME``), each a full training step of a small MLP on all devices,
with the plain single-device step timed as the peer ``plain_1device`` in the same run:

* ``parallel_dp_step``: data parallel (``{"data": -1}``), GSPMD shardings;
* ``parallel_fsdp_step``: fully sharded (``{"fsdp": -1}``);
* ``parallel_int8_dp_step``: data parallel with the int8 error-feedback all-reduce (``shard_map``);
* ``parallel_pipeline``: forward + backward of a GPipe pipeline over all devices.

``python -m ivhl_jax.bench.ops_parallel --out bench/results/parallel_8dev.json`` (run with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` on a CPU) writes the measurement document:
correctness of every mode against one device, communication bytes per step (parsed from the
compiled HLO, plus the ring-model wire bytes), the pipeline bubble against the number of
microbatches (formula and measured step time), and the convergence of compressed data parallelism
on the digits task. Emulated devices share the host's cores, so times measure overheads and
schedules, not speed-ups.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ivhl_jax.bench.harness import BenchCase
from ivhl_jax.core import backend
from ivhl_jax.train import parallel, training

MLP_SIZES = {
    "small": (256, 64, 256),
    "medium": (1024, 256, 1024),
    "large": (4096, 512, 2048),
    "extreme": (8192, 1024, 4096),
}  # (batch, d_in, hidden)


def _mlp(d_in: int, hidden: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {
        "w1": (rng.normal(size=(d_in, hidden)) / np.sqrt(d_in)).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.normal(size=(hidden, d_in)) / np.sqrt(hidden)).astype(np.float32),
    }
    names = {"w1": ("embed", "mlp"), "b1": ("mlp",), "w2": ("mlp", "embed")}
    return params, names


def _mlp_loss(params, batch, key, extra):
    y = jnp.tanh(batch["x"] @ params["w1"] + params["b1"]) @ params["w2"]
    loss = jnp.mean((y - batch["y"]) ** 2)
    return loss, ({}, extra)


def _batch(n: int, d: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    return {"x": x, "y": np.roll(x, 1, axis=1)}


def _sharded_step(spec, size):
    n, d, h = MLP_SIZES[size]
    params, names = _mlp(d, h)
    opt = training.make_optimizer(learning_rate=1e-3)
    state = training.init_train_state(params, opt, key=jax.random.key(0))
    mesh = parallel.make_mesh(spec)
    sh = parallel.state_shardings(state, mesh, names, min_size=1)
    batch = parallel.shard_batch(_batch(n, d), mesh)
    step = parallel.jit_train_step(
        training.make_train_step(_mlp_loss, opt),
        sh,
        jax.tree_util.tree_map(lambda a: a.sharding, batch),
        mesh,
        donate=False,
    )
    return step, parallel.shard_tree(state, sh), batch, state, opt, mesh


def _plain_peer(size):
    def build():
        n, d, h = MLP_SIZES[size]
        params, _ = _mlp(d, h)
        opt = training.make_optimizer(learning_rate=1e-3)
        dev = jax.devices()[0]
        state = jax.device_put(training.init_train_state(params, opt, key=jax.random.key(0)), dev)
        batch = jax.device_put(_batch(n, d), dev)
        step = jax.jit(training.make_train_step(_mlp_loss, opt))
        jax.block_until_ready(step(state, batch))
        return lambda: jax.block_until_ready(step(state, batch))  # full new state, as the JAX case

    return build


def _against_one_device(op: str, size: str, fn, args: tuple, params: dict, notes: str, **kw) -> BenchCase:
    """A data-parallel train step of the MLP at ``size`` against the plain step on one device (samples/s)."""
    return BenchCase(
        op,
        size,
        fn,
        args,
        params=params,
        peers={"plain_1device": _plain_peer(size)},
        op_by_op=False,
        items_per_call=MLP_SIZES[size][0],
        items_name="samples",
        notes=notes,
        **kw,
    )


def _step_case(op: str, spec: dict, size: str) -> BenchCase:
    step, state, batch, _, _, mesh = _sharded_step(spec, size)
    n, d, h = MLP_SIZES[size]
    return _against_one_device(
        op,
        size,
        lambda s, b: step(s, b),
        (state, batch),
        {"mesh": dict(mesh.shape), "batch": n, "d_in": d, "hidden": h},
        "train step (fwd+bwd+Adam) of a 2-layer MLP; peer: same step on one device",
        flops=6.0 * n * 2 * d * h,
    )


def _int8_case(size: str) -> BenchCase:
    n, d, h = MLP_SIZES[size]
    params, _ = _mlp(d, h)
    mesh = parallel.make_mesh({"data": -1})
    init, step = parallel.compressed_dp_train_step(
        _mlp_loss, training.make_optimizer(learning_rate=1e-3), mesh, method="int8"
    )
    state = init(params, jax.random.key(0))
    batch = parallel.shard_batch(_batch(n, d), mesh)

    def call(s, b):  # traced inside the harness's jit, so the inner step's donation does not apply
        return step(s, b)  # the whole new state: returning only the loss would let XLA drop the update

    return _against_one_device(
        "parallel_int8_dp_step",
        size,
        call,
        (state, batch),
        {"mesh": dict(mesh.shape), "batch": n},
        "data parallel with int8 error-feedback all-reduce",
    )


def _pipeline_case(size: str) -> BenchCase:
    n, d, _ = MLP_SIZES[size]
    s = jax.device_count()
    mesh = parallel.make_mesh({"pipeline": s})
    rng = np.random.default_rng(0)
    stages = {"w": (rng.normal(size=(s, d, d)) / np.sqrt(d)).astype(np.float32), "b": np.zeros((s, d), np.float32)}
    x = _batch(n, d)["x"]
    m = 8

    def stage(p, hh):
        return jnp.tanh(hh @ p["w"] + p["b"])

    def fn(st, xx):
        return jax.grad(lambda q: jnp.mean(parallel.pipeline_apply(stage, q, xx, mesh, n_microbatches=m) ** 2))(st)

    return BenchCase(
        "parallel_pipeline",
        size,
        fn,
        (stages, x),
        params={
            "stages": s,
            "microbatches": m,
            "batch": n,
            "width": d,
            "bubble_fraction": parallel.bubble_fraction(s, m),
        },
        op_by_op=False,
        items_per_call=n,
        items_name="samples",
        notes="GPipe forward+backward of tanh-MLP stages",
    )


OPS = {
    "parallel_dp_step": lambda size: _step_case("parallel_dp_step", {"data": -1}, size),
    "parallel_fsdp_step": lambda size: _step_case("parallel_fsdp_step", {"fsdp": -1}, size),
    "parallel_int8_dp_step": _int8_case,
    "parallel_pipeline": _pipeline_case,
}


# ----------------------------------------------------------------------------------------------
# The measurement document
# ----------------------------------------------------------------------------------------------


def _median_time(call, repeats=5):
    call()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)), float(np.percentile(ts, 75) - np.percentile(ts, 25))


def measure_modes(size: str = "small") -> list[dict]:
    """Every sharding mode vs one device after 3 steps: loss and parameter differences, bytes per step."""
    n, d, h = MLP_SIZES[size]
    params, _ = _mlp(d, h)
    opt = training.make_optimizer(learning_rate=1e-3)
    dev = jax.devices()[0]
    ref = jax.device_put(training.init_train_state(params, opt, key=jax.random.key(0)), dev)
    ref_step = jax.jit(training.make_train_step(_mlp_loss, opt))
    rb = jax.device_put(_batch(n, d), dev)
    ref_losses = []
    for _ in range(3):
        ref, m = ref_step(ref, rb)
        ref_losses.append(float(m["loss"]))
    nd = jax.device_count()
    specs = {
        "data_parallel": {"data": -1},
        "fsdp": {"fsdp": -1},
        "data2_fsdp": {"data": 2, "fsdp": -1},
        "tensor2_data": {"data": -1, "tensor": 2},
        "fsdp_tensor2": {"fsdp": -1, "tensor": 2},
    }
    out = []
    for name, spec in specs.items():
        if nd % 2 and len(spec) > 1:
            continue
        step, state, batch, _, _, mesh = _sharded_step(spec, size)
        losses = []
        for _ in range(3):
            state, m = step(state, batch)
            losses.append(float(m["loss"]))
        dp = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(ref.params))
        )
        comm = parallel.collective_bytes(step.lower(state, batch).compile(), nd)
        out.append(
            {
                "mode": name,
                "mesh": dict(mesh.shape),
                "max_rel_loss_diff": float(np.max(np.abs(np.array(losses) - ref_losses) / np.abs(ref_losses))),
                "max_abs_param_diff": dp,
                "collective_result_bytes_per_step": comm["total"],
                "wire_bytes_per_device_per_step": comm["wire_total"],
                "collectives": comm["count"],
            }
        )
    return out


def measure_tensor_parallel() -> dict:
    """Explicit Megatron MLP (shard_map, one psum) vs plain, and its bytes."""
    mesh = parallel.make_mesh({"data": -1, "tensor": 2})
    rng = np.random.default_rng(0)
    e, f, b = 64, 256, 32
    w_in, w_out = rng.normal(size=(e, f)).astype(np.float32) / 8, rng.normal(size=(f, e)).astype(np.float32) / 16
    b_in, b_out = np.zeros(f, np.float32), np.zeros(e, np.float32)
    x = rng.normal(size=(b, e)).astype(np.float32)
    specs = (P("data"), P(None, "tensor"), P("tensor"), P("tensor", None), P())
    fn = jax.jit(
        jax.shard_map(
            lambda xx, a, bb, c, dd: parallel.tp_mlp(xx, a, bb, c, dd), mesh=mesh, in_specs=specs, out_specs=P("data")
        )
    )
    y = fn(x, w_in, b_in, w_out, b_out)
    ref = jax.nn.gelu(x @ w_in + b_in) @ w_out + b_out
    comm = parallel.collective_bytes(fn.lower(x, w_in, b_in, w_out, b_out).compile())
    return {
        "mesh": dict(mesh.shape),
        "max_abs_diff": float(np.max(np.abs(np.asarray(y) - np.asarray(ref)))),
        "collective_result_bytes": comm["total"],
        "collectives": comm["count"],
        "note": "one all-reduce of the (local batch, embed) activation per MLP, as in Megatron",
    }


def measure_pipeline(width: int = 256, mb_size: int = 32, microbatches=(1, 2, 4, 8, 16, 32)) -> dict:
    """Pipeline bubble: (S−1)/(M+S−1) and the measured fwd+bwd time per microbatch against M."""
    s = jax.device_count()
    mesh = parallel.make_mesh({"pipeline": s})
    rng = np.random.default_rng(0)
    stages = {
        "w": (rng.normal(size=(s, width, width)) / np.sqrt(width)).astype(np.float32),
        "b": np.zeros((s, width), np.float32),
    }

    def stage(p, hh):
        return jnp.tanh(hh @ p["w"] + p["b"])

    rows = []
    for m in microbatches:
        x = rng.normal(size=(m * mb_size, width)).astype(np.float32)
        fn = jax.jit(
            jax.grad(lambda q, xx, m=m: jnp.mean(parallel.pipeline_apply(stage, q, xx, mesh, n_microbatches=m) ** 2))
        )
        med, iqr = _median_time(lambda fn=fn, x=x: jax.block_until_ready(fn(stages, x)))
        seq = jax.jit(jax.grad(lambda q, xx: jnp.mean(jax.lax.scan(lambda h, p: (stage(p, h), None), xx, q)[0] ** 2)))
        err = float(np.max(np.abs(np.asarray(fn(stages, x)["w"]) - np.asarray(seq(stages, x)["w"]))))
        rows.append(
            {
                "microbatches": m,
                "bubble_fraction": parallel.bubble_fraction(s, m),
                "step_s": med,
                "step_iqr_s": iqr,
                "step_s_per_microbatch": med / m,
                "max_abs_grad_diff_vs_sequential": err,
            }
        )
    t = np.array([r["step_s"] for r in rows])
    ticks = np.array([m + s - 1 for m in microbatches], float)
    slope, icpt = np.polyfit(ticks, t, 1)
    return {
        "stages": s,
        "microbatch_size": mb_size,
        "width": width,
        "rows": rows,
        "fit_step_s_vs_ticks": {"seconds_per_tick": float(slope), "intercept_s": float(icpt)},
        "note": "emulated devices share the host cores: step time grows with M+S-1 ticks, so time per "
        "microbatch falls like (M+S-1)/M",
    }


def measure_compression(steps: int = 150, batch: int = 256) -> dict:
    """Digits classification (the 8×8 digits shipped with the package, scikit-learn's), 64-128-10 MLP, Adam 3e-3:
    none vs bf16 vs int8 vs rank-4 PowerSGD, all with error feedback."""
    from ivhl_jax.train.data import Batcher
    from ivhl_jax.train.digits import load_digits

    x, y = load_digits()
    order = np.random.default_rng(0).permutation(len(x))
    x, y = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int32)
    xtr, ytr, xte, yte = x[:1400], y[:1400], x[1400:], y[1400:]
    mesh = parallel.make_mesh({"data": -1})

    def init(key):
        k1, k2 = jax.random.split(key)
        return [
            {"w": jax.random.normal(k1, (64, 128)) / 8, "b": jnp.zeros(128)},
            {"w": jax.random.normal(k2, (128, 10)) / np.sqrt(128), "b": jnp.zeros(10)},
        ]

    def apply(p, xx):
        return jax.nn.relu(xx @ p[0]["w"] + p[0]["b"]) @ p[1]["w"] + p[1]["b"]

    def loss_fn(p, b, key, extra):
        lp = jax.nn.log_softmax(apply(p, b["x"]))
        return -jnp.mean(jnp.take_along_axis(lp, b["y"][:, None], 1)), ({}, extra)

    out: dict[str, Any] = {
        "task": "sklearn digits, 1400 train / 397 test, MLP 64-128-10, Adam lr 3e-3, batch 256",
        "devices": jax.device_count(),
        "steps": steps,
        "runs": {},
    }
    batcher = Batcher(len(xtr), batch, seed=0)
    n_params = 64 * 128 + 128 + 128 * 10 + 10
    for method in parallel.COMPRESSION:
        init_state, step = parallel.compressed_dp_train_step(
            loss_fn, training.make_optimizer(name="adam", learning_rate=3e-3, clip_norm=None), mesh, method=method
        )
        state = init_state(init(jax.random.key(0)), jax.random.key(1))
        losses = []
        t0 = time.perf_counter()
        for s in range(steps):
            state, m = step(state, parallel.shard_batch(batcher.batch({"x": xtr, "y": ytr}, s), mesh))
            losses.append(float(m["loss"]))
        wall = time.perf_counter() - t0
        b = parallel.shard_batch(batcher.batch({"x": xtr, "y": ytr}, 0), mesh)
        jitted = step.jitted  # type: ignore[attr-defined]  # attached by compressed_dp_train_step for HLO inspection
        comm = parallel.collective_bytes(jitted(state, b).lower(state, b).compile(), jax.device_count())
        p = jax.tree_util.tree_map(np.asarray, state.params)
        acc = float(np.mean(np.argmax(apply(p, xte), -1) == yte))
        out["runs"][method] = {
            "final_loss_mean_last10": float(np.mean(losses[-10:])),
            "test_accuracy": acc,
            "loss_every_10": losses[::10],
            "wall_s": wall,
            "wire_bytes_per_device_per_step_hlo": comm["wire_total"],
            "wire_bytes_model": (
                parallel.powersgd_bytes(state.params, jax.device_count(), 4)
                if method == "powersgd"
                else parallel.allreduce_bytes(n_params, jax.device_count(), method)
            ),
            "collectives": comm["count"],
        }
    base = out["runs"]["none"]["wire_bytes_per_device_per_step_hlo"]
    for r in out["runs"].values():
        r["bytes_ratio_vs_none"] = r["wire_bytes_per_device_per_step_hlo"] / base
    return out


def main(argv=None) -> int:
    from ivhl_jax.bench.harness import write_results

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results/parallel_8dev.json")
    p.add_argument("--steps", type=int, default=150, help="compression convergence steps")
    p.add_argument("--skip", action="append", default=[], choices=["modes", "tp", "pipeline", "compression"])
    a = p.parse_args(argv)
    command = "python -m ivhl_jax.bench.ops_parallel " + " ".join(sys.argv[1:] if argv is None else argv)
    doc = {"devices": jax.device_count(), "platform": backend.platform(), "jax": jax.__version__}
    t0 = time.perf_counter()
    if "modes" not in a.skip:
        doc["modes_vs_single_device"] = measure_modes()
    if "tp" not in a.skip:
        doc["tensor_parallel_mlp"] = measure_tensor_parallel()
    if "pipeline" not in a.skip:
        doc["pipeline"] = measure_pipeline()
    if "compression" not in a.skip:
        doc["compression"] = measure_compression(a.steps)
    doc["wall_s"] = time.perf_counter() - t0
    print(f"wrote {write_results(a.out, doc, command=command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
