"""Transformer: config validation, logical axes, causality, attention-path agreement, precision
policies through the shared train step (bf16, fp16 loss-scale skip), remat equivalence and memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import training
from ivhl_jax.models.transformer import (
    Transformer,
    TransformerConfig,
    flops_per_token,
    init_params,
    lm_loss_fn,
    param_logical_axes,
    preset,
)


def tiny(**kw):
    base = dict(d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=32, attention="xla", attention_block=8)
    return preset("tiny", **{**base, **kw})


def _batch(B=4, T=17, seed=0):
    return jax.random.randint(jax.random.key(seed), (B, T), 0, 256)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="divisible by n_heads"):
        TransformerConfig(d_model=30, n_heads=4).validate()
    with pytest.raises(ValueError, match="remat"):
        TransformerConfig(remat="sometimes").validate()
    with pytest.raises(ValueError, match="policy"):
        TransformerConfig(precision="fp8").validate()
    assert preset("small").d_model == 512 and preset("small").n_layers == 6 and preset("small").n_heads == 8
    assert preset("base").d_model == 768 and preset("base").n_layers == 12 and preset("base").n_heads == 12


def test_params_are_stacked_over_layers_and_carry_logical_axes():
    cfg = tiny(activation="swiglu", tied_embeddings=False)
    params = init_params(cfg, jax.random.key(0))
    axes = param_logical_axes(cfg)
    flat_p = jax.tree_util.tree_leaves_with_path(params)
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)
    flat_a = dict(jax.tree_util.tree_leaves_with_path(axes, is_leaf=is_spec))
    for path, p in flat_p:
        assert len(flat_a[path]) == p.ndim, (path, flat_a[path], p.shape)
    assert params["blocks"]["q"].shape == (2, 32, 4, 8)
    assert tuple(axes["blocks"]["q"]) == ("layers", "embed", "heads", "kv")
    assert tuple(axes["embedding"]) == ("vocab", "embed")
    assert tuple(axes["unembed"]) == ("embed", "vocab")
    assert params["blocks"]["wi"]["dense"]["kernel"].shape == (2, 32, 128)  # gated: 2·d_ff


@pytest.mark.slow  # ~16 s; attention paths are compared fast in test_attention
def test_causal_and_attention_paths_agree_inside_the_model():
    cfg = tiny()
    params = init_params(cfg, jax.random.key(1))
    tokens = _batch()
    fwd = {
        impl: jax.jit(lambda p, t, impl=impl: Transformer(tiny(attention=impl)).apply({"params": p}, t))
        for impl in ("xla", "chunked")
    }
    logits = fwd["xla"](params, tokens)
    assert logits.shape == (4, 17, 256) and logits.dtype == jnp.float32
    np.testing.assert_allclose(fwd["chunked"](params, tokens), logits, atol=2e-5)
    changed = tokens.at[:, 10].set((tokens[:, 10] + 1) % 256)
    out2 = fwd["xla"](params, changed)
    np.testing.assert_array_equal(out2[:, :10], logits[:, :10])  # the past does not see the future
    assert float(jnp.max(jnp.abs(out2[:, 10:] - logits[:, 10:]))) > 1e-4


def _state_and_step(cfg, policy, **ls):
    opt = training.make_optimizer(name="adamw", learning_rate=3e-3, warmup_steps=1, total_steps=50)
    params = init_params(cfg, jax.random.key(2))
    state = training.init_train_state(params, opt, key=jax.random.key(3), policy=policy, **ls)
    return state, jax.jit(training.make_train_step(lm_loss_fn(cfg), opt, policy))


# ~18 s; loss-scale skipping is covered fast in tests/core/test_precision.py and tests/train/test_training.py
@pytest.mark.slow
def test_fp16_overflow_step_is_skipped_and_scale_halves():
    cfg = tiny(precision="fp16")
    state, step = _state_and_step(cfg, "fp16", initial=2.0**30)  # 2^30·grad overflows fp16 (max 65504)
    new, m = step(state, _batch())
    assert int(m["skipped"]) == 1
    assert float(new.loss_scale.loss_scale) == 2.0**29
    jax.tree_util.tree_map(np.testing.assert_array_equal, new.params, state.params)
    assert jax.tree_util.tree_leaves(new.params)[0].dtype == jnp.float32  # fp32 master weights
    for _ in range(12):  # the scale keeps halving until the gradients fit, then training proceeds
        new, m = step(new, _batch())
    assert int(m["skipped"]) == 0 and np.isfinite(float(m["loss"]))


@pytest.mark.slow
def test_bf16_and_fp32_train_the_same_and_loss_falls():
    batch = _batch(seed=5)
    losses = {}
    for pol in ("fp32", "bf16"):
        state, step = _state_and_step(tiny(precision=pol), pol)
        hist = []
        for _ in range(30):
            state, m = step(state, batch)
            hist.append(float(m["loss"]))
        assert jax.tree_util.tree_leaves(state.params)[0].dtype == jnp.float32
        losses[pol] = hist
    assert losses["fp32"][-1] < 0.5 * losses["fp32"][0]  # memorises the fixed batch
    assert abs(losses["bf16"][0] - losses["fp32"][0]) < 0.05
    assert abs(losses["bf16"][-1] - losses["fp32"][-1]) < 0.25 * losses["fp32"][-1] + 0.1


@pytest.mark.slow
def test_remat_policies_give_the_same_gradients_and_less_memory():
    tokens = _batch(B=8, T=33)
    params = init_params(tiny(), jax.random.key(4))
    grads, temps = {}, {}
    for remat in ("none", "dots_saveable", "full"):
        cfg = tiny(remat=remat, n_layers=4, max_len=64, layer_loop="scan")
        params = init_params(cfg, jax.random.key(4))
        loss = lambda p, cfg=cfg: lm_loss_fn(cfg)(p, tokens, jax.random.key(0), None)[0]
        compiled = jax.jit(jax.grad(loss)).lower(params).compile()
        temps[remat] = compiled.memory_analysis().temp_size_in_bytes
        grads[remat] = compiled(params)
    for remat in ("dots_saveable", "full"):
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads[remat], grads["none"])
    assert temps["full"] < temps["none"], temps


def test_flops_per_token_matches_hand_count():
    cfg = TransformerConfig(d_model=8, n_layers=1, n_heads=2, d_ff=16, vocab_size=10, activation="gelu")
    n = 4 * 64 + 8 * 16 + 16 * 8 + 8 * 10
    assert flops_per_token(cfg, 5) == 6 * n + 12 * 1 * 8 * 5


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_pytorch_peer_is_the_same_model_and_optimizer(norm):
    """The PyTorch peer of the train-step benchmark (bench/ops_transformer.py) is the same network:
    with our initial weights copied in, the gradients agree to float32 round-off (relative to each tensor's
    largest entry), and so do the losses of two AdamW steps (clipping on) and the updated parameters."""
    torch = pytest.importorskip("torch")
    from ivhl_jax.bench.ops_transformer import torch_lm, torch_lm_loss, torch_load_params, torch_train_step

    cfg = tiny(norm=norm, activation="gelu")
    params = init_params(cfg, jax.random.key(0))
    batch = _batch(B=3, T=17)
    tokens = torch.from_numpy(np.asarray(batch, np.int64))
    model = torch_lm(cfg, 16)
    torch_load_params(model, params)
    with pytest.raises(ValueError, match="tokens must be"):
        torch_lm_loss(model, tokens[:, :1])  # no target to predict
    torch_lm_loss(model, tokens).backward()
    ours_grad = torch_lm(cfg, 16)
    torch_load_params(ours_grad, jax.grad(lambda p: lm_loss_fn(cfg)(p, batch, None, None)[0])(params))
    tiny_grad = {}
    for (name, a), b in zip(model.named_parameters(), ours_grad.parameters()):
        g, ref = b.detach().numpy(), a.grad.numpy()
        np.testing.assert_allclose(g, ref, rtol=0, atol=1e-5 * np.abs(ref).max(), err_msg=name)
        # Adam divides by |g| + 1e-8: where |g| is near 1e-8 the update itself is round-off (seen: 3.5e-8)
        tiny_grad[name] = np.abs(ref) < 1e-6
    model.zero_grad(set_to_none=True)

    opt = training.make_optimizer(name="adamw", learning_rate=1e-2, clip_norm=1.0)
    state = training.init_train_state(params, opt, key=jax.random.key(1))
    step = jax.jit(training.make_train_step(lm_loss_fn(cfg), opt, "fp32"))
    tstep = torch_train_step(model, learning_rate=1e-2, clip_norm=1.0)
    for _ in range(2):
        state, m = step(state, batch)
        np.testing.assert_allclose(float(m["loss"]), float(tstep(tokens)), rtol=1e-5)
    ours = torch_lm(cfg, 16)
    torch_load_params(ours, state.params)
    for (name, a), b in zip(model.named_parameters(), ours.parameters()):
        a, b, keep = a.detach().numpy(), b.detach().numpy(), ~tiny_grad[name]
        assert keep.mean() > 0.98, name  # the exemption stays the exception
        np.testing.assert_allclose(a[keep], b[keep], atol=1e-4, err_msg=name)
        np.testing.assert_allclose(a, b, atol=2 * 2 * 1e-2, err_msg=name)  # elsewhere: two steps of at most ~lr


def test_layer_loop_is_validated_and_auto_unrolls_on_cpu():
    with pytest.raises(ValueError, match="layer_loop"):
        TransformerConfig(layer_loop="python").validate()
    assert tiny(layer_loop="scan").scan_layers and not tiny(layer_loop="unrolled").scan_layers
    assert tiny().scan_layers == (jax.default_backend() != "cpu")


@pytest.mark.parametrize("remat", ["none", "dots_saveable", "full"])
def test_unrolled_layers_equal_the_layer_scan(remat):
    """The unrolled layer loop is the scan's model: the same parameter tree from the same key, the same
    logits and the same gradients (every remat policy off CPU; on CPU remat with it is an error), and the
    fences between its layers survive into the compiled gradient (one ``conditional`` per fence in the
    forward pass and one in the backward)."""
    on_cpu = jax.default_backend() == "cpu"
    cfgs = {loop: tiny(layer_loop=loop, n_layers=3, remat=remat) for loop in ("scan", "unrolled")}
    if remat != "none" and on_cpu:  # XLA:CPU would undo the remat in straight-line code: refused, by name
        with pytest.raises(ValueError, match="layer_loop='scan'"):
            Transformer(cfgs["unrolled"]).apply(
                {"params": init_params(cfgs["scan"], jax.random.key(7))}, _batch(B=1, T=5)
            )
        assert tiny(remat=remat).scan_layers  # and "auto" with remat takes the scan
        return
    params = {loop: init_params(cfg, jax.random.key(7)) for loop, cfg in cfgs.items()}
    jax.tree_util.tree_map(np.testing.assert_array_equal, params["scan"], params["unrolled"])
    tokens = _batch(B=3, T=19, seed=2)
    logits, grads = {}, {}
    for loop, cfg in cfgs.items():
        logits[loop] = jax.jit(lambda p, t, cfg=cfg: Transformer(cfg).apply({"params": p}, t))(params["scan"], tokens)
        grad = jax.jit(jax.grad(lambda p, cfg=cfg: lm_loss_fn(cfg)(p, tokens, None, None)[0]))
        grads[loop] = grad(params["scan"])
        n_cond = grad.lower(params["scan"]).compile().as_text().count(" conditional(")
        assert n_cond == (0 if loop == "scan" else 2 * (cfg.n_layers + 1)), (loop, n_cond)
    np.testing.assert_allclose(logits["unrolled"], logits["scan"], rtol=1e-5, atol=1e-5)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads["unrolled"], grads["scan"]
    )


def test_unrolled_layers_vmap_over_an_ensemble_and_apply_dropout_per_layer():
    """Under ``vmap`` (the fences become selects) each member equals its own call; with dropout the unrolled
    loop draws from the ``"dropout"`` key (same key, same output; another key or no dropout, another output)."""
    cfg = tiny(layer_loop="unrolled", n_layers=2)
    keys = jax.random.split(jax.random.key(3), 2)
    ens = jax.vmap(lambda k: init_params(cfg, k))(keys)
    tokens = _batch(B=2, T=9, seed=4)
    apply = lambda p: Transformer(cfg).apply({"params": p}, tokens)
    both = jax.jit(jax.vmap(apply))(ens)
    for i in range(2):
        np.testing.assert_allclose(both[i], apply(jax.tree.map(lambda a, i=i: a[i], ens)), rtol=1e-5, atol=1e-5)
    drop = tiny(layer_loop="unrolled", n_layers=2, dropout=0.5)
    params = jax.tree.map(lambda a: a[0], ens)
    run = jax.jit(
        lambda k: Transformer(drop).apply({"params": params}, tokens, deterministic=False, rngs={"dropout": k})
    )
    a, b, c = run(jax.random.key(0)), run(jax.random.key(0)), run(jax.random.key(1))
    np.testing.assert_array_equal(a, b)
    assert float(jnp.max(jnp.abs(a - c))) > 1e-3
    assert float(jnp.max(jnp.abs(a - Transformer(drop).apply({"params": params}, tokens)))) > 1e-3


def test_layer_fence_is_the_identity_in_every_mode():
    from ivhl_jax.models.transformer import _layer_fence

    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 4)), jnp.float32)
    np.testing.assert_array_equal(jax.jit(_layer_fence)(x), x)
    nan_first = x.at[0, 0, 0].set(jnp.nan)  # the predicate's other branch
    np.testing.assert_array_equal(jax.jit(_layer_fence)(nan_first), nan_first)
    f = lambda v: jnp.sum(jnp.sin(_layer_fence(v)) ** 2)
    np.testing.assert_allclose(jax.grad(f)(x), jnp.sin(2 * x), rtol=1e-6, atol=1e-6)
    _, tangent = jax.jvp(_layer_fence, (x,), (2 * x,))
    np.testing.assert_array_equal(tangent, 2 * x)
    np.testing.assert_array_equal(jax.vmap(_layer_fence)(x), x)
