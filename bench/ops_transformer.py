"""Benchmarks of the transformer stack (``ivhl bench --op NAME``) and the attention memory sweep.

Ops (factory(size) -> BenchCase):
  attention_xla_grad / attention_chunked_grad — forward + backward of causal attention.
  dense_gelu, layernorm_dense — the "fused" blocks: jit vs op-by-op (every primitive dispatched
    eagerly, the analogue of unfused PyTorch eager) and a PyTorch eager peer.
  transformer_train_step — one AdamW train step of the ``small`` preset (512/6/8) through
    ``ivhl_jax.train.training``; tokens/s, model FLOP/s (6N + 12LdT per token) and a PyTorch eager peer
    of exactly the same network and optimizer (:func:`torch_lm`, :func:`torch_train_step`: pre-norm
    LayerNorm, RoPE, exact GELU, tied embeddings, AdamW b2 = 0.95 with clipping; our initial weights
    copied in; equality of losses and updated parameters tested in tests/models/test_transformer.py).

Ours vs PyTorch eager at B, T = 4, 256 and 8, 512 (interleaved rounds, wall and CPU time)::

    python -m ivhl_jax.bench.ops_transformer --vs-torch --rounds 7 \
        --export bench/results/transformer_cpu_vs_torch.json

Gradient cost per layer inside the model against one block alone, ours and PyTorch's::

    python -m ivhl_jax.bench.ops_transformer --layer-cost --rounds 7 \
        --export bench/results/transformer_cpu_layer_cost.json

Memory sweep (compile only, nothing is allocated)::

    python -m ivhl_jax.bench.ops_transformer --memory --export bench/results/transformer_attention_memory.json

records ``compiled.memory_analysis().temp_size_in_bytes`` of value-and-grad of causal attention for
T = 1k…16k, for the plain XLA path (materialises T×T scores) and the chunked path.

What rematerialisation saves (compile only): the temporaries of one train step of the ``small`` preset at
B, T = 8, 512 for every ``remat`` policy in fp32 and bf16::

    python -m ivhl_jax.bench.ops_transformer --remat-memory --export bench/results/transformer_remat_memory.json
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.bench.harness import BenchCase, blocking_call, interleaved_rounds, memory_bytes
from ivhl_jax.nn.attention import attention, attention_flops

_ATT = {"small": (1, 1024, 8, 64), "medium": (1, 4096, 8, 64), "large": (1, 8192, 8, 64), "extreme": (1, 16384, 8, 64)}


def _attention_grad_case(impl: str, size: str) -> BenchCase:
    B, T, N, H = _ATT[size]
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32) for _ in range(3))

    def fn(q, k, v):
        loss = lambda q, k, v: jnp.sum(attention(q, k, v, causal=True, implementation=impl, block_k=512) ** 2)
        return jax.value_and_grad(loss, (0, 1, 2))(q, k, v)

    return BenchCase(
        op=f"attention_{impl}_grad",
        size=size,
        fn=fn,
        args=(q, k, v),
        params={"B": B, "T": T, "heads": N, "head_dim": H, "causal": True, "dtype": "float32"},
        flops=attention_flops(B, T, T, N, H, causal=True, backward=True),
        op_by_op=False,
        notes="forward + backward; FLOPs count causal half of the matmuls (x3.5 for backward)",
    )


_MLP = {
    "small": (1024, 512, 2048),
    "medium": (4096, 768, 3072),
    "large": (8192, 1024, 4096),
    "extreme": (16384, 1024, 4096),
}


def _torch_block(kind: str, M: int, K: int, N: int):
    def build():
        import torch

        torch.manual_seed(0)
        x = torch.randn(M, K)
        lin = torch.nn.Linear(K, N)
        ln = torch.nn.LayerNorm(K)
        gelu = torch.nn.GELU()  # exact erf, as ours

        @torch.no_grad()
        def run():
            return gelu(lin(x)) if kind == "dense_gelu" else lin(ln(x))

        return run

    return build


def _block_case(kind: str, size: str) -> BenchCase:
    from ivhl_jax.models.layers import gelu_exact

    M, K, N = _MLP[size]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((K, N)) / np.sqrt(K), jnp.float32)
    b = jnp.zeros((N,), jnp.float32)
    g = jnp.ones((K,), jnp.float32)
    if kind == "dense_gelu":
        fn = lambda x, w, b, g: gelu_exact(x @ w + b)
    else:

        def fn(x, w, b, g):
            mu = jnp.mean(x, -1, keepdims=True)
            var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
            return ((x - mu) * jax.lax.rsqrt(var + 1e-5) * g) @ w + b

    return BenchCase(
        op=kind,
        size=size,
        fn=fn,
        args=(x, w, b, g),
        params={"M": M, "K": K, "N": N},
        flops=2.0 * M * K * N,
        peers={"torch_eager": _torch_block(kind, M, K, N)},
        notes="jit (XLA-fused epilogue/prologue) vs op-by-op (each primitive its own kernel "
        "and buffer) vs PyTorch eager",
    )


_LM = {"small": (4, 256), "medium": (8, 512), "large": (16, 1024), "extreme": (32, 1024)}


def _train_step_case(size: str) -> BenchCase:
    from ivhl_jax.models.transformer import flops_per_token, init_params, lm_loss_fn, preset
    from ivhl_jax.train import training

    B, T = _LM[size]
    cfg = preset("small", max_len=T, activation="gelu", norm="layernorm", attention="xla")
    opt = training.make_optimizer(name="adamw", learning_rate=1e-4, warmup_steps=1, total_steps=100)
    params = init_params(cfg, jax.random.key(0))
    state = training.init_train_state(params, opt, key=jax.random.key(1))
    step = training.make_train_step(lm_loss_fn(cfg), opt, "fp32")
    batch = jax.random.randint(jax.random.key(2), (B, T + 1), 0, 256)
    # Return the whole new state: with only the loss as output XLA would drop the backward pass and update.
    fn = lambda state, batch: step(state, batch)
    n_params = int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
    return BenchCase(
        op="transformer_train_step",
        size=size,
        fn=fn,
        args=(state, batch),
        params={
            "preset": "small",
            "d_model": 512,
            "layers": 6,
            "heads": 8,
            "d_ff": 2048,
            "batch": B,
            "seq_len": T,
            "n_params": n_params,
            "precision": "fp32",
        },
        flops=flops_per_token(cfg, T) * B * T,
        items_per_call=B * T,
        items_name="tokens",
        op_by_op=size == "small",
        peers={"torch_eager": _torch_lm(cfg, B, T)},
        notes="one AdamW step (fwd+bwd+update); MFU = gflops_per_s / measured matmul peak",
    )


def _torch_lm(cfg, B: int, T: int, threads: int | None = None):
    def build():
        import torch

        from ivhl_jax.models.transformer import init_params

        if threads is not None:
            torch.set_num_threads(threads)
        torch.manual_seed(0)
        model = torch_lm(cfg, T)
        torch_load_params(model, init_params(cfg, jax.random.key(0)))
        step = torch_train_step(model, learning_rate=1e-4)
        tokens = torch.from_numpy(np.asarray(jax.random.randint(jax.random.key(2), (B, T + 1), 0, 256), np.int64))
        return lambda: float(step(tokens))

    return build


# --------------------------------------------------------------------------- PyTorch peer of the LM


def torch_lm(cfg, seq_len: int):
    """A PyTorch ``nn.Module`` with exactly the architecture of ``Transformer(cfg)`` (no dropout).

    Pre-norm blocks (LayerNorm eps 1e-5 with bias, or RMSNorm eps 1e-6), Q/K/V/O projections without
    bias (Q, K, V as one ``[D, 3D]`` matmul, as PyTorch LMs usually do), RoPE in the rotate-half
    convention from cos/sin tables precomputed once, causal ``scaled_dot_product_attention``, MLP
    ``Linear(D, F) -> exact GELU -> Linear(F, D)`` with biases, final norm, logits tied to the
    embedding and scaled by ``1/sqrt(D)``. Parameters: :func:`torch_load_params` copies ours in.
    """
    import torch

    F = torch.nn.functional
    if cfg.activation != "gelu" or not cfg.rope or not cfg.tied_embeddings or cfg.dropout:
        raise NotImplementedError("the PyTorch peer covers activation='gelu', rope=True, tied embeddings, no dropout")
    D, N, Hd, V = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.vocab_size

    def norm():
        if cfg.norm == "layernorm":
            return torch.nn.LayerNorm(D, eps=1e-5)
        return torch.nn.RMSNorm(D, eps=1e-6)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = norm(), norm()
            self.qkv = torch.nn.Linear(D, 3 * D, bias=False)
            self.out = torch.nn.Linear(D, D, bias=False)
            self.wi = torch.nn.Linear(D, cfg.d_ff)
            self.wo = torch.nn.Linear(cfg.d_ff, D)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.attn_norm(x)).view(B, T, 3, N, Hd).permute(2, 0, 3, 1, 4).unbind(0)

            def rope(z):  # [B, N, T, Hd], rotate-half
                z1, z2 = z.chunk(2, dim=-1)
                return torch.cat([z1 * cos - z2 * sin, z2 * cos + z1 * sin], dim=-1)

            o = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
            x = x + self.out(o.transpose(1, 2).reshape(B, T, D))
            return x + self.wo(F.gelu(self.wi(self.mlp_norm(x))))

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Parameter(torch.randn(V, D))
            self.blocks = torch.nn.ModuleList([Block() for _ in range(cfg.n_layers)])
            self.final_norm = norm()
            inv = 1.0 / (10000.0 ** (torch.arange(0, Hd, 2, dtype=torch.float32) / Hd))
            ang = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv[None, :]
            self.register_buffer("cos", torch.cos(ang), persistent=False)
            self.register_buffer("sin", torch.sin(ang), persistent=False)

        def forward(self, tokens):
            T = tokens.shape[1]
            cos, sin = self.cos[:T], self.sin[:T]
            x = self.embedding[tokens]
            for blk in self.blocks:
                x = blk(x, cos, sin)
            return (self.final_norm(x) @ self.embedding.T) * (1.0 / math.sqrt(D))

    return LM()


def torch_load_params(model, params) -> None:
    """Copy an ``init_params`` tree (float32) into :func:`torch_lm`'s module, in place."""
    import torch

    def t(x):
        return torch.from_numpy(np.array(x, np.float32))

    D = model.embedding.shape[1]
    b = params["blocks"]
    with torch.no_grad():
        model.embedding.copy_(t(params["embedding"]))
        for norm, p in ((model.final_norm, params["final_norm"]),):
            norm.weight.copy_(t(p["scale"]))
            if "bias" in p:
                norm.bias.copy_(t(p["bias"]))
        for i, blk in enumerate(model.blocks):
            for name in ("attn_norm", "mlp_norm"):
                getattr(blk, name).weight.copy_(t(b[name]["scale"][i]))
                if "bias" in b[name]:
                    getattr(blk, name).bias.copy_(t(b[name]["bias"][i]))
            qkv = np.concatenate([np.asarray(b[n][i]).reshape(D, D) for n in ("q", "k", "v")], axis=1)
            blk.qkv.weight.copy_(t(qkv.T))
            blk.out.weight.copy_(t(np.asarray(b["out"][i]).reshape(D, D).T))
            blk.wi.weight.copy_(t(np.asarray(b["wi"]["dense"]["kernel"][i]).T))
            blk.wi.bias.copy_(t(b["wi"]["dense"]["bias"][i]))
            blk.wo.weight.copy_(t(np.asarray(b["wo"]["kernel"][i]).T))
            blk.wo.bias.copy_(t(b["wo"]["bias"][i]))


def torch_lm_loss(model, tokens):
    """Mean next-token cross-entropy of :func:`torch_lm` on ``tokens [B, T+1]`` (the twin of ``lm_loss_fn``)."""
    import torch

    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [B, T+1] with T >= 1 (inputs and shifted targets), got {tuple(tokens.shape)}")
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def _torch_twin_train_step(cfg, seq_len: int, params, *, learning_rate: float = 1e-4):
    """:func:`torch_train_step` of a fresh :func:`torch_lm` holding ``params`` (an ``init_params`` tree)."""
    import torch

    torch.manual_seed(0)
    model = torch_lm(cfg, seq_len)
    torch_load_params(model, params)
    return torch_train_step(model, learning_rate=learning_rate)


def torch_train_step(
    model,
    *,
    learning_rate: float = 1e-4,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    clip_norm: float | None = 1.0,
    foreach: bool | None = None,
):
    """``step(tokens [B, T+1] LongTensor) -> loss``: the PyTorch eager twin of ``make_train_step`` with
    ``make_optimizer(name="adamw", ...)`` (AdamW, global-norm clipping, mean next-token cross-entropy)."""
    import torch

    opt = torch.optim.AdamW(
        model.parameters(), lr=learning_rate, betas=(b1, b2), eps=eps, weight_decay=weight_decay, foreach=foreach
    )

    def step(tokens):
        opt.zero_grad(set_to_none=True)
        loss = torch_lm_loss(model, tokens)
        loss.backward()
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        opt.step()
        return loss.detach()

    return step


OPS = {
    "attention_xla_grad": lambda size: _attention_grad_case("xla", size),
    "attention_chunked_grad": lambda size: _attention_grad_case("chunked", size),
    "dense_gelu": lambda size: _block_case("dense_gelu", size),
    "layernorm_dense": lambda size: _block_case("layernorm_dense", size),
    "transformer_train_step": _train_step_case,
}


def remat_memory_sweep(
    preset_name: str = "small",
    batch: int = 8,
    seq_len: int = 512,
    remats: tuple[str, ...] = ("none", "dots_saveable", "full"),
    precisions: tuple[str, ...] = ("fp32", "bf16"),
) -> dict:
    """Compiled temporaries (bytes) of one AdamW train step per ``remat`` policy and precision; nothing executes.

    The step is ``training.make_train_step(lm_loss_fn(cfg), opt, cfg.precision)`` on a ``[batch, seq_len + 1]``
    token batch, lowered from abstract shapes (``jax.eval_shape``), so no parameter is allocated.
    """
    import time

    from ivhl_jax.models.transformer import init_params, lm_loss_fn, preset
    from ivhl_jax.train import training

    rows = []
    for remat in remats:
        for precision in precisions:
            cfg = preset(preset_name, max_len=seq_len, precision=precision, remat=remat)
            opt = training.make_optimizer(name="adamw", learning_rate=1e-4, warmup_steps=1, total_steps=100)
            state = jax.eval_shape(
                lambda cfg=cfg, opt=opt: training.init_train_state(
                    init_params(cfg, jax.random.key(0)), opt, key=jax.random.key(1), policy=cfg.precision
                )
            )
            tokens = jax.ShapeDtypeStruct((batch, seq_len + 1), jnp.int32)
            step = training.make_train_step(lm_loss_fn(cfg), opt, cfg.precision)
            t0 = time.perf_counter()
            mem = memory_bytes(jax.jit(step).lower(state, tokens).compile())
            rows.append(
                {
                    "remat": remat,
                    "precision": precision,
                    "temp_bytes": mem["temp_size_in_bytes"],
                    "argument_bytes": mem["argument_size_in_bytes"],
                    "compile_s": time.perf_counter() - t0,
                }
            )
            print(rows[-1], flush=True)
    return {
        "preset": preset_name,
        "batch": batch,
        "seq_len": seq_len,
        "rows": rows,
        "method": "jit(train_step).lower(abstract state, batch).compile().memory_analysis() (nothing executed)",
    }


def attention_memory_sweep(
    seq_lens=(1024, 2048, 4096, 8192, 16384), *, heads: int = 8, head_dim: int = 64, block_k: int = 512
) -> dict:
    """Compiled temp memory of value-and-grad of causal attention, xla vs chunked (bytes)."""
    rows = []
    for T in seq_lens:
        x = jax.ShapeDtypeStruct((1, T, heads, head_dim), jnp.float32)
        row: dict[str, Any] = {"T": T}
        for impl in ("xla", "chunked"):
            loss = lambda q, k, v, impl=impl: jnp.sum(
                attention(q, k, v, causal=True, implementation=impl, block_k=block_k)
            )
            for kind, f in (("forward", loss), ("value_and_grad", jax.value_and_grad(loss, (0, 1, 2)))):
                c = jax.jit(f).lower(x, x, x).compile()
                row[f"{impl}_{kind}_temp_bytes"] = memory_bytes(c)["temp_size_in_bytes"]
        row["ratio_value_and_grad"] = row["xla_value_and_grad_temp_bytes"] / row["chunked_value_and_grad_temp_bytes"]
        row["ratio_forward"] = row["xla_forward_temp_bytes"] / max(1, row["chunked_forward_temp_bytes"])
        print(row, flush=True)
        rows.append(row)
    Ts = np.array([r["T"] for r in rows], float)
    slopes = {}
    for key in ("xla_value_and_grad_temp_bytes", "chunked_value_and_grad_temp_bytes"):
        ys = np.array([r[key] for r in rows], float)
        slopes[key] = float(np.polyfit(np.log(Ts), np.log(ys), 1)[0])
    return {
        "batch": 1,
        "heads": heads,
        "head_dim": head_dim,
        "block_k": block_k,
        "dtype": "float32",
        "causal": True,
        "rows": rows,
        "loglog_slope": slopes,
        "method": "jax.jit(f).lower(...).compile().memory_analysis().temp_size_in_bytes (nothing executed)",
    }


def _torch_step_worker(conn, cfg, seq_len: int, params, batch: np.ndarray, threads: int) -> None:
    """Body of a spawned process that runs the PyTorch twin's train step on command, with glibc's default malloc.

    ``keep_host_memory`` is process-wide, and it can slow PyTorch; in its own process PyTorch keeps its best
    allocator (glibc's default) while ours keeps its own, and the
    rounds stay interleaved: this process waits on the pipe while the other runs. Protocol: sends ``"ready"``
    after a warm-up step, then answers each ``"run"`` with ``(wall_s, cpu_s)`` of one step (measured here, so
    the pipe's round trip is not counted); ``"stop"`` ends it.
    """
    import time

    import torch

    torch.set_num_threads(threads)
    step = _torch_twin_train_step(cfg, seq_len, params)
    tokens = torch.from_numpy(batch)
    step(tokens).item()
    conn.send("ready")
    while conn.recv() == "run":
        t0, c0 = time.perf_counter(), time.process_time()
        step(tokens).item()
        conn.send((time.perf_counter() - t0, time.process_time() - c0))
    conn.close()


def _jax_train_call(cfg, opt, params, batch, *, dense=None, matmul=None, layer_loop=None):
    """Our jitted train step (state donated) as a timed call, and its setup seconds. Baselines: ``dense=False``
    (attention through ``jax.nn.dot_product_attention``), ``matmul=jnp.dot`` (a plain expanding projection),
    ``layer_loop="scan"``; each traced here, so the overrides hold for the compile only."""
    import time
    from unittest import mock

    from ivhl_jax.core import backend
    from ivhl_jax.models import layers as layers_mod
    from ivhl_jax.models.transformer import lm_loss_fn
    from ivhl_jax.train import training

    state = training.init_train_state(jax.tree.map(jnp.copy, params), opt, key=jax.random.key(1))
    loss = lm_loss_fn(dataclasses.replace(cfg, layer_loop=layer_loop or cfg.layer_loop))
    step = jax.jit(training.make_train_step(loss, opt, "fp32"), donate_argnums=0)
    t0 = time.perf_counter()
    dense = backend.defaults().attention_dense if dense is None else dense
    matmul = layers_mod.matmul_saving_transposed_input if matmul is None else matmul
    with (
        backend.override(attention_dense=dense),
        mock.patch.object(layers_mod, "matmul_saving_transposed_input", matmul),
    ):
        compiled = step.lower(state, batch).compile()
    box = [state]

    def call():
        box[0], m = compiled(box[0], batch)
        jax.block_until_ready(m["loss"])

    call()
    return call, time.perf_counter() - t0


class _TorchWorker:
    """The PyTorch twin's step with 2 threads in a spawned process of its own (:func:`_torch_step_worker`):
    ``call()`` runs one step there and keeps the ``(wall_s, cpu_s)`` measured inside that process."""

    def __init__(self, cfg, seq_len: int, params, batch) -> None:
        import multiprocessing
        import time

        t0 = time.perf_counter()
        spawn = multiprocessing.get_context("spawn")
        self.conn, child_conn = spawn.Pipe()
        self.worker = spawn.Process(
            target=_torch_step_worker,
            daemon=True,
            args=(child_conn, cfg, seq_len, jax.tree.map(np.asarray, params), np.asarray(batch, np.int64), 2),
        )
        self.worker.start()
        if self.conn.recv() != "ready":
            raise RuntimeError("the PyTorch worker process did not start")
        self.measured: list[tuple[float, float]] = []
        self.setup_s = time.perf_counter() - t0

    def call(self) -> None:
        self.conn.send("run")
        self.measured.append(self.conn.recv())

    def stop(self) -> None:
        self.conn.send("stop")
        self.worker.join(timeout=30)


def _contestant_rows(B: int, T: int, setup: dict, wall: dict, cpu: dict, log) -> dict[str, dict[str, Any]]:
    """Per contestant: setup, wall medians/min/max, tokens/s, CPU median, the per-round ratio to ours, samples."""
    ours = np.asarray(wall["ivhl_jit"])
    rows = {}
    for k in setup:
        w = np.asarray(wall[k])
        rows[k] = {
            "setup_s": setup[k],
            "wall_median_s": float(np.median(w)),
            "wall_min_s": float(w.min()),
            "wall_max_s": float(w.max()),
            "tokens_per_s_median": B * T / float(np.median(w)),
            "cpu_median_s": float(np.median(cpu[k])),
            "time_over_ours_per_round_median": float(np.median(w / ours)),
            "wall_samples_s": [float(x) for x in w],
            "cpu_samples_s": [float(x) for x in cpu[k]],
        }
        log(
            f"B={B} T={T} {k:20s} {np.median(w):7.3f} s ({B * T / np.median(w):7.0f} tok/s) "
            f"cpu {np.median(cpu[k]):6.3f} s, x{np.median(w / ours):.3f} of ours per round"
        )
    return rows


def _train_step_shape(B: int, T: int, rounds: int, torch_threads, baseline: bool, log) -> dict:
    """One shape of :func:`train_step_vs_torch`: every contestant built, warmed, timed in interleaved rounds."""
    import os
    import time

    import torch

    from ivhl_jax.models.transformer import init_params, preset
    from ivhl_jax.train import training

    cfg = preset("small", max_len=T, activation="gelu", norm="layernorm", attention="xla")
    opt = training.make_optimizer(name="adamw", learning_rate=1e-4, warmup_steps=1, total_steps=100)
    params = init_params(cfg, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(2), (B, T + 1), 0, cfg.vocab_size)
    calls: dict[str, Callable[[], Any]] = {}
    setup: dict[str, float] = {}
    variants: dict[str, dict[str, Any]] = {"ivhl_jit": {}}
    if baseline:
        variants.update(
            ivhl_jit_baseline={"dense": False},
            ivhl_jit_plain_matmul={"matmul": jnp.dot},
            ivhl_jit_scan={"layer_loop": "scan"},
        )
    for name, kw in variants.items():
        calls[name], setup[name] = _jax_train_call(cfg, opt, params, batch, **kw)
    tokens = torch.from_numpy(np.asarray(batch, np.int64))
    for n in torch_threads:
        t0 = time.perf_counter()
        tstep = _torch_twin_train_step(cfg, T, params)

        def tcall(tstep=tstep, n=n):
            torch.set_num_threads(n)
            tstep(tokens).item()

        tcall()
        calls[f"torch_eager_{n}thr"], setup[f"torch_eager_{n}thr"] = tcall, time.perf_counter() - t0
    own = _TorchWorker(cfg, T, params, batch)
    calls["torch_eager_2thr_own_process"], setup["torch_eager_2thr_own_process"] = own.call, own.setup_s
    try:
        for c in calls.values():
            c()
        own.measured.clear()
        load0 = os.getloadavg()
        wall, cpu = interleaved_rounds(calls, rounds, pause_s=0.02, cpu=True)
    finally:
        own.stop()
    # the worker's own clocks: its CPU time is not this process's
    wall["torch_eager_2thr_own_process"] = [w for w, _ in own.measured]
    cpu["torch_eager_2thr_own_process"] = [c for _, c in own.measured]
    return {
        "batch": B,
        "seq_len": T,
        "tokens_per_step": B * T,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "contestants": _contestant_rows(B, T, setup, wall, cpu, log),
    }


def train_step_vs_torch(
    shapes=((4, 256), (8, 512)), *, rounds: int = 5, torch_threads=(1, 2), baseline: bool = True, log=print
) -> dict:
    """Tokens/s of our jitted ``small`` train step vs the PyTorch eager twin (:func:`torch_lm`).

    Per shape, every contestant runs once per round, in turn, in this one process (a short pause
    between calls), so host load hits all alike; medians, min/max and the per-round ratio to ours are
    reported, with the wall time and the process CPU time (``time.process_time``) of each call.
    Contestants: ``ivhl_jit`` (our step, state donated), optionally ``ivhl_jit_baseline`` (the same
    step with attention through ``jax.nn.dot_product_attention`` instead of the library's dense kernel) and
    ``ivhl_jit_plain_matmul`` (the same step with the MLP's expanding projection through ``jnp.dot``
    instead of ``layers.matmul_saving_transposed_input``), ``ivhl_jit_scan`` (the same step with the layers
    as one ``scan``, ``layer_loop="scan"``, where ours runs the CPU default, the unrolled loop),
    ``torch_eager_<n>thr`` for each thread count, and ``torch_eager_2thr_own_process`` (2 threads in a
    spawned process of its own with glibc's default malloc, :func:`_torch_step_worker`; its wall and CPU
    times are measured inside that process).
    """
    import torch

    out = [_train_step_shape(B, T, rounds, torch_threads, baseline, log) for B, T in shapes]
    return {
        "rows": out,
        "rounds": rounds,
        "torch_version": torch.__version__,
        "method": "interleaved rounds in one process; wall = time.perf_counter around one full step "
        "(ours: block_until_ready on the loss of the donated-state step; torch: loss.item()); "
        "cpu = time.process_time over the same call (all threads); torch_eager_2thr_own_process: "
        "both measured inside its own spawned process (glibc's default malloc), "
        "which waits on a pipe while the others run",
    }


def _layer_cost_calls(B: int, T: int) -> tuple[dict[str, Callable[[], Any]], Any]:
    """The gradients timed by :func:`layer_cost_vs_torch` at one shape (ours with 1, 2 and 6 layers, our block
    alone, the PyTorch twin's 6-layer model and its first block), and our 6-layer config."""
    import torch

    from ivhl_jax.models import transformer as tm

    batch = jax.random.randint(jax.random.key(2), (B, T + 1), 0, 256)
    calls: dict[str, Callable[[], Any]] = {}
    for L in (1, 2, 6):  # the loop ends on the 6-layer preset, whose config and parameters serve below
        cfg = tm.preset("small", max_len=T, activation="gelu", norm="layernorm", attention="xla", n_layers=L)
        params = tm.init_params(cfg, jax.random.key(0))
        loss = tm.lm_loss_fn(cfg)
        grad = jax.jit(jax.grad(lambda p, b, loss=loss: loss(p, b, None, None)[0]))
        calls[f"ours_{L}_layers"] = blocking_call(grad, params, batch)
    block, block_params = tm.Block(cfg), jax.tree.map(lambda a: a[0], params["blocks"])
    x = jax.random.normal(jax.random.key(3), (B, T, cfg.d_model))
    r = jax.random.normal(jax.random.key(4), (B, T, cfg.d_model))
    block_grad = jax.jit(jax.grad(lambda p, x: jnp.sum(block.apply({"params": p}, x)[0] * r), argnums=(0, 1)))
    calls["ours_block_alone"] = blocking_call(block_grad, block_params, x)
    model = torch_lm(cfg, T)
    torch_load_params(model, params)
    tokens = torch.from_numpy(np.asarray(batch, np.int64))

    def torch_model():
        model.zero_grad(set_to_none=True)
        torch_lm_loss(model, tokens).backward()

    tblock, tx = model.blocks[0], torch.from_numpy(np.array(x)).requires_grad_(True)
    tr = torch.from_numpy(np.array(r))

    def torch_block():
        tblock.zero_grad(set_to_none=True)
        tx.grad = None
        (tblock(tx, model.cos[:T], model.sin[:T]) * tr).sum().backward()

    calls["torch_6_layers"], calls["torch_block_alone"] = torch_model, torch_block
    return calls, cfg


def _layer_cost_shape(B: int, T: int, rounds: int, log) -> dict:
    """One shape of :func:`layer_cost_vs_torch`: the calls warmed, timed in interleaved rounds, the slopes."""
    import os

    calls, cfg = _layer_cost_calls(B, T)
    for c in calls.values():
        c()
        c()
    load0 = os.getloadavg()
    wall, _ = interleaved_rounds(calls, rounds, pause_s=0.01)
    ms = {k: 1e3 * float(np.median(v)) for k, v in wall.items()}
    slope = (ms["ours_6_layers"] - ms["ours_1_layers"]) / 5
    rec = {
        "batch": B,
        "seq_len": T,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "median_ms": ms,
        "samples_ms": {k: [1e3 * t for t in v] for k, v in wall.items()},
        "layer_loop_run": "scan" if cfg.scan_layers else "unrolled",
        "ours_per_layer_in_model_ms": slope,
        "ours_in_model_over_alone": slope / ms["ours_block_alone"],
        "torch_6_layers_over_6_blocks_alone": ms["torch_6_layers"] / (6 * ms["torch_block_alone"]),
        "ours_block_alone_over_torch_block_alone": ms["ours_block_alone"] / ms["torch_block_alone"],
    }
    log(
        f"B={B} T={T} "
        + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items())
        + f"; ours per layer in the model {slope:.0f} ms = x{rec['ours_in_model_over_alone']:.2f} of the block "
        f"alone; torch's model x{rec['torch_6_layers_over_6_blocks_alone']:.2f} of 6 blocks alone"
    )
    return rec


def layer_cost_vs_torch(shapes=((4, 256), (8, 512)), *, rounds: int = 7, threads: int = 2, log=print) -> dict:
    """Where the time of a forward+backward goes by depth: one block alone against the same block inside the model.

    Per shape, interleaved in this one process: the gradient (no optimizer) of our ``small`` model with
    ``n_layers`` = 1, 2 and 6 (in the default ``layer_loop``, recorded as ``layer_loop_run``), of one of our
    blocks alone (``jax.grad`` of ``sum(block(x) * r)`` with respect to its parameters and input), and the
    same two for the PyTorch twin (:func:`torch_lm`: its 6-layer model and its first block).
    ``ours_per_layer_in_model_ms`` is the slope ``(t(6 layers) - t(1 layer)) / 5``;
    ``ours_in_model_over_alone`` divides it by the block alone.
    """
    import torch

    torch.set_num_threads(threads)
    return {
        "rows": [_layer_cost_shape(B, T, rounds, log) for B, T in shapes],
        "rounds": rounds,
        "threads": threads,
        "torch_version": torch.__version__,
        "method": "medians of interleaved rounds in one process; gradients only (no optimizer update)",
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ivhl_jax.bench.ops_transformer")
    p.add_argument("--memory", action="store_true", help="attention memory sweep T = 1k..16k")
    p.add_argument("--max-T", type=int, default=16384)
    p.add_argument(
        "--remat-memory",
        action="store_true",
        help="train-step temporaries of the small preset (B, T = 8, 512) per remat policy and precision",
    )
    p.add_argument(
        "--vs-torch",
        action="store_true",
        help="train step of the small preset vs PyTorch eager at B,T = 4,256 and 8,512 (interleaved)",
    )
    p.add_argument(
        "--layer-cost",
        action="store_true",
        help="one block alone vs inside the 1/2/6-layer model, ours and PyTorch's (gradients only)",
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--export", help="write JSON here")
    p.add_argument(
        "--malloc-default",
        action="store_true",
        help="leave glibc's malloc as it is (default: ivhl_jax.run.device.keep_host_memory(), as the "
        "ivhl command line does; it applies to every contestant in this process)",
    )
    a = p.parse_args(argv)
    if not (a.memory or a.vs_torch or a.layer_cost or a.remat_memory):
        p.error(
            "nothing to do: pass --memory, --remat-memory, --vs-torch or --layer-cost "
            "(other timings: `ivhl bench --op ...`)"
        )
    from ivhl_jax.bench.harness import write_results
    from ivhl_jax.run.device import device_report, keep_host_memory

    command = "python -m ivhl_jax.bench.ops_transformer " + " ".join(sys.argv[1:] if argv is None else argv)
    malloc = "glibc defaults (--malloc-default)" if a.malloc_default else f"keep_host_memory: {keep_host_memory()}"
    if a.vs_torch or a.layer_cost:
        doc = {"environment": device_report(), "host_malloc": malloc}
        if a.vs_torch:
            doc["train_step_vs_torch"] = train_step_vs_torch(rounds=a.rounds)
        if a.layer_cost:
            doc["layer_cost_vs_torch"] = layer_cost_vs_torch(rounds=a.rounds)
        if a.export:
            print(f"wrote {write_results(a.export, doc, command=command)}")
        return 0
    if a.remat_memory:
        doc = remat_memory_sweep()
        if a.export:
            print(f"wrote {write_results(a.export, doc, command=command)}")
        return 0
    Ts = [T for T in (1024, 2048, 4096, 8192, 16384) if T <= a.max_T]
    doc = {"environment": device_report(), "attention_memory": attention_memory_sweep(Ts)}
    if a.export:
        print(f"wrote {write_results(a.export, doc, command=command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
