"""Pre-norm decoder-only transformer (Flax linen): one stacked parameter tree, the layers a scan or an unrolled loop.

One block (pre-norm, residual)::

    h = x + Dropout(W_o · Attn(RoPE(W_q n(x)), RoPE(W_k n(x)), W_v n(x)))
    y = h + Dropout(W_2 · act(W_1 n(h)))

with ``n`` = RMSNorm or LayerNorm, ``act`` = GELU/SwiGLU/GeGLU/..., causal attention through
:func:`ivhl_jax.nn.attention.attention` (``xla``/``cudnn``/``chunked``/``pallas``). The ``n_layers``
blocks share a stacked parameter tree (leading axis ``"layers"``) and run either as one ``nn.scan``
(compile time does not grow with depth) or as an unrolled loop (faster on CPU; ``layer_loop``, see
:class:`Transformer`), and each block may be rematerialised (``remat`` policy):

* ``"none"``: keep every activation for the backward pass (fastest, most memory);
* ``"dots_saveable"``: keep only matmul outputs without batch dims, recompute element-wise work;
* ``"full"``: keep only each block's input, recompute the block in the backward pass.

Precision: ``precision`` names an :mod:`ivhl_jax.core.precision` policy; parameters are stored in its
``param_dtype`` (fp32 master weights), matmuls run in ``compute_dtype``, norms/softmax statistics
and the logits/loss in float32.

Logical axis names of the parameters (for sharding rules, see :func:`param_logical_axes`):

=========================  ==================================  ====================
parameter                  shape                               logical axes
=========================  ==================================  ====================
embed/embedding            (vocab, d_model)                    ("vocab", "embed")
pos_embed (no RoPE)        (max_len, d_model)                  (None, "embed")
blocks/…/attn/{q,k,v}      (layers, d_model, heads, head_dim)  ("layers", "embed", "heads", "kv")
blocks/…/attn/out          (layers, heads, head_dim, d_model)  ("layers", "heads", "kv", "embed")
blocks/…/mlp/wi/kernel     (layers, d_model, d_ff[·2 if gated])("layers", "embed", "mlp")
blocks/…/mlp/wo/kernel     (layers, d_ff, d_model)             ("layers", "mlp", "embed")
…/norm scale, bias         (layers, d_model)                   ("layers", "embed")
unembed (untied)           (d_model, vocab)                    ("embed", "vocab")
=========================  ==================================  ====================
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from ivhl_jax.core import backend, precision
from ivhl_jax.core.precision import Policy
from ivhl_jax.core.validation import check_array, check_choice, check_scalar
from ivhl_jax.models.layers import (
    ACTIVATIONS,
    GATED,
    Dense,
    DenseAct,
    apply_rope,
    get_norm,
    matmul_saving_transposed_input,
    partitioned_param,
)
from ivhl_jax.nn.attention import IMPLEMENTATIONS, attention

__all__ = [
    "TransformerConfig",
    "Transformer",
    "Block",
    "PRESETS",
    "REMAT_POLICIES",
    "LAYER_LOOPS",
    "preset",
    "init_params",
    "param_logical_axes",
    "count_params",
    "flops_per_token",
    "lm_loss_fn",
    "generate",
]

REMAT_POLICIES = ("none", "dots_saveable", "full")
LAYER_LOOPS = ("auto", "scan", "unrolled")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of :class:`Transformer` (see the module docstring)."""

    vocab_size: int = dataclasses.field(default=256, metadata={"help": "tokens in the vocabulary"})
    d_model: int = dataclasses.field(default=512, metadata={"help": "residual stream width"})
    n_layers: int = dataclasses.field(default=6, metadata={"help": "transformer blocks"})
    n_heads: int = dataclasses.field(default=8, metadata={"help": "attention heads (d_model divisible by it)"})
    d_ff: int = dataclasses.field(default=2048, metadata={"help": "hidden width of the MLP"})
    max_len: int = dataclasses.field(
        default=1024, metadata={"help": "longest sequence (RoPE table / position embedding)"}
    )
    activation: str = dataclasses.field(
        default="gelu", metadata={"help": 'MLP activation ("gelu", "swiglu", ...; gated ones use two projections)'}
    )
    norm: str = dataclasses.field(default="rmsnorm", metadata={"help": 'pre-norm type ("rmsnorm" or "layernorm")'})
    rope: bool = dataclasses.field(
        default=True, metadata={"help": "rotary position embeddings (else learned absolute positions)"}
    )
    tied_embeddings: bool = dataclasses.field(
        default=True, metadata={"help": "output projection shares the embedding matrix"}
    )
    dropout: float = dataclasses.field(default=0.0, metadata={"help": "dropout rate (training only)"})
    remat: str = dataclasses.field(
        default="none", metadata={"help": 'rematerialisation of each block: "none", "dots_saveable" or "full"'}
    )
    precision: str = dataclasses.field(
        default="fp32",
        metadata={"help": 'precision policy name (ivhl_jax.core.precision: "fp32", "bf16", "fp16", ...)'},
    )
    attention: str = dataclasses.field(
        default="auto", metadata={"help": 'attention implementation ("auto", "xla", "cudnn", "chunked", "pallas")'}
    )
    attention_block: int = dataclasses.field(
        default=128, metadata={"help": "key block of the chunked path (the Pallas path uses its own tiles)"}
    )
    layer_loop: str = dataclasses.field(
        default="auto",
        metadata={"help": '"scan", "unrolled" or "auto" (unrolled on CPU without remat): see Transformer'},
    )

    def validate(self) -> TransformerConfig:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len", "attention_block"):
            check_scalar(getattr(self, name), name, integer=True, minimum=1)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.rope and self.head_dim % 2:
            raise ValueError(f"rope needs an even head_dim (d_model/n_heads = {self.head_dim}); change n_heads")
        check_choice(self.activation, "activation", tuple(ACTIVATIONS))
        check_choice(self.norm, "norm", ("rmsnorm", "layernorm"))
        check_choice(self.remat, "remat", REMAT_POLICIES)
        check_choice(self.layer_loop, "layer_loop", LAYER_LOOPS)
        check_choice(self.attention, "attention", IMPLEMENTATIONS)
        check_scalar(self.dropout, "dropout", minimum=0.0, maximum=0.99)
        precision.get_policy(self.precision)
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def policy(self) -> Policy:
        return precision.get_policy(self.precision)

    @property
    def scan_layers(self) -> bool:
        """Whether the blocks run as one ``scan``: ``layer_loop="scan"``, or ``"auto"`` where the backend
        table's ``transformer_layer_loop`` is ``"scan"`` or with remat."""
        if self.layer_loop == "auto":
            return backend.defaults().transformer_layer_loop == "scan" or self.remat != "none"
        return self.layer_loop == "scan"


PRESETS = {
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, d_ff=256, max_len=256),
    "small": dict(d_model=512, n_layers=6, n_heads=8, d_ff=2048, max_len=1024),
    "base": dict(d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_len=2048),
}


def preset(name: str, **overrides: Any) -> TransformerConfig:
    """``tiny`` (64/2/4), ``small`` (512/6/8) or ``base`` (768/12/12), with field overrides."""
    check_choice(name, "preset", tuple(PRESETS))
    return TransformerConfig(**{**PRESETS[name], **overrides}).validate()


def _remat_policy(name: str):
    if name == "dots_saveable":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    return None  # "full": save nothing but the block input


class Block(nn.Module):
    """One pre-norm block; ``__call__(x) -> (x, None)`` so it can be the body of ``nn.scan``."""

    cfg: TransformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, _=None):
        cfg = self.cfg
        dt = cfg.policy.compute_dtype
        pdt = cfg.policy.param_dtype
        N, Hd, D = cfg.n_heads, cfg.head_dim, cfg.d_model
        init = nn.initializers.lecun_normal(in_axis=0, out_axis=(1, 2))

        def proj(name: str) -> jax.Array:
            return partitioned_param(self, name, init, (D, N, Hd), ("embed", "heads", "kv"), pdt)

        out_init = nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2)
        h = get_norm(cfg.norm, dtype=dt, param_dtype=pdt, name="attn_norm")(x)
        q = jnp.einsum("btd,dnh->btnh", h, proj("q").astype(dt))
        k = jnp.einsum("btd,dnh->btnh", h, proj("k").astype(dt))
        v = jnp.einsum("btd,dnh->btnh", h, proj("v").astype(dt))
        if cfg.rope:
            q, k = apply_rope(q), apply_rope(k)
        o = attention(
            q,
            k,
            v,
            causal=True,
            implementation=cfg.attention,
            block_k=cfg.attention_block if cfg.attention == "chunked" else None,
        )
        wo = partitioned_param(self, "out", out_init, (N, Hd, D), ("heads", "kv", "embed"), pdt).astype(dt)
        if backend.defaults().transposed_save_matmul and not cfg.scan_layers:
            # Its weight gradient contracts the tokens of o and of the residual stream's cotangent; unrolled,
            # XLA:CPU would write that cotangent transposed, fused with the norm's backward. Saving o
            # transposed instead keeps the gradient a row-major matmul.
            a = matmul_saving_transposed_input(o.reshape(*o.shape[:2], N * Hd), wo.reshape(N * Hd, D))
        else:
            a = jnp.einsum("btnh,nhd->btd", o, wo)
        x = x + nn.Dropout(cfg.dropout)(a, deterministic=self.deterministic).astype(x.dtype)
        h = get_norm(cfg.norm, dtype=dt, param_dtype=pdt, name="mlp_norm")(x)
        h = DenseAct(cfg.d_ff, activation=cfg.activation, dtype=dt, param_dtype=pdt, name="wi")(h)  # embed -> mlp
        h = Dense(D, axes=("mlp", "embed"), dtype=dt, param_dtype=pdt, name="wo")(h)
        x = x + nn.Dropout(cfg.dropout)(h, deterministic=self.deterministic).astype(x.dtype)
        return x, None


def _layer_fence(x: jax.Array) -> jax.Array:
    """Identity on ``x`` that XLA cannot fuse across: a ``lax.cond`` on a predicate known only at run time.

    Between unrolled layers it keeps XLA:CPU from fusing the residual stream's cotangent of every later layer
    into each consumer (fusions of hundreds of ops that recompute it, slower than the scan).
    ``lax.optimization_barrier`` does not do this on CPU: XLA removes
    it before fusion. The predicate ``x[0] == x[0]`` is false only for NaN, and then the other branch returns
    ``x`` too, so values and derivatives are the identity's in every mode (the JVP and the transpose of a
    ``cond`` are ``cond``s, which fence the backward pass as well); under ``vmap`` the predicate is batched and
    the ``cond`` becomes a ``select``, which only loses the fence.
    """
    first = x.reshape(-1)[0]
    return jax.lax.cond(first == first, lambda v: v, lambda v: v * 1, x)


class Transformer(nn.Module):
    """Decoder-only LM: ``tokens [B, T] int -> logits [B, T, vocab] float32``.

    The blocks share one stacked parameter tree (``blocks/…`` with a leading ``"layers"`` axis) however they
    run (``cfg.layer_loop``):

    * ``"scan"``: one ``nn.scan`` over the layers; compile time does not grow with depth.
    * ``"unrolled"``: a Python loop over the layers (``params[i]`` of the same tree), with
      :func:`_layer_fence` between them; compile time grows with depth. On CPU it is faster: the scan writes
      every intermediate the backward pass needs into zero-filled ``[layers, ...]`` buffers and copies it back
      out (dynamic-update-slice, dynamic-slice); ``bench/results/transformer_cpu_vs_torch.json`` has the
      timings (``python -m ivhl_jax.bench.ops_transformer --vs-torch``).
    * ``"auto"`` (default): the backend table's ``transformer_layer_loop`` (``"unrolled"`` on CPU, ``"scan"``
      elsewhere) without remat, ``"scan"`` with remat. Remat needs the scan on
      CPU: there XLA removes the barrier that keeps a rematerialised layer from being merged back into the
      forward pass, so the unrolled loop would keep every activation whatever the policy (same compiled
      temporaries for all three policies, measured), and asking for both is an error.

    Parameters are initialised by the scan in every mode, so both give the same tree from the same key; with
    dropout, the per-layer dropout keys differ between the two (the unrolled loop folds the layer index into
    the module's ``"dropout"`` key).
    """

    cfg: TransformerConfig

    @nn.compact
    def __call__(self, tokens, *, deterministic: bool = True):
        cfg = self.cfg
        dt, pdt = cfg.policy.compute_dtype, cfg.policy.param_dtype
        T = tokens.shape[-1]
        if T > cfg.max_len:
            raise ValueError(f"sequence length {T} exceeds max_len={cfg.max_len}")
        emb = partitioned_param(
            self, "embedding", nn.initializers.normal(1.0), (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), pdt
        )
        x = jnp.take(emb, tokens, axis=0).astype(dt)
        if not cfg.rope:
            pos = partitioned_param(
                self, "pos_embed", nn.initializers.normal(0.02), (cfg.max_len, cfg.d_model), (None, "embed"), pdt
            )
            x = x + pos[:T].astype(dt)
        if cfg.scan_layers or self.is_initializing():
            block = Block
            if cfg.remat != "none":
                block = nn.remat(Block, prevent_cse=False, policy=_remat_policy(cfg.remat))
            stack = nn.scan(
                block,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                length=cfg.n_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = stack(cfg, deterministic, name="blocks")(x)
        else:
            x = self._unrolled_blocks(x, deterministic)
        x = get_norm(cfg.norm, dtype=dt, param_dtype=pdt, name="final_norm")(x)
        if cfg.tied_embeddings:
            logits = jnp.einsum("btd,vd->btv", x, emb.astype(dt)) * (1.0 / math.sqrt(cfg.d_model))
        else:
            w = partitioned_param(
                self, "unembed", nn.initializers.lecun_normal(), (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), pdt
            )
            logits = x @ w.astype(dt)
        return logits.astype(jnp.float32)

    def _unrolled_blocks(self, x, deterministic: bool):
        cfg = self.cfg
        if cfg.remat != "none" and backend.platform() == "cpu":
            raise ValueError(
                f"remat={cfg.remat!r} has no effect with layer_loop='unrolled' on CPU (XLA merges the "
                "recomputation back into the forward pass); use layer_loop='scan' or 'auto' with remat"
            )
        stacked = nn.meta.unbox(self.variables["params"]["blocks"])
        block = Block(cfg, deterministic)
        dropout_key = None if deterministic or cfg.dropout == 0.0 else self.make_rng("dropout")

        def layer(params, x, key):
            return block.apply({"params": params}, x, rngs=None if key is None else {"dropout": key})[0]

        if cfg.remat != "none":  # off CPU only (refused above)
            layer = jax.checkpoint(layer, policy=_remat_policy(cfg.remat))
        for i in range(cfg.n_layers):
            key = None if dropout_key is None else jax.random.fold_in(dropout_key, i)
            x = layer(jax.tree.map(lambda a, i=i: a[i], stacked), _layer_fence(x), key)
        return _layer_fence(x)


def init_params(cfg: TransformerConfig, key: jax.Array, seq_len: int = 8) -> Any:
    """Unboxed parameter tree (``param_dtype``) of :class:`Transformer`."""
    cfg.validate()
    tokens = jnp.zeros((1, min(seq_len, cfg.max_len)), jnp.int32)
    return jax.jit(lambda k: nn.meta.unbox(Transformer(cfg).init(k, tokens)["params"]))(key)


def param_logical_axes(cfg: TransformerConfig) -> Any:
    """Tree (same structure as :func:`init_params`) of ``PartitionSpec`` with *logical* axis names.

    Map it to mesh axes with ``flax.linen.logical_to_mesh_axes(spec, rules)``, e.g. rules
    ``(("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("vocab", "tensor"), ("layers", None),
    ("kv", None))``.
    """
    tokens = jnp.zeros((1, 8), jnp.int32)
    boxed = jax.eval_shape(lambda k: Transformer(cfg).init(k, tokens), jax.random.key(0))
    return nn.get_partition_spec(boxed)["params"]


def count_params(params: Any) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))


def flops_per_token(cfg: TransformerConfig, seq_len: int) -> float:
    """Training FLOPs per token (PaLM appendix B): ``6·N + 12·L·d·T`` with N the non-embedding matmul
    parameters (+ the unembedding matmul) and the attention term for context length T."""
    L, D = cfg.n_layers, cfg.d_model
    ff_in = cfg.d_ff * (2 if cfg.activation in GATED else 1)
    n_matmul = L * (4 * D * D + D * ff_in + cfg.d_ff * D) + D * cfg.vocab_size
    return 6.0 * n_matmul + 12.0 * L * D * seq_len


def lm_loss_fn(cfg: TransformerConfig):
    """``loss_fn(params, batch, key, extra) -> (loss, (metrics, extra))`` for ``ivhl_jax.train.training``.

    ``batch``: integer tokens ``[B, T+1]``; inputs ``[:, :-1]``, targets ``[:, 1:]``. The loss is
    the mean next-token cross-entropy in nats (float32); metrics add ``bits_per_token`` and
    ``accuracy``.
    """
    model = Transformer(cfg)

    def loss_fn(params, batch, key, extra):
        tokens = check_array(batch, "batch", ndim=2, kind="integer").astype(jnp.int32)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = _logits(model, params, inputs, dropout_key=None if cfg.dropout == 0.0 else key)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        loss = jnp.mean(nll)
        acc = jnp.mean((jnp.argmax(logits, -1) == targets).astype(jnp.float32))
        return loss, ({"bits_per_token": loss / jnp.log(2.0), "accuracy": acc}, extra)

    return loss_fn


def _logits(model: Transformer, params: Any, tokens: jax.Array, *, dropout_key: jax.Array | None = None) -> jax.Array:
    """``model``'s logits ``[B, T, vocab]`` for ``tokens [B, T]``; dropout on with ``dropout_key``."""
    rngs = None if dropout_key is None else {"dropout": dropout_key}
    # Flax types `apply` as `output | (output, variables)`; the pair comes only with mutable collections.
    return cast(jax.Array, model.apply({"params": params}, tokens, deterministic=dropout_key is None, rngs=rngs))


def generate(
    cfg: TransformerConfig,
    params: Any,
    prompt: jax.Array,
    n_new: int,
    key: jax.Array,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> jax.Array:
    """Sample ``n_new`` tokens after ``prompt [P]`` (ancestral sampling, temperature, optional top-k).

    The sequence lives in a fixed buffer of length ``P + n_new`` (``<= max_len``) and each step
    re-runs the causal model on the whole buffer (no KV cache: simple and exact, O(T²) per token —
    fine for the small models trained here). Returns the tokens ``[P + n_new]``.
    """
    prompt = check_array(prompt, "prompt", ndim=1, kind="integer").astype(jnp.int32)
    check_scalar(n_new, "n_new", integer=True, minimum=1)
    check_scalar(temperature, "temperature", positive=True)
    P = prompt.shape[0]
    total = P + n_new
    if P < 1 or total > cfg.max_len:
        raise ValueError(f"need 1 <= len(prompt) and len(prompt) + n_new <= max_len={cfg.max_len}, got {P} + {n_new}")
    model = Transformer(cfg)
    buf = jnp.zeros((total,), jnp.int32).at[:P].set(prompt)

    def step(carry, t):
        buf, key = carry
        key, sub = jax.random.split(key)
        logits = _logits(model, params, buf[None])[0, t - 1] / temperature
        if top_k is not None:
            kth = jnp.sort(logits)[-top_k]
            logits = jnp.where(logits < kth, -jnp.inf, logits)
        tok = jax.random.categorical(sub, logits).astype(jnp.int32)
        return (buf.at[t].set(tok), key), None

    (buf, _), _ = jax.lax.scan(step, (buf, key), jnp.arange(P, total))
    return buf
