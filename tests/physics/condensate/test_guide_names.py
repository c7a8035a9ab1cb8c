"""Every condensate function the guide names is exported where the guide says: ``condensate.name``, a bare
``name(`` and a bare ``name`` that one of the package's modules defines all resolve in ``ivhl_jax.condensate``."""

from __future__ import annotations

import pathlib
import re

import ivhl_jax
from ivhl_jax import condensate as C

GUIDE = pathlib.Path(__file__).resolve().parents[3] / "docs" / "guide" / "condensates.md"


def test_every_function_the_guide_calls_is_exported():
    text = GUIDE.read_text(encoding="utf-8")
    qualified = set(re.findall(r"`condensate\.([A-Za-z_][A-Za-z0-9_]*)", text))
    called = set(re.findall(r"`([a-z][a-z0-9_]*)\(", text))
    # names the guide calls that belong to another namespace (the GFT condensate, the split-step engine, JAX, the
    # top-level drivers trajectory/chunked) or are a stepper's own (its run_fn, ``run(psi, params, n)``)
    elsewhere = {n for n in called if re.search(rf"`(gft|splitstep|jax|jnp|np|distributed_fft)\.{n}\(", text)}
    elsewhere |= {n for n in called if hasattr(ivhl_jax, n)} | {"run"}
    # a bare `name` that is a public function of one of the package's modules must be one condensate exports
    modules = [getattr(C, m) for m in ("system", "stepper", "ground", "observables", "states", "mixture", "dipolar")]
    public = {n for m in modules for n in m.__all__}
    bare = set(re.findall(r"`([a-z][a-z0-9_]*)`", text)) & public
    missing = sorted(n for n in qualified | (called - elsewhere) | bare if not hasattr(C, n))
    assert not missing, f"the condensate guide names functions condensate does not export: {missing}"
