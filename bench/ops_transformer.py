"""Benchmarks of the transformer stack (``ivhl bench --op NAME``) and the attention memory sweep.

Ops (factory(size) -> BenchCase):
  attention_xla_grad / attention_chunked_grad — forward + backward of causal attention.
  dense_gelu, layernorm_dense — the "fused" blocks: jit vs op-by-op (every primitive dispatched
    eagerly, the analogue of unfused PyTorch eager) and a PyTorch eager peer.
  transformer_train_step — one AdamW train step of the ``small`` preset (512/6/8) through
    ``ivhl_jax.train.training``; tokens/s, model FLOP/s (6N + 12LdT per token) and a PyTorch peer of the
    same architecture (pre-norm, RoPE omitted in the peer: learned positions; GELU; AdamW).

Memory sweep (compile only, nothing is allocated)::

    python -m ivhl_jax.bench.ops_transformer --memory --export bench/results/transformer_attention_memory.json

records ``compiled.memory_analysis().temp_size_in_bytes`` of value-and-grad of causal attention for
T = 1k…16k, for the plain XLA path (materialises T×T scores) and the chunked path.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.bench.harness import BenchCase
from ivhl_jax.nn.attention import attention, attention_flops

_ATT = {"small": (1, 1024, 8, 64), "medium": (1, 4096, 8, 64), "large": (1, 8192, 8, 64),
        "extreme": (1, 16384, 8, 64)}


def _attention_grad_case(impl: str, size: str) -> BenchCase:
    B, T, N, H = _ATT[size]
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32) for _ in range(3))

    def fn(q, k, v):
        loss = lambda q, k, v: jnp.sum(attention(q, k, v, causal=True, implementation=impl, block_k=512) ** 2)
        return jax.value_and_grad(loss, (0, 1, 2))(q, k, v)

    return BenchCase(op=f"attention_{impl}_grad", size=size, fn=fn, args=(q, k, v),
                     params={"B": B, "T": T, "heads": N, "head_dim": H, "causal": True, "dtype": "float32"},
                     flops=attention_flops(B, T, T, N, H, causal=True, backward=True), op_by_op=False,
                     notes="forward + backward; FLOPs count causal half of the matmuls (x3.5 for backward)")


_MLP = {"small": (1024, 512, 2048), "medium": (4096, 768, 3072), "large": (8192, 1024, 4096),
        "extreme": (16384, 1024, 4096)}


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
    return BenchCase(op=kind, size=size, fn=fn, args=(x, w, b, g), params={"M": M, "K": K, "N": N},
                     flops=2.0 * M * K * N, peers={"torch_eager": _torch_block(kind, M, K, N)},
                     notes="jit (XLA-fused epilogue/prologue) vs op-by-op (each primitive its own kernel "
                           "and buffer) vs PyTorch eager")


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
    return BenchCase(op="transformer_train_step", size=size, fn=fn, args=(state, batch),
                     params={"preset": "small", "d_model": 512, "layers": 6, "heads": 8, "d_ff": 2048, "batch": B,
                             "seq_len": T, "n_params": n_params, "precision": "fp32"},
                     flops=flops_per_token(cfg, T) * B * T, items_per_call=B * T, items_name="tokens",
                     op_by_op=size == "small", peers={"torch_eager": _torch_lm(B, T)},
                     notes="one AdamW step (fwd+bwd+update); MFU = gflops_per_s / measured matmul peak")


def _torch_lm(B: int, T: int):
    def build():
        import torch

        torch.manual_seed(0)
        D, L, H, F, V = 512, 6, 8, 2048, 256

        class LM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(V, D)
                self.pos = torch.nn.Parameter(torch.zeros(T, D))
                layer = torch.nn.TransformerEncoderLayer(D, H, F, dropout=0.0, activation="gelu", batch_first=True,
                                                         norm_first=True)
                self.blocks = torch.nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
                self.norm = torch.nn.LayerNorm(D)

            def forward(self, x):
                h = self.emb(x) + self.pos
                mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
                h = self.norm(self.blocks(h, mask=mask, is_causal=True))
                return h @ self.emb.weight.T

        model = LM()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tokens = torch.randint(0, V, (B, T + 1))

        def run():
            opt.zero_grad(set_to_none=True)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            return float(loss.detach())

        return run

    return build


OPS = {
    "attention_xla_grad": lambda size: _attention_grad_case("xla", size),
    "attention_chunked_grad": lambda size: _attention_grad_case("chunked", size),
    "dense_gelu": lambda size: _block_case("dense_gelu", size),
    "layernorm_dense": lambda size: _block_case("layernorm_dense", size),
    "transformer_train_step": _train_step_case,
}


def attention_memory_sweep(seq_lens=(1024, 2048, 4096, 8192, 16384), *, heads: int = 8, head_dim: int = 64,
                           block_k: int = 512) -> dict:
    """Compiled temp memory of value-and-grad of causal attention, xla vs chunked (bytes)."""
    rows = []
    for T in seq_lens:
        x = jax.ShapeDtypeStruct((1, T, heads, head_dim), jnp.float32)
        row = {"T": T}
        for impl in ("xla", "chunked"):
            loss = lambda q, k, v, impl=impl: jnp.sum(attention(q, k, v, causal=True, implementation=impl,
                                                                block_k=block_k))
            for kind, f in (("forward", loss), ("value_and_grad", jax.value_and_grad(loss, (0, 1, 2)))):
                c = jax.jit(f).lower(x, x, x).compile()
                row[f"{impl}_{kind}_temp_bytes"] = int(c.memory_analysis().temp_size_in_bytes)
        row["ratio_value_and_grad"] = row["xla_value_and_grad_temp_bytes"] / row["chunked_value_and_grad_temp_bytes"]
        row["ratio_forward"] = row["xla_forward_temp_bytes"] / max(1, row["chunked_forward_temp_bytes"])
        print(row, flush=True)
        rows.append(row)
    Ts = np.array([r["T"] for r in rows], float)
    slopes = {}
    for key in ("xla_value_and_grad_temp_bytes", "chunked_value_and_grad_temp_bytes"):
        ys = np.array([r[key] for r in rows], float)
        slopes[key] = float(np.polyfit(np.log(Ts), np.log(ys), 1)[0])
    return {"batch": 1, "heads": heads, "head_dim": head_dim, "block_k": block_k, "dtype": "float32",
            "causal": True, "rows": rows, "loglog_slope": slopes,
            "method": "jax.jit(f).lower(...).compile().memory_analysis().temp_size_in_bytes (nothing executed)"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ivhl_jax.bench.ops_transformer")
    p.add_argument("--memory", action="store_true", help="attention memory sweep T = 1k..16k")
    p.add_argument("--max-T", type=int, default=16384)
    p.add_argument("--export", help="write JSON here")
    a = p.parse_args(argv)
    if not a.memory:
        p.error("nothing to do: pass --memory (timings run through `ivhl bench --op ...`)")
    from ivhl_jax.run.device import device_report
    from ivhl_jax.run.io import write_json

    Ts = [T for T in (1024, 2048, 4096, 8192, 16384) if T <= a.max_T]
    doc = {"environment": device_report(), "attention_memory": attention_memory_sweep(Ts)}
    if a.export:
        print(f"wrote {write_json(a.export, doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
