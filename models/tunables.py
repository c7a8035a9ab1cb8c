"""The transformer's layer loop, registered for ``ivhl tune --only transformer`` (:mod:`ivhl_jax.core.tunables`).

The ``ivhl tune`` command imports this module (the library below it never imports ``ivhl_jax.models``); a script
that tunes the transformer area imports it first.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ivhl_jax.core import backend, tunables
from ivhl_jax.core.tunables import Candidate, Tuner

__all__ = ["tune_transformer"]


def tune_transformer(t: Tuner) -> dict[str, dict[str, Any]]:
    """One AdamW train step of a small causal LM (2 layers, d = 128; tiny: d = 32): unrolled vs scanned layers.
    The loss at initialisation must be ~ln 256 for both."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.models import transformer as TM

    row = backend.TABLE.get(backend.platform(), backend.TABLE["portable"])
    d, layers, T, B = (32, 2, 16, 2) if t.tiny else (128, 2, 128, 4)

    def build(loop: str):
        cfg = TM.preset("tiny", d_model=d, n_layers=layers, d_ff=4 * d, max_len=T + 1, layer_loop=loop)
        params = TM.init_params(cfg, jax.random.key(0))
        tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (B, T + 1)), jnp.int32)
        loss_fn = TM.lm_loss_fn(cfg)

        def step(p, tok):
            return jax.value_and_grad(lambda p: loss_fn(p, tok, None, None)[0])(p)

        return t.aot(step, params, tokens)

    t.log(f"transformer layer loop (d={d}, {layers} layers, B={B}, T={T}) ...")
    cands = [
        Candidate(
            loop,
            {"transformer_layer_loop": loop},
            functools.partial(build, loop),
            default=(loop == row.transformer_layer_loop),
        )
        for loop in ("unrolled", "scan")
    ]

    def value_only(out):
        loss = float(out[0])  # the parameter trees of the two loops differ in layout; the loss at init is ~ln V
        return None if np.isfinite(loss) and abs(loss - np.log(256)) < 1.0 else f"loss {loss} at init is not ~ln 256"

    entry = t.choose(
        "transformer.layer_loop",
        None,
        cands,
        rounds=5 if t.tiny else 7,
        check=value_only,
        params={"d_model": d, "layers": layers, "batch": B, "T": T},
    )
    return {"transformer.layer_loop|all": entry}


tunables.register(tunables.Area("transformer", tune_transformer, quick=False, order=60))
