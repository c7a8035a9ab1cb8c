"""Types that are checked: mypy is clean on the library, and the jaxtyping shape annotations hold at runtime."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from beartype import beartype
from jaxtyping import TypeCheckError, jaxtyped

from ivhl_jax.nn import adaptive, gru
from ivhl_jax.numerics import fastmath, spectral, splitstep
from ivhl_jax.physics import condensate, exact, fields, gft
from ivhl_jax.physics.tensornet import tn

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_clean(monkeypatch):
    """`mypy` (configured in pyproject.toml, run by `make lint`) reports no errors on ivhl_jax."""
    api = pytest.importorskip("mypy.api")
    monkeypatch.chdir(ROOT)  # `files` in [tool.mypy] is relative to the repository root
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, stdout + stderr
    assert "Success: no issues found" in stdout


def test_py_typed_marker_ships():
    import importlib.resources

    assert importlib.resources.files("ivhl_jax").joinpath("py.typed").is_file()


def _checked(fn):
    return jaxtyped(typechecker=beartype)(fn)


def test_superpose_shapes_checked_at_runtime():
    superpose = _checked(fields.superpose)
    pts = jnp.zeros((5, 3))
    src = jnp.ones((2, 3))
    out = superpose(pts, src)
    assert out.shape == (5,)
    with pytest.raises(TypeCheckError):
        superpose(pts, jnp.ones((2, 2)))  # D of the sources differs from D of the points
    with pytest.raises(TypeCheckError):
        superpose(jnp.zeros((5,)), src)  # points must be (N, D)


def test_intensity_and_phase_shapes_checked_at_runtime():
    psi = jnp.ones((4, 2), jnp.complex64)
    assert _checked(fields.intensity)(psi).shape == (4, 2)
    assert _checked(fields.phase)(psi).shape == (4, 2)


def test_gru_step_shapes_checked_at_runtime():
    import jax

    step = _checked(gru.cell)
    params = gru.init_params(jax.random.key(0), 3, 4)
    h, x = jnp.zeros((2, 4)), jnp.ones((2, 3))
    assert step(params, h, x).shape == (2, 4)
    with pytest.raises(TypeCheckError):
        step(params, h, jnp.ones((5, 3)))  # batch of x differs from batch of h
    with pytest.raises(TypeCheckError):
        step(params, h.astype(jnp.int32), x)  # h must be floating


def test_spectral_multiply_shapes_checked_at_runtime():
    mul = _checked(spectral.spectral_multiply)
    psi = jnp.ones((8, 8), jnp.complex64)
    out = mul(psi, jnp.zeros((8, 8), jnp.complex64), (0, 1))
    assert out.shape == (8, 8)
    with pytest.raises(TypeCheckError):
        mul(psi.real, jnp.zeros((8, 8), jnp.complex64), (0, 1))  # psi must be complex


# ------------------------------------------------------------------------------------------------------------------
# The rest of the public API: every annotated function once with a correct call (the jaxtyping + beartype check
# passes, including the return annotation) and once with a wrong shape/dtype (TypeCheckError before the body runs).

C, G, A = condensate, gft, adaptive
C64 = jnp.complex64


@dataclasses.dataclass(frozen=True)
class Case:
    """``fn(*good()[0], **good()[1])`` passes the runtime check; ``bad()`` (None: return-only annotation) fails it."""

    id: str
    fn: Callable[..., Any]
    good: Callable[[], tuple[tuple, dict]]
    bad: Callable[[], tuple[tuple, dict]] | None


def call(*args: Any, **kwargs: Any) -> Callable[[], tuple[tuple, dict]]:
    """Arguments built lazily (at test time, not at collection)."""
    return lambda: (tuple(a() if callable(a) and getattr(a, "_lazy", False) else a for a in args), kwargs)


def lazy(fn: Callable[[], Any]) -> Callable[[], Any]:
    fn = functools.cache(fn)
    fn._lazy = True  # type: ignore[attr-defined]
    return fn


_PTS = np.zeros((5, 3), np.float32)
_SRC = np.ones((4, 3), np.float32)
_M4 = np.ones((4,), np.float32)
wave_p = lazy(lambda: fields.superposition(_PTS, _SRC, amplitudes=_M4, wavenumbers=_M4, phases=_M4, dt=0.1).params)
_SITES = np.ones((2, 2, 2), np.float32) / math.sqrt(8)
_BOOL3 = np.ones((2, 2, 2), bool)

grid1 = lazy(lambda: C.Grid.uniform((16,), 8.0))
grid2 = lazy(lambda: C.Grid.uniform((8, 8), 8.0))
system1 = lazy(lambda: C.GPSystem.create(grid1(), C.harmonic(grid1(), 1.0), 10.0))
system2 = lazy(lambda: C.GPSystem.create(grid2(), C.harmonic(grid2(), 1.0), 1.0))
psi1 = lazy(lambda: C.gaussian(grid1(), 1.0))
psi2 = lazy(lambda: C.gaussian(grid2(), 1.0, center=(0.3, -0.2)))
grid3 = lazy(lambda: C.Grid.uniform((4, 4, 4), 4.0))
psi3 = lazy(lambda: C.gaussian(grid3(), 1.0))
gp_params = lazy(lambda: C.strang(system1(), 1e-3).params)
mix1 = lazy(lambda: C.MixtureSystem.create(grid1(), C.harmonic(grid1(), 1.0), jnp.array([[1.0, 0.5], [0.5, 1.0]])))
spin1 = lazy(lambda: C.Spin1System.create(grid1(), C.harmonic(grid1(), 1.0), 1.0, -0.5))
psi_mix = lazy(lambda: jnp.stack([C.gaussian(grid1(), 1.0), C.gaussian(grid1(), 1.0, center=(0.5,))]))
psi_spin = lazy(lambda: jnp.stack([C.gaussian(grid1(), 1.0)] * 3) / jnp.sqrt(3.0))
dip3 = lazy(
    lambda: C.DipolarSystem.create(
        grid3(), C.harmonic(grid3(), 1.0), 1.0, C.Dipolar.create(eps_dd=0.5, axis=(0.0, 0.0, 1.0))
    )
)
split_plan = lazy(lambda: gp_params().plan)
gft_sys = lazy(lambda: G.GFTSystem.create((4, 4)))
phi = lazy(lambda: jnp.full((4, 4), 0.5 + 0.1j, C64))
gft_params = lazy(lambda: G.strang(gft_sys(), 0.01).params)
gru_params = lazy(lambda: gru.init_params(jax.random.key(0), 3, 4))
gru_stepper = lazy(lambda: gru.recurrence(gru_params(), jnp.ones((5, 2, 3))))
gru_state = lazy(lambda: gru_stepper().init(jnp.zeros((2, 4))))
cfg = lazy(lambda: A.AdaptiveConfig(num_nodes=3, hidden_dim=4, input_dim=5, output_dim=2))
cfg_shared = lazy(lambda: A.AdaptiveConfig(num_nodes=3, hidden_dim=4, input_dim=5, output_dim=2, scheduler="shared"))
a_params = lazy(lambda: A.init_params(jax.random.key(0), cfg()))
a_state = lazy(lambda: A.init_state(cfg(), 2))
a_state_shared = lazy(lambda: A.init_state(cfg_shared(), 2))
a_stepper = lazy(lambda: A.dynamics(a_params(), np.ones((2, 5), np.float32), cfg()))
key = lazy(lambda: jax.random.key(1))
X25 = np.ones((2, 5), np.float32)
H = np.zeros((2, 3, 4), np.float32)
E = np.full((2, 3), 10.0, np.float32)
F23 = np.zeros((2, 3), np.float32)
I23 = np.zeros((2, 3), np.int32)


def _ground_state_case(label: str, system: Any, components: int) -> Case:
    """``condensate.ground_state`` of ``system`` (lazy), and with an integer guess of ``components`` fields."""
    ok = call(system, max_steps=10, check_every=5)
    bad = call(system, max_steps=10, check_every=5, psi0=np.ones((components, 16), np.int32))
    return Case(f"condensate.ground_state/{label}", C.ground_state, ok, bad)


def _split_local(p):
    return jnp.zeros(p.shape, jnp.float32)


CASES = [
    # ---- physics.fields
    Case(
        "fields.vortex",
        fields.vortex,
        call(_PTS, np.zeros((2, 3), np.float32), np.array([1, -1])),
        call(_PTS, np.zeros((2, 2), np.float32), np.array([1, -1])),
    ),  # centers' D differs from the points'
    Case("fields.winding_number", fields.winding_number, call(jnp.ones((3, 8), C64)), call(jnp.ones((), C64))),
    Case("fields.vortex_map", fields.vortex_map, call(jnp.ones((2, 5, 6), C64)), call(jnp.ones((6,), C64))),
    Case("fields.grid_points", fields.grid_points, call((4, 5)), call((4.0, 5.0))),
    Case("fields.helix_sources", fields.helix_sources, call(5), call("5")),
    Case(
        "fields.focus_phases",
        fields.focus_phases,
        call(_SRC, np.zeros(3, np.float32), steps=2),
        call(_SRC, np.zeros(2, np.float32), steps=2),
    ),
    Case(
        "fields.superposition",
        fields.superposition,
        call(_PTS, _SRC, amplitudes=_M4, wavenumbers=_M4, phases=_M4, dt=0.1),
        call(_PTS, np.ones((4, 2), np.float32), amplitudes=_M4, wavenumbers=_M4, phases=_M4, dt=0.1),
    ),
    Case(
        "fields.field_at",
        fields.field_at,
        call(wave_p, 0.0),
        call(wave_p, jnp.zeros(2)),
    ),
    # ---- physics.condensate
    Case("condensate.harmonic", C.harmonic, call(grid1, 1.0), call((16,), 1.0)),
    Case("condensate.Grid.points", C.Grid.points, call(grid2), None),
    Case("condensate.Grid.mesh", C.Grid.mesh, call(grid2), None),
    Case("condensate.Grid.k_squared", C.Grid.k_squared, call(grid2), None),
    Case(
        "condensate.ground_state",
        C.ground_state,
        call(system1, max_steps=10, check_every=5),
        call(system1, max_steps=10, check_every=5, psi0=np.ones(16, np.int32)),
    ),
    Case("condensate.norm", C.norm, call(psi1, grid1), call(jnp.ones(16, jnp.int32), grid1)),
    Case("condensate.normalize", C.normalize, call(psi1, grid1), call(jnp.ones(16, jnp.int32), grid1)),
    Case("condensate.density", C.density, call(psi1), call(jnp.ones(16, jnp.int32))),
    Case("condensate.phase", C.phase, call(psi1), call(jnp.ones(16, jnp.int32))),
    Case(
        "condensate.angular_momentum", C.angular_momentum, call(psi2, grid2), call(jnp.ones((8, 8), jnp.int32), grid2)
    ),
    Case("condensate.energy", C.energy, call(psi1, system1), call(jnp.ones(16, jnp.int32), system1)),
    Case("condensate.residual", C.residual, call(psi1, system1), call(jnp.ones(16, jnp.int32), system1)),
    Case(
        "condensate.chemical_potential",
        C.chemical_potential,
        call(psi1, system1),
        call(jnp.ones(16, jnp.int32), system1),
    ),
    Case("condensate.virial_residual", C.virial_residual, call(psi1, system1), call(jnp.ones(16, jnp.int32), system1)),
    Case("condensate.observe", C.observe, call(psi1, gp_params), call(jnp.ones(16, jnp.int32), gp_params)),
    Case("condensate.gaussian", C.gaussian, call(grid1, 1.0), call((16,), 1.0)),
    Case("condensate.thomas_fermi_density", C.thomas_fermi_density, call(system1, 2.0), call(None, 2.0)),
    Case("condensate.bright_soliton", C.bright_soliton, call(grid1, 4.0, -1.0), call((16,), 4.0, -1.0)),
    Case(
        "condensate.dark_soliton_pair",
        C.dark_soliton_pair,
        call(grid1, 1.0, 1.0, 4.0, 0.3),
        call((16,), 1.0, 1.0, 4.0, 0.3),
    ),
    Case(
        "condensate.imprint_vortices",
        C.imprint_vortices,
        call(psi2, grid2, np.zeros((1, 2)), np.array([1])),
        call(psi2, grid2, np.zeros((1, 2)), np.array([1, 1])),
    ),  # one centre, two charges
    Case("condensate.vortex_charges", C.vortex_charges, call(psi2, grid2), call(psi1, grid2)),  # psi must be 2-D
    Case("condensate.energy/mixture", C.energy, call(psi_mix, mix1), call(jnp.ones((2, 16), jnp.int32), mix1)),
    _ground_state_case("mixture", mix1, 2),
    Case(
        "condensate.component_norms",
        C.component_norms,
        call(psi_mix, grid1),
        call(jnp.ones((2, 16), jnp.int32), grid1),
    ),
    Case("condensate.overlap", C.overlap, call(psi_mix, grid1), call(jnp.ones((2, 16), jnp.int32), grid1)),
    Case("condensate.energy/spin1", C.energy, call(psi_spin, spin1), call(jnp.ones((3, 16), jnp.int32), spin1)),
    _ground_state_case("spin1", spin1, 3),
    Case("condensate.spin_density", C.spin_density, call(psi_spin), call(jnp.ones((3, 16), jnp.int32))),
    Case("condensate.magnetization", C.magnetization, call(psi_spin, grid1), call(jnp.ones((3, 16), jnp.int32), grid1)),
    Case("condensate.dipolar_kernel", C.dipolar_kernel, call(dip3), None),
    Case(
        "condensate.dipolar_potential",
        C.dipolar_potential,
        call(jnp.ones((4, 4, 4), jnp.float32), dip3),
        call(jnp.ones((4, 4, 4), jnp.complex64), dip3),
    ),
    Case("condensate.energy/dipolar", C.energy, call(psi3, dip3), call(jnp.ones((4, 4, 4), jnp.int32), dip3)),
    Case(
        "condensate.ground_state/dipolar",
        C.ground_state,
        call(dip3, max_steps=10, check_every=5, dt=1e-3),
        call(dip3, max_steps=10, check_every=5, dt=1e-3, psi0=np.ones((4, 4, 4), np.int32)),
    ),
    Case("condensate.vortex_positions", C.vortex_positions, call(psi2, grid2), call(psi1, grid2)),
    Case("condensate.vortices", C.vortices, call(psi2, grid2), call(psi1, grid2)),  # psi must be (..., x, y)
    Case("condensate.vortex_lines", C.vortex_lines, call(psi3, grid3), call(psi2, grid3)),
    Case(
        "condensate.bogoliubov",
        C.bogoliubov,
        call(jax.random.key(0), system1, psi1, 1),
        call(jax.random.key(0), system1, np.ones(16, np.int32), 1),
    ),
    # ---- numerics.splitstep
    Case(
        "splitstep.kick",
        splitstep.kick,
        call(psi1, _split_local, 0.1, False),
        call(jnp.ones(16, jnp.float32), _split_local, 0.1, False),
    ),
    Case("splitstep.kinetic", splitstep.kinetic, call(psi1, split_plan), call(jnp.ones(16, jnp.float32), split_plan)),
    Case("splitstep.sumsq", splitstep.sumsq, call(psi1), call(jnp.ones(16, jnp.int32))),
    Case("splitstep.project_norm", splitstep.project_norm, call(psi1, 2.0), call(jnp.ones(16, jnp.int32), 2.0)),
    Case("splitstep.norm_projection", splitstep.norm_projection, call(psi1), call(jnp.ones(16, jnp.int32))),
    Case(
        "splitstep.step",
        splitstep.step,
        call(psi1, split_plan, _split_local, 1.0),
        call(jnp.ones(16, jnp.float32), split_plan, _split_local, 1.0),
    ),
    Case(
        "splitstep.run",
        splitstep.run,
        call(psi1, split_plan, _split_local, 1.0, 2),
        call(jnp.ones(16, jnp.float32), split_plan, _split_local, 1.0, 2),
    ),
    # ---- physics.gft
    Case("gft.lattice_dispersion", G.lattice_dispersion.__wrapped__, call((4, 4)), None),  # under lru_cache
    Case("gft.potential", G.potential, call(phi, -0.5, 0.1), call(jnp.ones((4, 4), jnp.int32), -0.5, 0.1)),
    Case("gft.rhs", G.rhs, call(phi, -0.5, 0.1), call(jnp.ones((4, 4)), -0.5, 0.1)),  # must be complex
    Case("gft.charge", G.charge, call(phi), call(jnp.ones((4, 4), jnp.int32))),
    Case("gft.observe", G.observe, call(phi, gft_params), call(jnp.ones((4, 4)), gft_params)),
    Case("gft.vacuum", G.vacuum, call(-0.5, 0.1), call(-0.5, "0.1")),
    # ---- physics.tn
    Case(
        "tn.contract",
        tn.contract,
        call("ij,jk->ik", np.ones((2, 3)), np.ones((3, 2))),
        call("ij,jk->ik", np.ones((2, 3), bool), np.ones((3, 2))),
    ),
    Case("tn.schmidt_probabilities", tn.schmidt_probabilities, call(_SITES, [0]), call(_BOOL3, [0])),
    Case("tn.entanglement_entropy", tn.entanglement_entropy, call(_SITES, [0]), call(_BOOL3, [0])),
    Case("tn.renyi_entropy", tn.renyi_entropy, call(_SITES, [0], 2.0), call(_BOOL3, [0], 2.0)),
    # ---- physics.exact
    Case("exact.tfi_apply", exact.tfi_apply, call(_SITES), call(_BOOL3)),
    Case("exact.tfi_dense", exact.tfi_dense, call(3), call("3")),
    Case(
        "exact.lanczos_ground_state",
        exact.lanczos_ground_state,
        call(exact.tfi_apply, _SITES, 4),
        call(exact.tfi_apply, np.ones((2, 2, 2), np.int32), 4),
    ),
    Case("exact.tfi_ground_state", exact.tfi_ground_state, call(4, num_iter=8), call("4", num_iter=8)),
    Case(
        "exact.chain_apply",
        exact.chain_apply,
        call(_SITES, np.eye(4).reshape(2, 2, 2, 2)),
        call(_BOOL3, np.eye(4).reshape(2, 2, 2, 2)),
    ),  # amplitudes must be numbers
    Case(
        "exact.chain_ground_state",
        exact.chain_ground_state,
        call(np.eye(4).reshape(2, 2, 2, 2), 3, num_iter=8),
        call(np.eye(4, dtype=bool).reshape(2, 2, 2, 2), 3, num_iter=8),
    ),
    # ---- nn.gru
    Case(
        "gru.recurrence",
        gru.recurrence,
        call(gru_params, jnp.ones((5, 2, 3))),
        call(gru_params, jnp.ones((5, 2, 3), jnp.int32)),
    ),
    Case(
        "gru.observe",
        gru.observe,
        call(gru_state, lazy(lambda: gru_stepper().params)),
        call(None, lazy(lambda: gru_stepper().params)),
    ),
    # ---- nn.adaptive
    Case("adaptive.init_param", A.init_param, call(key, (3, 4), 4), None),
    Case(
        "adaptive.anxiety",
        A.anxiety,
        call(jnp.asarray(H), jnp.asarray(E), jnp.zeros((2, 3))),
        call(jnp.asarray(H), jnp.zeros((2, 4)), jnp.zeros((2, 3))),
    ),
    Case(
        "adaptive.phase_weights",
        A.phase_weights,
        call(I23, E, F23, F23, F23, 0.5, np.zeros((2, 3), bool)),
        call(F23, E, F23, F23, F23, 0.5, np.zeros((2, 3), bool)),
    ),  # phase must be integer
    Case(
        "adaptive.phase_logits",
        A.phase_logits,
        call(jnp.ones((2, 3, 4)), 1.0, False),
        call(jnp.ones((2, 3, 5)), 1.0, False),
    ),
    Case(
        "adaptive.phase_masses",
        A.phase_masses,
        call(jnp.ones((2, 3, 4)), 0.5, False),
        call(jnp.ones((2, 3, 5)), 0.5, False),
    ),
    Case(
        "adaptive.sample_phase",
        A.sample_phase,
        call(jnp.ones((2, 3, 4)), jnp.zeros((2, 3))),
        call(jnp.ones((2, 3, 4)), jnp.zeros((2, 4))),
    ),
    Case(
        "adaptive.schedule_per_sample",
        A.schedule_per_sample,
        call(cfg, a_state, jnp.zeros((2, 3)), key),
        call(cfg, a_state, jnp.zeros((2,)), key),
    ),
    Case(
        "adaptive.schedule_shared",
        A.schedule_shared,
        call(cfg_shared, a_state_shared, jnp.zeros((2, 3)), key),
        call(cfg_shared, a_state_shared, jnp.zeros((2,)), key),
    ),
    Case(
        "adaptive.project_input",
        A.project_input,
        call(a_params, jnp.ones((2, 5)), cfg),
        call(a_params, jnp.ones((5,)), cfg),
    ),
    Case(
        "adaptive.node_update",
        A.node_update,
        call(a_params, cfg, jnp.asarray(H), jnp.asarray(E), jnp.ones((2, 4)), jnp.zeros((2, 3)), jnp.asarray(I23)),
        call(a_params, cfg, jnp.asarray(H), jnp.zeros((2, 4)), jnp.ones((2, 4)), jnp.zeros((2, 3)), jnp.asarray(I23)),
    ),
    Case(
        "adaptive.readout",
        A.readout,
        call(a_params, cfg, jnp.asarray(H), jnp.asarray(E), jnp.zeros((2, 3))),
        call(a_params, cfg, jnp.asarray(H), jnp.asarray(E), jnp.zeros((2, 4))),
    ),
    Case(
        "adaptive.step",
        A.step,
        call(a_params, a_state, jnp.ones((2, 5)), key, cfg),
        call(a_params, a_state, jnp.ones((5,)), key, cfg),
    ),
    Case("adaptive.check_inputs", A.check_inputs, call(cfg, a_state, X25), call(cfg, a_state, np.ones(5, np.float32))),
    Case(
        "adaptive.apply_sequence",
        A.apply_sequence,
        call(a_params, np.ones((3, 2, 5), np.float32), cfg, key, a_state),
        call(a_params, X25, cfg, key, a_state),
    ),  # xs must be [T, B, D]
    Case("adaptive.phase_fractions", A.phase_fractions, call(jnp.asarray(I23)), call(jnp.zeros((2, 3)))),
    Case("adaptive.dynamics", A.dynamics, call(a_params, X25, cfg), call(a_params, np.ones(5, np.float32), cfg)),
    Case(
        "adaptive.observe_phase_fractions",
        A.observe_phase_fractions,
        call(lazy(lambda: a_stepper().init(key())), lazy(lambda: a_stepper().params)),
        None,
    ),
    # ---- numerics.fastmath (sincos is a jax.custom_jvp: its annotated function is sincos.fun)
    Case("fastmath.safe_norm", fastmath.safe_norm, call(jnp.ones((2, 3))), call(jnp.ones((2, 3), C64))),
    Case("fastmath.sincos", fastmath.sincos.fun, call(jnp.ones(3)), call(jnp.ones(3, jnp.int32))),
    Case(
        "fastmath.sincos_static", fastmath.sincos_static, call(jnp.ones(3), False), call(jnp.ones(3, jnp.int32), False)
    ),
    Case("fastmath.reduce_mod_pi", fastmath.reduce_mod_pi.fun, call(jnp.ones(3)), call(jnp.ones(3, jnp.int32))),
    Case("fastmath.needs_full_range", fastmath.needs_full_range, call(jnp.float32(1.0)), call(jnp.ones(3, C64))),
    Case(
        "fastmath.point_source_sum",
        fastmath.point_source_sum,
        call(_PTS, _SRC, _M4, _M4, _M4, 0.1),
        call(_PTS, _SRC, np.ones(3, np.float32), _M4, _M4, 0.1),
    ),  # 3 amplitudes for 4 sources
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_public_api_shapes_checked_at_runtime(case: Case):
    checked = _checked(case.fn)
    args, kwargs = case.good()
    checked(*args, **kwargs)  # parameters and the returned value match their annotations
    if case.bad is not None:
        args, kwargs = case.bad()
        with pytest.raises(TypeCheckError):
            checked(*args, **kwargs)


def _has_array_annotation(fn: Callable[..., Any]) -> bool:
    return any(
        any(t in str(a) for t in ("Array", "ndarray")) and "[" in str(a) for a in inspect.get_annotations(fn).values()
    )


def test_cases_cover_the_annotated_public_api():
    """Every public function of the annotated modules has a jaxtyping annotation and a case above, unless it
    takes and returns no arrays (listed here)."""
    no_arrays = {
        "contraction_path",
        "thomas_fermi_mu",
        "make_plan",
        "with_policy",
        "strang",
        "phase_factor_m1",
        "wave_step",
        "params_from_nnx",
        "init_state",
        "detach",
        "param_specs",
        "init_params",
        "count_params",
        "node_metrics",
        "observe",
        "tfi_energy_density",
        "tfi_finite_ground_energy",
        "renyi",
        "vacuum",
        "max_stable_dt",
        "plan",
        "check_dt",
        "check_local_dt",
        "local_energy_max",
        "diagonal",
        "concrete_float",
        "check_placement",
        "thomas_fermi_aspect_ratio",
    }
    covered = {c.id.rsplit(".", 1)[-1] for c in CASES} | {"superpose", "intensity", "phase", "cell"}
    missing, unannotated = [], []
    for mod in (fields, condensate, gft, tn, exact, gru, adaptive, fastmath, splitstep):
        for name in mod.__all__:
            obj = inspect.unwrap(getattr(mod, name))  # lru_cache
            if not inspect.isfunction(obj) and not isinstance(obj, jax.custom_jvp) or name in no_arrays:
                continue
            fn = obj.fun if isinstance(obj, jax.custom_jvp) else obj
            if name not in covered:
                missing.append(f"{mod.__name__}.{name}")
            if not _has_array_annotation(fn):
                unannotated.append(f"{mod.__name__}.{name}")
    assert not missing, f"public functions without a runtime shape-check case: {missing}"
    assert not unannotated, f"public functions without jaxtyping annotations: {unannotated}"


def test_annotations_are_inert_under_jit_and_vmap():
    """Without the checker the annotations change nothing; with it, checks run at trace time on tracers."""
    psi = C.gaussian(grid1(), 1.0)
    np.testing.assert_array_equal(np.asarray(jax.jit(C.density)(psi)), np.asarray(C.density(psi)))
    batched = jax.vmap(_checked(C.density))(jnp.stack([psi, 2 * psi]))
    assert batched.shape == (2, 16)
    out = jax.jit(_checked(fastmath.safe_norm))(jnp.ones((4, 3)))
    np.testing.assert_allclose(np.asarray(out), np.sqrt(3.0), rtol=1e-6)
