"""The profiler's two reference workloads (an MLP 128-256-128-10 and the adaptive-node model) and the
``baseline.json`` writer: ``python -m ivhl_jax.bench.workloads --out bench/results/baseline.json``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ivhl_jax.run.profiling import baseline_document, compare, profile_training

__all__ = ["mlp_workload", "adaptive_workload", "run_baseline"]


def mlp_workload(batch_size: int = 32, sizes: tuple[int, ...] = (128, 256, 128, 10), seed: int = 0):
    """MLP 128-256-128-10 (67,210 params), Adam 1e-3, CE, random data: the reference model's MLP baseline.

    Returns (loss_fn, params, optimizer, get_batch)."""
    keys = jax.random.split(jax.random.key(seed), len(sizes))
    params = []
    for k, (a, b) in zip(keys, zip(sizes[:-1], sizes[1:])):
        bound = 1.0 / np.sqrt(a)
        k1, k2 = jax.random.split(k)
        params.append(
            {
                "w": jax.random.uniform(k1, (a, b), minval=-bound, maxval=bound),
                "b": jax.random.uniform(k2, (b,), minval=-bound, maxval=bound),
            }
        )

    def loss_fn(p, batch, key):
        x, y = batch
        for i, layer in enumerate(p):
            x = x @ layer["w"] + layer["b"]
            if i < len(p) - 1:
                x = jax.nn.relu(x)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(x, y))

    def get_batch(step):
        k = jax.random.fold_in(jax.random.key(seed + 1), step)
        k1, k2 = jax.random.split(k)
        return (jax.random.normal(k1, (batch_size, sizes[0])), jax.random.randint(k2, (batch_size,), 0, sizes[-1]))

    return loss_fn, params, optax.adam(1e-3), get_batch


def adaptive_workload(cfg: Any = None, batch_size: int = 32, n_examples: int = 8000, seed: int = 0):
    """Adaptive-node training profile: N=100, H=64, D=784, C=10, Adam 1e-3 with global-norm clip 1.0, CE,
    synthetic prototype data (C class prototypes ~ N(0, I_D), a sample is its prototype plus 0.1 N(0, I) noise;
    preloaded, pre-shuffled, sliced per step by ``Batcher``). Each batch starts from an explicit initial node
    state. Returns (loss_fn, params, optimizer, get_batch, cfg)."""
    from ivhl_jax.nn import adaptive
    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.train.data import Batcher

    cfg = adaptive.AdaptiveConfig() if cfg is None else cfg
    rng = np.random.default_rng(seed)
    protos = rng.standard_normal((cfg.output_dim, cfg.input_dim)).astype(np.float32)
    y = rng.integers(0, cfg.output_dim, n_examples).astype(np.int32)
    x = protos[y] + 0.1 * rng.standard_normal((n_examples, cfg.input_dim)).astype(np.float32)
    # Shuffled once on the host; the device-side cursor then only slices (Batcher with shuffle=True
    # would re-draw an n-element permutation inside every step, which dominated the step time).
    order = rng.permutation(n_examples)
    arrays = (jnp.asarray(x[order]), jnp.asarray(y[order]))
    batcher = Batcher(n_examples, batch_size, seed=seed, shuffle=False)
    params = adaptive.init_params(jax.random.key(seed), cfg)

    def loss_fn(p, batch, key):
        xb, yb = batch
        st = adaptive.dynamics(p, xb, cfg)
        final, _ = trajectory(st, st.init(key), cfg.inner_steps, observe=adaptive.observe_phase_fractions)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(final.outputs["logits"], yb))

    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    return loss_fn, params, opt, lambda s: batcher.batch(arrays, s), cfg


def run_baseline(
    path: str,
    *,
    num_batches: int = 20,
    warmup: int = 3,
    fused_chunk: int = 200,
    trace_dir: str | None = None,
    include_mlp: bool = True,
    command: str | None = None,
) -> str:
    """Profile the adaptive model (N=100, H=64, D=784; per-sample and reference schedulers) and the MLP;
    write ``baseline.json``. Returns the path."""
    from ivhl_jax.bench.harness import write_results
    from ivhl_jax.nn import adaptive

    runs = []

    def profile(workload, label: str, trace: str | None = None) -> None:
        loss_fn, params, opt, get_batch = workload[:4]
        runs.append(
            profile_training(
                loss_fn,
                params,
                opt,
                get_batch,
                batch_size=32,
                key=jax.random.key(0),
                num_batches=num_batches,
                warmup=warmup,
                fused_chunk=fused_chunk,
                trace_dir=trace,
                label=label,
            )
        )

    for label, cfg in (
        ("adaptive per_sample (N=100,H=64,D=784,B=32)", adaptive.AdaptiveConfig()),
        (
            "adaptive reference: shared scheduler, softmax of probabilities (N=100,H=64,D=784,B=32)",
            adaptive.AdaptiveConfig.reference(),
        ),
    ):
        profile(adaptive_workload(cfg), label, trace_dir)
        trace_dir = None  # the first workload's trace only
    if include_mlp:
        profile(mlp_workload(), "mlp 128-256-128-10 (B=32)")
    doc = baseline_document(runs)
    doc["reference_model"] = {
        "adaptive_step_ms": 246.13,
        "adaptive_samples_per_sec": 130.0,
        "mlp_batch_latency_ms": 1.595,
        "mlp_samples_per_sec": 20240.0,
        "source": "the reference PyTorch package adaptiveneuralnetwork "
        "(github.com/V1B3hR/adaptiveneuralnetwork): its committed profiling "
        "baseline (4-CPU runner, torch 2.8)",
    }
    return write_results(path, doc, command=command)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="Write baseline.json (adaptive model + MLP reference).")
    p.add_argument("--out", default="bench/results/baseline.json")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--fused-chunk", type=int, default=200)
    p.add_argument("--trace-dir", default=None)
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two baseline.json files and exit")
    a = p.parse_args()
    if a.compare:
        import json

        docs = [json.load(open(f)) for f in a.compare]
        print(json.dumps(compare(*docs), indent=2))
    else:
        print(run_baseline(a.out, num_batches=a.batches, fused_chunk=a.fused_chunk, trace_dir=a.trace_dir))
