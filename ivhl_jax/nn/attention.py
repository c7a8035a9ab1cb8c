"""Scaled dot-product attention with interchangeable implementations.

.. math::  O = \\mathrm{softmax}\\big(s\\, Q K^\\top + \\log M\\big)\\, V,\\qquad s = 1/\\sqrt{H}

Layout ``[batch, time, heads, head_dim]`` (``B, T, N, H``), as ``jax.nn.dot_product_attention``.
``M`` is a boolean mask (True = attend) broadcastable to ``[B, N, Tq, Tk]``; ``causal`` adds
``q_index >= k_index`` (queries and keys aligned at position 0).

Implementations (one function, one semantics), and where each is the fast one:

* ``"xla"`` — materialises the ``[B, N, Tq, Tk]`` score matrix, so forward and backward memory
  is O(T²). Where the backend table sets ``attention_dense`` (the CPU row) it is the library's dense
  kernel (``_dense``): heads-major ``[B, N, T, H]`` matmuls, one softmax pass, and a ``custom_vjp``
  whose backward uses ``rowsum(dP∘P) = rowsum(dO∘O)`` (a reduction over ``H`` instead of ``Tk``)
  and reuses the saved probabilities; causal attention (T ≥ 128) splits the queries into up to 8
  blocks, each multiplied only against the keys it can see (9/16 of the work at 8 blocks). Elsewhere
  it is ``jax.nn.dot_product_attention(implementation="xla")``. **Fastest on CPU**
  (``bench/results/transformer_cpu_vs_torch.json``).
* ``"cudnn"`` — cuDNN flash attention (GPU, bf16/fp16, head_dim ≤ 128/256). If cuDNN rejects the
  shape, dtype or platform, the call falls back to ``"xla"`` with a warning (never silently wrong).
  **Fastest on GPU** for bf16/fp16 (``bench/results/gpu_h100.json``).
* ``"auto"`` — the backend table's ``attention_half`` for bf16/fp16 inputs (``"cudnn"`` on GPU),
  otherwise ``"xla"``.
* ``"chunked"`` — pure-JAX memory-efficient attention (Rabe & Staats 2021; FlashAttention-2's
  recurrences): a ``lax.scan`` over key blocks with an online softmax (running max ``m``,
  normaliser ``l``), and a ``custom_vjp`` whose backward pass re-computes each block's
  probabilities from the saved log-sum-exp ``L = m + log l``. Only ``Q, K, V, O, L`` are saved, so
  forward *and* backward memory is O(T · block) instead of O(T²). Any backend, any mask.
* ``"pallas"`` — the Pallas flash-attention kernels JAX ships
  (``jax.experimental.pallas.ops.gpu.attention.mha``: a Triton forward and a fused Triton backward),
  compiled on GPU; on TPU JAX's TPU flash attention
  (``jax.experimental.pallas.ops.tpu.flash_attention``, tiles of 128; its adapter is tested on CPU
  against that module's reference, the kernel itself is not measured here); elsewhere the GPU kernel
  runs in the Pallas interpreter (``interpret=True``, the default off GPU and TPU), which checks the
  same kernel code on CPU but is slow. They take causal masking but no boolean
  ``mask``, need ``Tq == Tk`` and float32/bf16/fp16: other calls run ``"chunked"`` with a warning. On
  a GPU, cuDNN (``"cudnn"``) remains the fast path for bf16/fp16; ``bench/gpu_checks.py`` compares them.

All accumulate in float32 (float64 if the inputs are float64) and return the query dtype.

Fully masked rows: a query row for which no key is allowed (by ``mask`` and ``causal`` together)
outputs exactly 0, in every implementation (``xla``/``cudnn`` zero such rows explicitly; jax's
large-negative-bias convention would otherwise give the mean of ``V``). Gradients through such rows
are 0 and finite. ``k``/``v`` with zero keys (``Tk == 0``) are rejected with a ``ValueError``; mask
every key instead if an empty context must be expressed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
from jax import lax

from ivhl_jax.core import backend
from ivhl_jax.core.validation import check_array, check_choice, check_scalar

__all__ = ["IMPLEMENTATIONS", "reference_attention", "attention", "attention_flops"]

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "chunked", "pallas")


# --------------------------------------------------------------------------- validation helpers


def _check_qkv(q, k, v):
    q = check_array(q, "q", ndim=4, kind="floating")
    k = check_array(k, "k", ndim=4, kind="floating")
    v = check_array(v, "v", ndim=4, kind="floating")
    B, Tq, N, H = q.shape
    if k.shape[0] != B or k.shape[2] != N or k.shape[3] != H:
        raise ValueError(f"k must have shape [B={B}, Tk, N={N}, H={H}] matching q {q.shape}, got {k.shape}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must have shape [B, Tk, N] = {k.shape[:3]} (+ head_dim), got {v.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[1] == 0:
        raise ValueError(
            f"k must have at least one key (Tk >= 1), got shape {k.shape}; to attend to nothing, "
            "pass a mask that is False everywhere (fully masked rows output 0)"
        )
    return q, k, v


def _check_scale(scale, H):
    """Default ``1/sqrt(H)``; otherwise a finite Python/NumPy number > 0."""
    if scale is None:
        return 1.0 / math.sqrt(H)
    if isinstance(scale, jax.core.Tracer):
        raise TypeError("scale must be a concrete number (it is static); pass a Python float, not a traced value")
    check_scalar(scale, "scale", positive=True)
    return float(scale)


def _zero_masked_rows(out, allowed):
    """Set to 0 the query rows in which no key is allowed (``allowed`` broadcastable to [B, N, Tq, Tk])."""
    if allowed is None:
        return out
    any_key = jnp.any(allowed, axis=-1)  # [b, n, Tq] (b, n may be 1)
    any_key = jnp.swapaxes(any_key, 1, 2)[..., None]  # [b, Tq, n, 1]
    return jnp.where(any_key, out, jnp.zeros((), out.dtype))


def _normalise_mask(mask, B, N, Tq, Tk):
    """Boolean mask as a 4-D array broadcastable to [B, N, Tq, Tk] (size-1 axes kept size 1)."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"mask must be boolean (True = attend), got dtype {mask.dtype}")
    if mask.ndim > 4:
        raise ValueError(f"mask must have at most 4 dims broadcastable to [B, N, Tq, Tk], got {mask.shape}")
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    for size, full, name in zip(mask.shape, (B, N, Tq, Tk), ("B", "N", "Tq", "Tk")):
        if size not in (1, full):
            raise ValueError(
                f"mask shape {mask.shape} is not broadcastable to [B, N, Tq, Tk] = {(B, N, Tq, Tk)} (axis {name})"
            )
    return mask


def _acc_dtype(dtype):
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


# --------------------------------------------------------------------------- reference (O(T^2))


def reference_attention(q, k, v, *, mask=None, causal=False, scale=None):
    """Plain softmax attention in the accumulation dtype (the definition; O(T²) memory)."""
    q, k, v = _check_qkv(q, k, v)
    B, Tq, N, H = q.shape
    Tk = k.shape[1]
    scale = _check_scale(scale, H)
    acc = _acc_dtype(q.dtype)
    s = jnp.einsum("bqnh,bknh->bnqk", q.astype(acc), k.astype(acc)) * scale
    allowed = _full_mask(_normalise_mask(mask, B, N, Tq, Tk), causal, B, N, Tq, Tk)
    if allowed is not None:
        s = jnp.where(allowed, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m)
    den = jnp.sum(p, axis=-1, keepdims=True)
    p = p / jnp.where(den > 0, den, 1.0)
    return jnp.einsum("bnqk,bknh->bqnh", p, v.astype(acc)).astype(q.dtype)


def _full_mask(mask, causal, B, N, Tq, Tk):
    if causal:
        c = jnp.arange(Tq)[:, None] >= jnp.arange(Tk)[None, :]
        mask = c[None, None] if mask is None else mask & c
    return mask


# --------------------------------------------------------------------------- chunked (custom VJP)


def _block_allowed(mask_blk, causal, q_pos, k_pos, tk):
    """Boolean [.., Tq, bk] of attended pairs in one key block (None = all)."""
    allowed = (k_pos < tk)[None, :]  # padded keys never attend
    if causal:
        allowed = allowed & (q_pos[:, None] >= k_pos[None, :])
    allowed = allowed[None, None]
    if mask_blk is not None:
        allowed = allowed & mask_blk
    return allowed


def _pad_keys(k, v, mask, block_k):
    tk = k.shape[1]
    nb = -(-tk // block_k)
    pad = nb * block_k - tk
    if pad:
        k = jnp.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0)))
        if mask is not None and mask.shape[3] != 1:
            mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 0), (0, pad)))
    return k, v, mask, nb


def _mask_block(mask, j, block_k):
    if mask is None:
        return None
    if mask.shape[3] == 1:
        return mask
    return lax.dynamic_slice_in_dim(mask, j * block_k, block_k, axis=3)


def _chunked_fwd_impl(q, k, v, mask, causal, scale, block_k):
    """Online-softmax forward. Returns (O [B,Tq,N,H], L [B,N,Tq]) with L the row log-sum-exp."""
    B, Tq, N, H = q.shape
    tk = k.shape[1]
    acc = _acc_dtype(q.dtype)
    kp, vp, maskp, nb = _pad_keys(k, v, mask, block_k)
    qs = q.astype(acc) * scale
    q_pos = jnp.arange(Tq)

    def body(carry, j):
        m, l, o = carry
        kb = lax.dynamic_slice_in_dim(kp, j * block_k, block_k, axis=1).astype(acc)
        vb = lax.dynamic_slice_in_dim(vp, j * block_k, block_k, axis=1).astype(acc)
        s = jnp.einsum("bqnh,bknh->bnqk", qs, kb)
        k_pos = j * block_k + jnp.arange(block_k)
        allowed = _block_allowed(_mask_block(maskp, j, block_k), causal, q_pos, k_pos, tk)
        s = jnp.where(allowed, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - m_safe[..., None])
        corr = jnp.exp(jnp.where(jnp.isfinite(m), m, 0.0) - m_safe) * jnp.isfinite(m)
        l = l * corr + jnp.sum(p, axis=-1)
        o = o * jnp.swapaxes(corr, 1, 2)[..., None] + jnp.einsum("bnqk,bknh->bqnh", p, vb)
        return (m_new, l, o), None

    init = (jnp.full((B, N, Tq), -jnp.inf, acc), jnp.zeros((B, N, Tq), acc), jnp.zeros((B, Tq, N, H), acc))
    (m, l, o), _ = lax.scan(body, init, jnp.arange(nb))
    ok = l > 0
    o = o / jnp.swapaxes(jnp.where(ok, l, 1.0), 1, 2)[..., None]
    lse = jnp.where(ok, jnp.where(jnp.isfinite(m), m, 0.0) + jnp.log(jnp.where(ok, l, 1.0)), jnp.inf)
    return o.astype(q.dtype), lse


def _chunked_bwd_impl(q, k, v, mask, o, lse, do, causal, scale, block_k):
    """FlashAttention-2 backward over key blocks: recompute P = exp(sQK^T - L) block by block."""
    B, Tq, N, H = q.shape
    tk = k.shape[1]
    acc = _acc_dtype(q.dtype)
    kp, vp, maskp, nb = _pad_keys(k, v, mask, block_k)
    qa = q.astype(acc)
    doa = do.astype(acc)
    delta = jnp.einsum("bqnh,bqnh->bnq", doa, o.astype(acc))  # D_i = sum_h dO_ih O_ih
    q_pos = jnp.arange(Tq)

    def body(dq, j):
        kb = lax.dynamic_slice_in_dim(kp, j * block_k, block_k, axis=1).astype(acc)
        vb = lax.dynamic_slice_in_dim(vp, j * block_k, block_k, axis=1).astype(acc)
        s = jnp.einsum("bqnh,bknh->bnqk", qa, kb) * scale
        k_pos = j * block_k + jnp.arange(block_k)
        allowed = _block_allowed(_mask_block(maskp, j, block_k), causal, q_pos, k_pos, tk)
        p = jnp.where(allowed, jnp.exp(s - lse[..., None]), 0.0)
        dv = jnp.einsum("bnqk,bqnh->bknh", p, doa)
        dp = jnp.einsum("bqnh,bknh->bnqk", doa, vb)
        ds = p * (dp - delta[..., None]) * scale
        dq = dq + jnp.einsum("bnqk,bknh->bqnh", ds, kb)
        dk = jnp.einsum("bnqk,bqnh->bknh", ds, qa)
        return dq, (dk, dv)

    dq, (dk, dv) = lax.scan(body, jnp.zeros((B, Tq, N, H), acc), jnp.arange(nb))
    # (nb, B, bk, N, H) -> (B, nb*bk, N, H), then drop the padding.
    dk = jnp.moveaxis(dk, 0, 1).reshape(B, nb * block_k, N, H)[:, :tk]
    dv = jnp.moveaxis(dv, 0, 1).reshape(B, nb * block_k, N, H)[:, :tk]
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _chunked(q, k, v, mask, causal, scale, block_k):
    return _chunked_fwd_impl(q, k, v, mask, causal, scale, block_k)[0]


def _chunked_fwd(q, k, v, mask, causal, scale, block_k):
    o, lse = _chunked_fwd_impl(q, k, v, mask, causal, scale, block_k)
    return o, (q, k, v, mask, o, lse)


def _chunked_bwd(causal, scale, block_k, res, do):
    q, k, v, mask, o, lse = res
    dq, dk, dv = _chunked_bwd_impl(q, k, v, mask, o, lse, do, causal, scale, block_k)
    return dq, dk, dv, None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


# --------------------------------------------------------------------------- Pallas (JAX's shipped kernel)


def pallas_tile(n: int) -> int:
    """The smallest power of two >= max(n, 16) (Triton's dot needs power-of-two tiles of at least 16)."""
    return 1 << max(4, (int(n) - 1).bit_length())


def _pallas_fits(q, k, mask) -> str | None:
    """Why JAX's Pallas GPU attention kernel cannot take this call (None: it can)."""
    if mask is not None:
        return "it takes no boolean mask (only causal masking)"
    if q.shape[1] != k.shape[1]:
        return f"it needs Tq == Tk, got Tq={q.shape[1]}, Tk={k.shape[1]}"
    if jnp.dtype(q.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"it runs float32/bfloat16/float16, got {q.dtype}"
    return None


def _pallas_gpu(q, k, v, causal, scale, block_q, block_k, interpret):
    """``jax.experimental.pallas.ops.gpu.attention.mha`` (forward and fused backward, both Pallas/Triton).

    T is padded to a multiple of the tiles; padded keys are excluded by causality or, without it, by
    segment ids (real positions 0, padding 1), and padded query rows are dropped.
    """
    from jax.experimental.pallas.ops.gpu import attention as jax_attention

    B, T, N, H = q.shape
    cap = pallas_tile(T)
    bq, bk = min(pallas_tile(block_q), cap), min(pallas_tile(block_k), cap)
    bwd = min(32, bq, bk)
    q, k, v, segment_ids = _pad_sequence(q, k, v, max(bq, bk), causal)
    sizes = jax_attention.BlockSizes(
        block_q=bq, block_k=bk, block_q_dkv=bwd, block_kv_dkv=bwd, block_q_dq=bwd, block_kv_dq=bwd
    )
    out = jax_attention.mha(q, k, v, segment_ids, sm_scale=scale, causal=causal, block_sizes=sizes, interpret=interpret)
    return out[:, :T]


def _pad_sequence(q, k, v, step: int, causal: bool):
    """``q, k, v`` [B, T, N, H] with T padded up to a multiple of ``step``, and the segment ids [B, Tp] that keep
    the padded keys out of a non-causal softmax (1 on padded positions; None when causal or nothing is padded:
    causality alone excludes keys after the last real query)."""
    B, T = q.shape[:2]
    tp = -(-T // step) * step
    if tp == T:
        return q, k, v, None
    q, k, v = (jnp.pad(x, ((0, 0), (0, tp - T), (0, 0), (0, 0))) for x in (q, k, v))
    ids = None if causal else jnp.broadcast_to((jnp.arange(tp) >= T).astype(jnp.int32), (B, tp))
    return q, k, v, ids


def _pallas_tpu(q, k, v, causal, scale, block_q, block_k):
    """``jax.experimental.pallas.ops.tpu.flash_attention.flash_attention`` (Mosaic forward and backward).

    Layout [B, N, T, H]; T padded to a multiple of the tiles (multiples of 128), padded keys excluded by
    causality or by segment ids, padded query rows dropped.
    """
    from jax.experimental.pallas.ops.tpu import flash_attention as tpu_attention

    B, T, N, H = q.shape
    bq, bk = (-(-max(b, 1) // 128) * 128 for b in (block_q, block_k))
    q, k, v, ids = _pad_sequence(q, k, v, math.lcm(bq, bk), causal)
    segment_ids = None if ids is None else tpu_attention.SegmentIds(q=ids, kv=ids)
    # every tile along the queries is bq and along the keys bk (forward, dkv and dq passes), one batch row a tile:
    # each field block_<axis>[_...] takes its axis's size
    tile = {"q": bq, "k": bk, "b": 1}
    sizes = tpu_attention.BlockSizes(
        **{f.name: tile[f.name.split("_")[1]] for f in dataclasses.fields(tpu_attention.BlockSizes)}
    )
    qt, kt, vt = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    out = tpu_attention.flash_attention(qt, kt, vt, None, segment_ids, causal=causal, sm_scale=scale, block_sizes=sizes)
    return jnp.swapaxes(out, 1, 2)[:, :T]


# --------------------------------------------------------------------------- dense (custom VJP)


# Causal attention: query block i (rows i·b .. (i+1)·b) can only see keys 0 .. (i+1)·b, so each block multiplies
# against that key prefix only: (n+1)/(2n) of the dense matmuls and probabilities (0.56 for n = 8). Up to 8 blocks
# of at least 64 rows: smaller blocks cost more in per-matmul overhead than they save.
def _causal_blocks(T: int) -> int:
    """Number of query blocks of the dense kernel for causal length T (1: one block, all keys)."""
    for n in (8, 4, 2):
        if T % n == 0 and T // n >= 64:
            return n
    return 1


def _dense_fwd_impl(q, k, v, mask, causal, scale):
    """Materialised softmax attention in [B, N, T, H] layout, by query blocks (one unless causal; each block
    against the keys it can see). Returns (O [B,Tq,N,H], residuals)."""
    acc = _acc_dtype(q.dtype)
    B, Tq, N, H = q.shape
    Tk = k.shape[1]
    qt, kt, vt = (jnp.swapaxes(x.astype(acc), 1, 2) for x in (q, k, v))  # [B, N, T, H]
    b = Tq // (_causal_blocks(Tq) if causal else 1)
    outs, probs = [], []
    for lo in range(0, Tq, b):
        hi = lo + b if causal else Tk  # keys this block can see
        s = jnp.einsum("bnqh,bnkh->bnqk", qt[:, :, lo : lo + b] * jnp.asarray(scale, acc), kt[:, :, :hi])
        allowed = mask  # size-1 axes broadcast: only full query / key axes are cut to the block
        if allowed is not None and allowed.shape[2] > 1:
            allowed = allowed[:, :, lo : lo + b]
        if allowed is not None and allowed.shape[3] > 1:
            allowed = allowed[..., :hi]
        if causal:
            c = jnp.arange(lo, lo + b)[:, None] >= jnp.arange(hi)[None, :]
            allowed = c if allowed is None else allowed & c
        if allowed is not None:
            s = jnp.where(allowed, s, -jnp.inf)
        m = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))  # fully masked row: all zeros
        den = jnp.sum(p, axis=-1, keepdims=True)
        p = p * (1.0 / jnp.where(den > 0, den, 1.0))
        outs.append(jnp.einsum("bnqk,bnkh->bnqh", p, vt[:, :, :hi]))
        probs.append(p)
    o = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)
    return jnp.swapaxes(o, 1, 2).astype(q.dtype), (qt, kt, vt, tuple(probs), o)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _dense(q, k, v, mask, causal, scale):
    return _dense_fwd_impl(q, k, v, mask, causal, scale)[0]


def _dense_fwd(q, k, v, mask, causal, scale):
    out, res = _dense_fwd_impl(q, k, v, mask, causal, scale)
    dtypes = tuple(jnp.zeros((0,), x.dtype) for x in (q, k, v))  # residuals must be arrays
    return out, (res, dtypes)


def _dense_bwd(causal, scale, res, do):
    (qt, kt, vt, probs, o), (qd, kd, vd) = res
    acc = o.dtype
    b = qt.shape[2] // len(probs)
    dot = jnp.swapaxes(do.astype(acc), 1, 2)  # [B, N, Tq, H]
    delta = jnp.sum(dot * o, axis=-1, keepdims=True)  # rowsum(dP * P) = rowsum(dO * O)
    dq, dks, dvs = [], [], []
    for i, p in enumerate(probs):
        lo, hi = i * b, p.shape[-1]  # the block's rows and its key prefix
        d_o = dot[:, :, lo : lo + b]
        dvs.append(jnp.einsum("bnqk,bnqh->bnkh", p, d_o))
        ds = (
            p * (jnp.einsum("bnqh,bnkh->bnqk", d_o, vt[:, :, :hi]) - delta[:, :, lo : lo + b]) * jnp.asarray(scale, acc)
        )
        dq.append(jnp.einsum("bnqk,bnkh->bnqh", ds, kt[:, :, :hi]))
        dks.append(jnp.einsum("bnqk,bnqh->bnkh", ds, qt[:, :, lo : lo + b]))
    dk, dv = dks[-1], dvs[-1]  # the last block sees every key; the others add into their prefixes
    for dki, dvi in zip(dks[:-1], dvs[:-1]):
        dk = dk.at[:, :, : dki.shape[2]].add(dki)
        dv = dv.at[:, :, : dvi.shape[2]].add(dvi)
    back = lambda x, like: jnp.swapaxes(x, 1, 2).astype(like.dtype)
    return back(dq[0] if len(dq) == 1 else jnp.concatenate(dq, axis=2), qd), back(dk, kd), back(dv, vd), None


_dense.defvjp(_dense_fwd, _dense_bwd)


# --------------------------------------------------------------------------- XLA / cuDNN


def _xla(q, k, v, mask, causal, scale, implementation):
    if implementation == "xla" and backend.defaults().attention_dense:
        # Our dense kernel (f32 accumulation; also covers XLA:CPU's missing f16 x f16 -> f32 dot).
        return _dense(q, k, v, mask, causal, scale)
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask, scale=scale, is_causal=causal, implementation=implementation
    )


def _cudnn_or_fallback(q, k, v, mask, causal, scale):
    try:
        return _xla(q, k, v, mask, causal, scale, "cudnn")
    except Exception as e:  # cuDNN raises on unsupported dtype/shape/platform: fall back, loudly
        warnings.warn(
            f"cuDNN attention unavailable for q{tuple(q.shape)} {q.dtype} on "
            f"{backend.platform()} ({type(e).__name__}: {str(e)[:160]}); using the XLA path",
            RuntimeWarning,
            stacklevel=3,
        )
        return _xla(q, k, v, mask, causal, scale, "xla")


# --------------------------------------------------------------------------- public entry point


def attention(
    q,
    k,
    v,
    *,
    mask=None,
    causal: bool = False,
    implementation: str = "auto",
    scale: float | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Scaled dot-product attention ``softmax(scale·QKᵀ + log mask) V``.

    Args:
      q: queries ``[B, Tq, N, H]``.
      k: keys ``[B, Tk, N, H]`` (same dtype as ``q``; Tk >= 1).
      v: values ``[B, Tk, N, H]`` (same dtype).
      mask: optional boolean, True = attend, broadcastable to ``[B, N, Tq, Tk]`` (e.g. a key
        padding mask ``valid[:, None, None, :]``).
      causal: forbid attending to later positions (``k_index > q_index``).
      implementation: ``"auto" | "xla" | "cudnn" | "chunked" | "pallas"`` (see module docstring).
      scale: logit scale, a finite number > 0; default ``1/sqrt(H)``.
      block_q: query tile of the Pallas path (rounded up to a power of two >= 16, at most the padded
        T; T need not be a multiple); default 128.
      block_k: key tile of the chunked path (default 128) and of the Pallas path (as ``block_q``).
      interpret: run the Pallas GPU kernel in the interpreter; default True unless running on GPU
        (on TPU the default runs the TPU kernel).

    Returns:
      ``[B, Tq, N, H]`` in q's dtype. Works under ``jit``, ``vmap`` and ``grad``. A query row with no
      allowed key (every key masked) is exactly 0 in every implementation, with finite (zero)
      gradients.

    Raises:
      ValueError: ``k`` has no keys (``Tk == 0``), ``scale`` is NaN/inf or <= 0, or shapes mismatch.
    """
    check_choice(implementation, "implementation", IMPLEMENTATIONS)
    q, k, v = _check_qkv(q, k, v)
    B, Tq, N, H = q.shape
    Tk = k.shape[1]
    for name, blk in (("block_q", block_q), ("block_k", block_k)):
        if blk is not None:
            check_scalar(blk, name, integer=True, minimum=1)
    if causal and Tq != Tk:
        raise ValueError(f"causal attention needs Tq == Tk (aligned positions), got Tq={Tq}, Tk={Tk}")
    scale = _check_scale(scale, H)
    mask = _normalise_mask(mask, B, N, Tq, Tk)
    impl = implementation
    half = jnp.dtype(q.dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    if impl == "auto":
        impl = backend.defaults().attention_half if half else "xla"
    if impl == "pallas":
        why = _pallas_fits(q, k, mask)
        if why is None and interpret is None and backend.platform() == "tpu":
            return _pallas_tpu(q, k, v, causal, scale, block_q or 128, block_k or 128)
        if why is None:
            interpret = (backend.platform() != "gpu") if interpret is None else bool(interpret)
            return _pallas_gpu(q, k, v, causal, scale, block_q or 128, block_k or 128, interpret)
        warnings.warn(
            f"Pallas attention unavailable for q{tuple(q.shape)} {q.dtype}: {why}; using the chunked "
            "path (same O(T) memory)",
            RuntimeWarning,
            stacklevel=2,
        )
        impl = "chunked"
    if impl in ("xla", "cudnn"):
        # jax's bias convention gives mean(V) for fully masked rows: zero them (module docstring).
        out = (
            _xla(q, k, v, mask, causal, scale, "xla")
            if impl == "xla"
            else _cudnn_or_fallback(q, k, v, mask, causal, scale)
        )
        return _zero_masked_rows(out, _full_mask(mask, causal, B, N, Tq, Tk) if mask is not None else None)
    return _chunked(q, k, v, mask, causal, scale, min(block_k or 128, Tk))


def attention_flops(
    batch: int, seq_q: int, seq_k: int, heads: int, head_dim: int, *, causal: bool = False, backward: bool = False
) -> float:
    """Matmul FLOPs of attention: ``4·B·N·Tq·Tk·H`` forward (QKᵀ, PV).

    With ``backward`` ×3.5 (flash backward: 4 matmuls + the recomputed QKᵀ); ``causal`` halves it.
    Every size must be a positive integer (a ValueError/TypeError names the one that is not).
    """
    for name, size in (("batch", batch), ("seq_q", seq_q), ("seq_k", seq_k), ("heads", heads), ("head_dim", head_dim)):
        check_scalar(size, name, integer=True, minimum=1)
    f = 4.0 * batch * heads * seq_q * seq_k * head_dim
    if backward:
        f *= 3.5
    return f / 2 if causal else f
