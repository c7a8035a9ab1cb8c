"""Pytrees hold data, and the families keep one convention.

* The params of every stepper are plain data: ``jax.grad`` of a scalar function of ``stepper.params`` (over its
  float leaves) returns a tree of the params' structure, which feeds an optax update, and the updated params still
  drive the step. ``jax.tree.map(lambda x: x, stepper)`` rebuilds the stepper with no host transfer (a node that
  validated or placed arrays when it is rebuilt would copy them to the host under ``jax.transfer_guard``).
* Randomness needs an explicit key: ``init`` of a random family and the random initialisers refuse a call without
  one (a TypeError naming ``key``), and no library function falls back to a fixed key when none is given.
* Precision is chosen by ``policy=`` only: no builder or init function of a family takes ``dtype=``.
* Names do not stutter: no public ``<module>.<module>_...`` (``gru.gru_step``) in a family module.
"""

from __future__ import annotations

import ast
import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ivhl_jax import adaptive, cdt, fields, gru, mera
from ivhl_jax.numerics.rollout import Stepper, trajectory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fields():
    rng = np.random.default_rng(0)
    pts = rng.uniform(-1, 1, (12, 3)).astype(np.float32)
    src = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    st = fields.superposition(pts, src, amplitudes=1.0, wavenumbers=rng.uniform(5, 7, 4), phases=0.0, dt=0.05)
    return st, st.init()


def _cdt():
    st = cdt.metropolis(0.8, attempts_per_sweep=20)
    return st, st.init(jax.random.key(0), 3, 4, 40)


def _mera():
    st = mera.evenbly_vidal(mera.ising(), mera.MERAConfig(chi=3, chi_mid=2, layers=1), policy="f32")
    return st, st.init(jax.random.key(0))


def _gru():
    w = gru.init_params(jax.random.key(0), 3, 5)
    st = gru.recurrence(w, jax.random.normal(jax.random.key(1), (4, 2, 3)))
    return st, st.init(jnp.zeros((2, 5)))


def _adaptive():
    cfg = adaptive.AdaptiveConfig(num_nodes=4, hidden_dim=3, input_dim=5, output_dim=2)
    st = adaptive.dynamics(adaptive.init_params(jax.random.key(0), cfg), jnp.ones((2, 5)), cfg)
    return st, st.init(jax.random.key(1))


FAMILIES = {
    "fields.superposition": _fields,
    "cdt.metropolis": _cdt,
    "mera.evenbly_vidal": _mera,
    "gru.recurrence": _gru,
    "adaptive.dynamics": _adaptive,
}


def _sum_of_squares(params) -> jax.Array:
    """A scalar of every float leaf: Σ |x|² (complex leaves through their modulus)."""
    return sum(jnp.sum(jnp.abs(jnp.asarray(x)) ** 2) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_grad_of_params_has_their_structure_and_feeds_optax(name):
    st, s0 = FAMILIES[name]()
    params = st.params
    leaves = jax.tree.leaves(params)
    assert leaves and all(jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in leaves), name
    grads = jax.grad(_sum_of_squares)(params)
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    opt = optax.sgd(1e-3)
    updates, _ = opt.update(grads, opt.init(params), params)
    new = optax.apply_updates(params, updates)
    assert jax.tree.structure(new) == jax.tree.structure(params)
    moved = st.replace(params=new)
    out, _ = trajectory(moved, s0, 1)
    assert jax.tree.structure(out) == jax.tree.structure(s0)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_rebuilding_a_stepper_moves_nothing_to_the_host(name):
    st, _ = FAMILIES[name]()
    jax.block_until_ready(jax.tree.leaves(st))
    with jax.transfer_guard("disallow"):
        again = jax.tree.map(lambda x: x, st)
    assert isinstance(again, Stepper) and jax.tree.structure(again) == jax.tree.structure(st)


# ------------------------------------------------------------------------------------------ keys


def test_random_inits_and_initialisers_need_a_key():
    cfg = adaptive.AdaptiveConfig(num_nodes=4, hidden_dim=3, input_dim=5, output_dim=2)
    calls = {
        "cdt.metropolis(...).init": lambda: _cdt()[0].init(),
        "mera.evenbly_vidal(...).init": lambda: _mera()[0].init(),
        "adaptive.dynamics(...).init": lambda: _adaptive()[0].init(),
        "mera.init_tensors": lambda: mera.init_tensors(config=mera.MERAConfig(chi=2, layers=1)),
        "gru.init_params": lambda: gru.init_params(input_dim=3, hidden_dim=4),
        "adaptive.init_params": lambda: adaptive.init_params(cfg=cfg),
    }
    for label, call in calls.items():
        with pytest.raises(TypeError, match="key") as e:
            call()
        assert "\n" not in str(e.value), label


def _is_constant_key(node: ast.AST) -> bool:
    """``jax.random.key(<literal>)`` / ``PRNGKey(<literal>)``."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return False
    fn = node.func
    return (fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)) in ("key", "PRNGKey")


def _mentions_none_test(test: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and n.value is None for n in ast.walk(test))


def _fallbacks(tree: ast.AST) -> list[int]:
    """Lines where a missing (None) key is replaced by a fixed one: ``key(0) if key is None else key``,
    ``key or key(0)``, or ``if key is None: key = key(0)``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp) and _mentions_none_test(node.test):
            if _is_constant_key(node.body) or _is_constant_key(node.orelse):
                out.append(node.lineno)
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            if any(_is_constant_key(v) for v in node.values):
                out.append(node.lineno)
        elif isinstance(node, ast.If) and _mentions_none_test(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and _is_constant_key(stmt.value):
                    out.append(stmt.lineno)
    return out


def test_no_library_function_falls_back_to_a_fixed_key():
    found = []
    for d, _, files in os.walk(os.path.join(ROOT, "ivhl_jax")):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
            with open(path, encoding="utf-8") as fh:
                lines = _fallbacks(ast.parse(fh.read()))
            if lines:
                found += [f"{rel}:{n}" for n in lines]
    assert not found, f"a missing key falls back to a fixed key (take the key as a required argument): {found}"


def test_the_fallback_scan_finds_a_fallback():
    src = "def f(key=None):\n    key = jax.random.key(0) if key is None else key\n    return key\n"
    assert _fallbacks(ast.parse(src)) == [2]
    assert _fallbacks(ast.parse("def f(key=None):\n    if key is None:\n        key = jax.random.PRNGKey(0)\n"))
    assert not _fallbacks(ast.parse("def f(key):\n    return jax.random.fold_in(key, 0)\n"))


# ------------------------------------------------------------------------------------------ names

FAMILY_MODULES = {"fields": fields, "cdt": cdt, "mera": mera, "gru": gru, "adaptive": adaptive}
BUILDERS = {
    "fields": fields.superposition,
    "cdt": cdt.metropolis,
    "mera": mera.evenbly_vidal,
    "gru": gru.recurrence,
    "adaptive": adaptive.dynamics,
}
ALL_FAMILIES = [*sorted(FAMILY_MODULES), "condensate", "gft"]


def _module(family: str):
    import importlib

    return FAMILY_MODULES.get(family) or importlib.import_module(f"ivhl_jax.physics.{family}")


def _public_functions(mod):
    for name in getattr(mod, "__all__", ()):
        obj = getattr(mod, name)
        if inspect.isfunction(obj):
            yield name, obj


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_builders_and_inits_take_policy_not_dtype(family):
    """Builders and init functions choose precision with ``policy=`` (a Policy or preset name), never ``dtype=``
    (pure array constructors such as ``condensate.harmonic(grid, dtype=)`` may keep it)."""
    mod = _module(family)
    fns = [(n, f) for n, f in _public_functions(mod) if n.startswith("init") or n in ("strang",)]
    if family in BUILDERS:
        fns.append(("builder", BUILDERS[family]))
    offenders = [f"{family}.{n}" for n, f in fns if "dtype" in inspect.signature(f).parameters]
    assert not offenders, f"precision is chosen by policy=, not dtype=: {offenders}"


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_public_names_do_not_stutter(family):
    """``gru.cell``, not ``gru.gru_step``; ``mera.init_tensors``, not ``mera.init_mera``."""
    mod = _module(family)
    stutter = [
        f"{family}.{n}"
        for n in getattr(mod, "__all__", ())
        if n.lower().startswith(family + "_") or n.lower().endswith("_" + family)
    ]
    assert not stutter, f"stuttering public names: {stutter}"


def test_one_public_builder_per_family_and_params_named_after_it():
    """Each family's builder returns a Stepper whose params type is the builder's name in CamelCase + Params."""
    for family, make in FAMILIES.items():
        st = make()[0]
        builder = family.split(".")[1]
        want = "".join(part.capitalize() for part in builder.split("_")) + "Params"
        assert type(st.params).__name__ == want, (family, type(st.params).__name__)
        mod = FAMILY_MODULES[family.split(".")[0]]
        assert getattr(mod, want) is type(st.params)
