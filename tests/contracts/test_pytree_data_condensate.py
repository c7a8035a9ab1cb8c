"""Pytrees hold data (the condensate and GFT families): a stepper's params are differentiable data whose
gradient has their own tree structure and feeds an optax update; rebuilding a stepper from its leaves
(``jax.tree.map``, what ``jit``/``vmap``/``grad`` do on every call) checks and moves nothing; and dt, held
only through the factors derived from it, cannot be edited apart from them.
"""

from __future__ import annotations

import dataclasses
import inspect

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ivhl_jax import condensate as C
from ivhl_jax import gft as G
from ivhl_jax.numerics.rollout import trajectory


def _gp(omega_rot: float):
    grid = C.Grid.uniform((16, 16), 8.0)
    system = C.GPSystem.create(grid, C.harmonic(grid, (1.0, 1.2)), 5.0, omega_rot)
    return C.strang(system, 0.01), C.gaussian(grid, center=(0.5, -0.3))


def _gft():
    st = G.strang(G.GFTSystem.create((8, 8), -0.5, 0.2), 0.05)
    phi = jnp.asarray(0.3 + 0.2 * np.random.default_rng(0).normal(size=(8, 8)), jnp.complex64)
    return st, phi


CASES = {
    "condensate-rotating": lambda: _gp(0.3),
    "condensate": lambda: _gp(0.0),
    "gft": _gft,
}


def _loss(params, stepper, state0):
    """A physics observable of a short run (Σ|ψ|² x-weighted) as a function of the stepper's params."""
    final, _ = trajectory(stepper.replace(params=params), state0, 4, save_every=2, observe=None)
    weight = jnp.linspace(-1.0, 1.0, final.shape[0])[:, None]
    return jnp.sum(weight * jnp.abs(final) ** 2)


@pytest.mark.parametrize("case", list(CASES))
def test_grad_of_the_params_has_their_structure_and_feeds_an_optax_update(case):
    stepper, state = CASES[case]()
    state = stepper.init(state)
    params = stepper.params
    grads = jax.grad(_loss)(params, stepper, state)
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    tx = optax.sgd(1e-3)
    updates, _ = tx.update(grads, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    assert jax.tree.structure(new) == jax.tree.structure(params)
    out = stepper.replace(params=new).step(state)
    assert bool(jnp.all(jnp.isfinite(jnp.abs(out))))


@pytest.mark.parametrize("case", list(CASES))
def test_tree_map_over_a_stepper_moves_nothing_to_the_host(case):
    stepper, _ = CASES[case]()
    jax.block_until_ready(jax.tree.leaves(stepper))  # the params are on the device
    with jax.transfer_guard("disallow"):
        again = jax.tree.map(lambda x: x, stepper)
        jax.tree.map(lambda x: x, stepper.params.system)
    assert jax.tree.structure(again) == jax.tree.structure(stepper)
    # reconstruction checks nothing: leaves a constructor would refuse (NaN) come back as they were given
    poisoned = jax.tree.map(lambda x: np.full(np.shape(x), np.nan, np.asarray(x).dtype), stepper)
    assert all(np.isnan(leaf).all() for leaf in jax.tree.leaves(poisoned))


def _dt_edits(params, new_dt):
    """Every way to set a dt on built params: flax's replace and dataclasses.replace on the params and on their
    plan, and the tree leaf whose path names dt."""
    edits = []
    nodes = [("params", params, lambda p: p)]
    if dataclasses.is_dataclass(getattr(params, "plan", None)):
        nodes.append(("plan", params.plan, lambda plan: params.replace(plan=plan)))
    for where, node, rebuild in nodes:  # without a dt field each edit must be refused
        edits.append((f"{where}.replace", lambda n=node, r=rebuild: r(n.replace(dt=new_dt))))
        edits.append((f"dataclasses.replace({where})", lambda n=node, r=rebuild: r(dataclasses.replace(n, dt=new_dt))))
    paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    named = [i for i, (path, _) in enumerate(paths) if jax.tree_util.keystr(path).endswith(".dt")]

    def set_leaf():
        leaves = [leaf for _, leaf in paths]
        for i in named:
            leaves[i] = jnp.asarray(new_dt, leaves[i].dtype)
        return jax.tree_util.tree_unflatten(treedef, leaves)

    if named:
        edits.append(("the dt leaf", set_leaf))
    return edits


@pytest.mark.parametrize("family", ["condensate", "gft"])
def test_editing_dt_on_built_params_is_refused_or_equals_the_builder(family):
    """The reproducer: a strang(system, 0.01) stepper given dt = 0.005 by any edit either refuses it or runs exactly
    strang(system, 0.005); never a mix of one dt's factors and another's half-steps."""
    if family == "condensate":
        grid = C.Grid.uniform((32,), 12.0)
        system = C.GPSystem.create(grid, C.harmonic(grid), 20.0)
        build, state = (lambda dt: C.strang(system, dt)), C.gaussian(grid, center=(0.5,))
    else:
        system = G.GFTSystem.create((8, 8), -0.5, 0.2)
        build = lambda dt: G.strang(system, dt)  # noqa: E731
        state = jnp.asarray(0.3 + 0.2 * np.random.default_rng(0).normal(size=(8, 8)), jnp.complex64)
    coarse, fine = build(0.01), build(0.005)
    state = fine.init(state)
    ref = np.asarray(trajectory(fine, state, 40, save_every=40)[0])
    edits = _dt_edits(coarse.params, 0.005)
    assert edits
    for label, edit in edits:
        try:
            params = edit()
        except (TypeError, ValueError, AttributeError):
            continue
        got = np.asarray(trajectory(coarse.replace(params=params), state, 40, save_every=40)[0])
        np.testing.assert_allclose(got, ref, atol=1e-6, err_msg=f"dt set by {label}")


def test_a_system_decides_rotation_once_and_reconstruction_keeps_it():
    grid = C.Grid.uniform((16, 16), 8.0)
    rotating = C.GPSystem.create(grid, C.harmonic(grid), 1.0, 0.3)
    still = C.GPSystem.create(grid, C.harmonic(grid), 1.0, 0.0)
    assert rotating.rotating and not still.rotating
    # a leaf set to 0 (a gradient, an update) keeps the static choice and the leaf
    zeroed = jax.tree.map(jnp.zeros_like, rotating)
    assert zeroed.rotating and zeroed.omega_rot is not None
    assert jax.tree.structure(zeroed) == jax.tree.structure(rotating)
    # bad input still fails once, at construction, in one line naming the argument
    with pytest.raises(ValueError, match="potential must have the grid's shape"):
        C.GPSystem.create(grid, jnp.zeros(8), 1.0)
    with pytest.raises(ValueError, match="g must be finite"):
        C.GPSystem.create(grid, C.harmonic(grid), float("nan"))
    with pytest.raises(ValueError, match="shape must have rank 1..4"):
        G.GFTSystem.create((4,) * 5)


def _system_builders():
    g1, g2, g3 = C.Grid.uniform((8,), 6.0), C.Grid.uniform((8, 8), 6.0), C.Grid.uniform((8, 8, 8), 6.0)
    return {
        "GPSystem": lambda: C.GPSystem.create(g2, C.harmonic(g2), 5.0, 0.3, gamma=0.01),
        "MixtureSystem": lambda: C.MixtureSystem.create(g1, C.harmonic(g1), [[1.0, 0.5], [0.5, 1.0]]),
        "Spin1System": lambda: C.Spin1System.create(g1, C.harmonic(g1), 1.0, -0.1, q=0.2),
        "DipolarSystem": lambda: C.DipolarSystem.create(g3, C.harmonic(g3), 1.0, C.Dipolar.create(eps_dd=0.5)),
        "GFTSystem": lambda: G.GFTSystem.create((4, 4), -0.5, 0.2),
    }


def _system_classes():
    names = [(C, n) for n in C.__all__ if n.endswith("System")] + [(G, n) for n in G.__all__ if n.endswith("System")]
    return {n: getattr(mod, n) for mod, n in names}


def test_every_condensate_system_is_a_pytree_node_built_by_create_and_rebuilt_unchecked():
    """One idiom for a validated system: a ``flax.struct.PyTreeNode`` whose ``create`` classmethod validates and
    places once; flatten/unflatten holds data only (leaves mapped to strings, which ``create`` would refuse,
    come back as they were given, with the static fields unchanged)."""
    classes, builders = _system_classes(), _system_builders()
    assert set(classes) == set(builders), "a new system class needs a case here"
    for name, cls in classes.items():
        assert issubclass(cls, flax.struct.PyTreeNode), name
        assert isinstance(inspect.getattr_static(cls, "create"), classmethod), name
        system = builders[name]()
        assert type(system) is cls
        mapped = jax.tree.map(lambda _: "not an array", system)
        assert type(mapped) is cls
        assert all(leaf == "not an array" for leaf in jax.tree.leaves(mapped)), name
        assert jax.tree.structure(jax.tree.map(lambda x: x, system)) == jax.tree.structure(system)


@pytest.mark.parametrize("build", [lambda g: C.GPSystem(g, C.harmonic(g), 500.0), lambda g: G.GFTSystem((4, 4))])
def test_the_raw_constructor_without_the_fields_create_derives_raises(build):
    """``GPSystem(grid, V, g)`` (the signature of ``create``) must not build an unvalidated system: the fields that
    ``create`` derives (rotating, dissipative, the layout ...) have no defaults."""
    with pytest.raises(TypeError, match="missing"):
        build(C.Grid.uniform((8, 8), 6.0))
