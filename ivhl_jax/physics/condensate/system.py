"""The periodic grid, the Gross–Pitaevskii system (potential, coupling, rotation) and trap potentials.

Units: ħ = m = 1, lengths in trap units a_ho, energies in ħω₀ (see :mod:`ivhl_jax.physics.condensate`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Float

from ivhl_jax.core.precision import Policy, complex_state_dtype, physics_policy
from ivhl_jax.core.validation import check_array, check_scalar, is_concrete
from ivhl_jax.numerics import splitstep
from ivhl_jax.numerics.distributed_fft import check_layout, host_readable
from ivhl_jax.numerics.spectral import check_backend

__all__ = ["Grid", "GPSystem", "harmonic", "with_policy", "EquationParams"]

#: The ground-state searches' default convergence tolerance in float32: a few ulps of the energy (the relative change
#: of a float32 energy per check bottoms out at ~1e-7, one ulp).
FLOAT32_TOL = 4e-7


class Grid:
    """A periodic box centred at the origin: ``shape`` points over side ``length`` per axis.

    Coordinates x_j = −L/2 + j·dx, j = 0..n−1 (dx = L/n, the point L/2 is the image of −L/2);
    wavenumbers k = 2π·fftfreq(n, dx). The grid is static (immutable, hashable, a pytree with no leaves), so it
    can be closed over or passed through ``jit``/``vmap`` freely. ``Grid(shape, length)`` (tuples) and
    :meth:`uniform` validate once; pytree reconstruction returns the grid itself.
    """

    __slots__ = ("shape", "length")
    shape: tuple[int, ...]
    length: tuple[float, ...]

    def __init__(self, shape: tuple[int, ...], length: tuple[float, ...]):
        if not isinstance(shape, tuple) or not all(isinstance(s, (int, np.integer)) for s in shape):
            raise TypeError(f"shape must be a tuple of ints, got {shape!r}")
        if not 1 <= len(shape) <= 3:
            raise ValueError(f"shape must have 1, 2 or 3 entries (dimensions), got {shape}")
        if any(s < 2 for s in shape):
            raise ValueError(f"shape entries must be >= 2 points per axis, got {shape}")
        if not isinstance(length, tuple) or len(length) != len(shape):
            raise ValueError(f"length must be a number or have {len(shape)} entries to match shape, got {length!r}")
        for v in length:
            check_scalar(v, "length", positive=True)
        object.__setattr__(self, "shape", tuple(int(n) for n in shape))
        object.__setattr__(self, "length", tuple(float(v) for v in length))

    @classmethod
    def uniform(cls, shape: int | Sequence[int], length: float | Sequence[float]) -> Grid:
        """Grid with ``shape`` points (int or 1–3 ints) over box side(s) ``length`` (trap units)."""
        entries: tuple[Any, ...] = (shape,) if np.ndim(shape) == 0 else tuple(cast(Sequence[int], shape))
        for s in entries:
            check_scalar(s, "shape", integer=True)  # 16.7 points is an error, not 16
        shape_t = tuple(int(s) for s in entries)
        if np.ndim(length) == 0:
            length_t: tuple[Any, ...] = (length,) * len(shape_t)
        else:
            length_t = tuple(cast(Sequence[float], length))
        for v in length_t:
            check_scalar(v, "length", positive=True)
        return cls(shape=shape_t, length=tuple(float(v) for v in length_t))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Grid is immutable; build a new one (Grid.uniform(shape, length)) to change {name}")

    def __reduce__(self):
        return (Grid, (self.shape, self.length))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Grid) and (self.shape, self.length) == (other.shape, other.length)

    def __hash__(self) -> int:
        return hash(("Grid", self.shape, self.length))

    def __repr__(self) -> str:
        return f"Grid(shape={self.shape}, length={self.length})"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def dx(self) -> tuple[float, ...]:
        return tuple(L / n for L, n in zip(self.length, self.shape))

    @property
    def cell_volume(self) -> float:
        """dV = Π dx_i (the quadrature weight of every grid point)."""
        return float(np.prod(self.dx))

    @property
    def coords(self) -> tuple[np.ndarray, ...]:
        """1D coordinate arrays (float64 NumPy), one per axis."""
        return tuple(-L / 2 + np.arange(n) * (L / n) for L, n in zip(self.length, self.shape))

    @property
    def wavenumbers(self) -> tuple[np.ndarray, ...]:
        """1D angular wavenumber arrays k = 2π fftfreq(n, dx) (float64 NumPy), one per axis."""
        return tuple(2 * np.pi * np.fft.fftfreq(n, d) for n, d in zip(self.shape, self.dx))

    def mesh(self, dtype: Any = jnp.float32) -> tuple[Float[Array, "*grid"], ...]:
        """Full coordinate arrays X, Y, Z of shape ``self.shape`` (indexing="ij")."""
        return tuple(jnp.asarray(m, dtype) for m in np.meshgrid(*self.coords, indexing="ij"))

    def points(self, dtype: Any = jnp.float32) -> Float[Array, "points d"]:
        """All grid points as an (N, d) array in C order (reshape results to ``self.shape``)."""
        return jnp.stack([m.reshape(-1) for m in self.mesh(dtype)], axis=-1)

    def k_squared(self) -> Float[np.ndarray, "*grid"]:
        """|k|² on the Fourier grid (float64 NumPy, shape ``self.shape``)."""
        return _k2(self)

    def _bcast(self, v: np.ndarray, axis: int) -> np.ndarray:
        shp = [1] * self.ndim
        shp[axis] = -1
        return v.reshape(shp)


# No leaves: the grid travels as the treedef's static data, and reconstruction returns it unchanged.
jax.tree_util.register_pytree_node(Grid, lambda g: ((), g), lambda g, _: g)


@functools.lru_cache(maxsize=64)
def _k2(grid: Grid) -> np.ndarray:
    out = np.zeros(grid.shape)
    for a, k in enumerate(grid.wavenumbers):
        out = out + grid._bcast(k, a) ** 2
    return out


def harmonic(grid: Grid, omega: Any = 1.0, *, dtype: Any = jnp.float32) -> Float[Array, "*grid"]:
    """Harmonic trap V = ½ Σ_i ω_i² x_i² on ``grid`` (shape ``grid.shape``, energies in ħω₀).

    ``omega``: one trap frequency (isotropic) or one per axis, ≥ 0, in units of ω₀. It may be traced
    (``jax.vmap(lambda w: harmonic(grid, w))(jnp.array([1.0, 1.5]))``): then V is built on the device
    in ``dtype``; a concrete ω is evaluated in float64 NumPy and cast once.
    """
    if not isinstance(grid, Grid):
        raise TypeError(f"grid must be a Grid (Grid.uniform(shape, length)), got {type(grid).__name__}")
    if isinstance(omega, (str, bytes)):
        raise TypeError(f"omega must be a real number or one per axis, got {omega!r}")
    if not is_concrete(omega):
        om_t = jnp.asarray(omega)
        if om_t.ndim == 0:
            om_t = jnp.broadcast_to(om_t, (grid.ndim,))
        if om_t.shape != (grid.ndim,):
            raise ValueError(
                f"omega must be a number or have {grid.ndim} entries (one per axis), got shape {tuple(om_t.shape)}"
            )
        if jnp.iscomplexobj(om_t):
            raise TypeError(f"omega must be real, got dtype {om_t.dtype}")
        rdt = jnp.dtype(dtype)
        v_t = jnp.zeros(grid.shape, rdt)
        for a, x in enumerate(grid.coords):
            v_t = v_t + 0.5 * om_t[a].astype(rdt) ** 2 * jnp.asarray(grid._bcast(x * x, a), rdt)
        return v_t
    try:
        om = np.asarray(omega, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"omega must be a real number or one per axis, got {omega!r}") from None
    if om.ndim == 0:
        om = np.broadcast_to(om, (grid.ndim,))
    if om.shape != (grid.ndim,):
        raise ValueError(f"omega must be a number or have {grid.ndim} entries (one per axis), got {omega}")
    for w in om:
        check_scalar(w, "omega")  # finite (float64): ω = inf would give an inf/NaN potential
    if not np.all(om >= 0):
        raise ValueError(f"omega must be >= 0, got {omega}")
    v = np.zeros(grid.shape)
    for a, x in enumerate(grid.coords):
        v = v + 0.5 * om[a] ** 2 * grid._bcast(x, a) ** 2
    return jnp.asarray(v, dtype)


class SystemDtypes:
    """The working precision of a condensate system, set by the real dtype of its ``potential``: ``real_dtype``
    (float32 or float64) and ``complex_dtype``, the state's (complex64 or complex128). A base of every system."""

    potential: Any

    @property
    def real_dtype(self) -> Any:
        return jnp.result_type(self.potential)

    @property
    def complex_dtype(self) -> Any:
        return jnp.result_type(self.real_dtype, jnp.complex64)


class GPSystem(SystemDtypes, struct.PyTreeNode, eq=False):
    """A Gross–Pitaevskii problem: grid, external potential V (real, grid-shaped), coupling g, rotation Ω.

    Build with :meth:`create` (``GPSystem.create(grid, potential, g=0.0, omega_rot=0.0, fft="xla", layout=None)``),
    which validates its input once and places V on ``layout``; pytree reconstruction (``jit``, ``vmap``, ``grad``,
    ``jax.tree.map``) rebuilds the fields as they are, checking and moving nothing. ``potential``, ``g``,
    ``omega_rot`` and ``gamma`` are pytree leaves (they can be traced, differentiated and vmapped, e.g. an ensemble
    of g values); the grid, the FFT backend, the layout, ``rotating`` and ``dissipative`` are static. The real dtype
    of ``potential`` sets the working precision: float32 → complex64 (default), float64 → complex128 (needs x64).

    ``rotating`` (static) selects the rotating-frame kinetic step (−Ω L_z, about z: a 2D or 3D grid). It is
    chosen by :meth:`create`: by default False when Ω is given as a concrete 0 (the cheaper rotation-free step),
    True otherwise (also for a traced Ω); pass ``rotating=True`` to keep the rotating step for Ω = 0 (e.g. a
    gradient at Ω = 0). Ω stays a leaf either way, so a gradient has the system's tree structure.

    ``gamma`` (γ ≥ 0, dimensionless, a leaf) is a phenomenological damping rate: real-time steps solve
    i∂ψ/∂t = (1 − iγ)(H − μ)ψ, with μ tracked so that the atom number is held (ψ is projected back to its norm
    after every step), so the energy falls monotonically towards a stationary state. ``dissipative`` (static)
    is chosen like ``rotating``: False for a concrete γ = 0 (the conservative equation), True otherwise.

    ``fft``: the kinetic step's FFT backend, "xla" (portable, shardable) or "ducc" (host FFT on the CPU
    backend, an optional GPL dependency), see :mod:`ivhl_jax.numerics.spectral`. ``layout``: how ψ is split
    over a device mesh (an :class:`~ivhl_jax.numerics.distributed_fft.FFTLayout`: slab or pencil) or None; with
    a layout the kinetic step uses the distributed FFT and V, the kinetic factors and ψ
    (``strang(...).init``) are held in blocks, one per device.

    The fields have no defaults: the raw constructor needs every one (it holds data and checks nothing), so a
    system is built by :meth:`create`. ``replace`` validates like :meth:`create`.
    Equality is identity (``eq=False``: fields holding arrays have no truth value).
    """

    grid: Grid = struct.field(pytree_node=False)
    potential: Any
    g: Any
    omega_rot: Any
    fft: str = struct.field(pytree_node=False)
    layout: Any = struct.field(pytree_node=False)
    rotating: bool = struct.field(pytree_node=False)
    gamma: Any
    dissipative: bool = struct.field(pytree_node=False)

    @classmethod
    def create(
        cls,
        grid: Grid,
        potential: Any,
        g: Any = 0.0,
        omega_rot: Any = 0.0,
        fft: str = "xla",
        layout: Any = None,
        *,
        rotating: bool | None = None,
        gamma: Any = 0.0,
        dissipative: bool | None = None,
    ) -> GPSystem:
        """The validated system, V placed on ``layout``; ``rotating``/``dissipative`` None are decided from
        ``omega_rot``/``gamma`` (class docstring)."""
        if not isinstance(grid, Grid):
            raise TypeError(f"grid must be a Grid (Grid.uniform(shape, length)), got {type(grid).__name__}")
        check_backend(fft)
        if layout is not None:
            layout = check_layout(layout, grid.shape, fft=fft)
        omega_rot = 0.0 if omega_rot is None else omega_rot
        gamma = 0.0 if gamma is None else gamma
        for name, v in (("g", g), ("omega_rot", omega_rot), ("gamma", gamma)):
            _check_real_leaf(v, name)
        rotating = _static_flag(rotating, omega_rot, "rotating", "omega_rot", "decided from omega_rot")
        gmc = splitstep.concrete_float(gamma)
        if gmc is not None and gmc < 0:
            raise ValueError(f"gamma must be >= 0 (a damping rate; 0 is the conservative GP equation), got {gmc}")
        dissipative = _static_flag(dissipative, gamma, "dissipative", "gamma", "decided from gamma")
        if rotating and grid.ndim < 2:
            raise ValueError("omega_rot (rotation about z) needs a 2D or 3D grid; use omega_rot=0.0 in 1D")
        if isinstance(potential, list):
            potential = check_array(potential, "potential", kind="floating")
        if isinstance(potential, (np.ndarray, jax.Array)) and is_concrete(potential):
            if tuple(potential.shape) != grid.shape:
                raise ValueError(f"potential must have the grid's shape {grid.shape}, got {tuple(potential.shape)}")
            if not jnp.issubdtype(potential.dtype, jnp.floating):
                raise TypeError(f"potential must be real (float32/float64), got {potential.dtype}")
            # (a V spread over several processes was checked before it was placed: no host copy of it exists)
            check_array(potential, "potential", finite=host_readable(potential))
            if layout is not None:
                potential = layout.place(potential, "potential")
        return cls(grid, potential, g, omega_rot, fft, layout, bool(rotating), gamma, bool(dissipative))

    def __repr__(self) -> str:
        return (
            f"GPSystem(grid={self.grid!r}, potential={_brief(self.potential)}, g={_brief(self.g)}, "
            f"omega_rot={_brief(self.omega_rot)}, fft={self.fft!r}, layout={self.layout!r}, rotating={self.rotating}, "
            f"gamma={_brief(self.gamma)}, dissipative={self.dissipative})"
        )


def _check_real_leaf(v: Any, name: str) -> None:
    """A coupling given as a concrete value must be a finite real number (or array); traced values pass."""
    if isinstance(v, (str, bytes)):
        raise TypeError(f"{name} must be a real number (or array), got {type(v).__name__} {v!r}")
    if isinstance(v, (int, float, np.ndarray, np.generic, jax.Array)) and is_concrete(v):
        arr = np.asarray(v)
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_) or np.iscomplexobj(arr):
            raise TypeError(f"{name} must be a real number, got dtype {arr.dtype}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite, got {v}")


def _static_flag(flag: Any, value: Any, name: str, source: str, default: str) -> bool:
    """A static switch (``rotating``, ``dissipative``) of a leaf ``source``: None is "the leaf is not a concrete 0";
    False is refused for a concrete non-zero leaf."""
    concrete = splitstep.concrete_float(value)
    if flag is None:
        return concrete != 0.0
    if not isinstance(flag, (bool, np.bool_)):
        raise TypeError(f"{name} must be None ({default}) or a bool, got {flag!r}")
    if not flag and concrete is not None and concrete != 0.0:
        raise ValueError(f"{name}=False needs {source}=0, got {source}={concrete}")
    return bool(flag)


def _replace_gp(self: GPSystem, **updates: Any) -> GPSystem:
    """A new system with ``updates``, validated like :meth:`GPSystem.create`; a new ``omega_rot`` (``gamma``)
    decides ``rotating`` (``dissipative``) afresh unless that is given too."""
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    unknown = set(updates) - set(fields)
    if unknown:
        raise TypeError(f"GPSystem has no field(s) {sorted(unknown)}; fields: {list(fields)}")
    if "omega_rot" in updates and "rotating" not in updates:
        fields["rotating"] = None
    if "gamma" in updates and "dissipative" not in updates:
        fields["dissipative"] = None
    fields.update(updates)
    return GPSystem.create(**fields)


# The dataclass transform installs an unchecked ``replace``; a GP system's static switches follow its leaves, so its
# ``replace`` goes through ``create`` (an Ω or γ set to a non-zero value must turn the rotating/damped step on).
setattr(GPSystem, "replace", _replace_gp)  # noqa: B010


def _brief(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return f"{type(x).__name__}{tuple(shape)}" if shape is not None and len(shape) else repr(x)


def kinetic_term(grid: Grid) -> splitstep.KineticTerm:
    """The free kinetic symbol K = ½k² over every axis of ``grid`` as the split-step engine's term (its factors
    cached per grid and dt, :func:`ivhl_jax.numerics.splitstep.plan`)."""
    return splitstep.KineticTerm(lambda: 0.5 * grid.k_squared(), tuple(range(grid.ndim)), 1.0, ("gp-kinetic", grid))


def kinetic_max(grid: Grid) -> float:
    """max ½k² on the grid: the split-step stability bound is dt ≤ π / that."""
    return float(0.5 * np.max(grid.k_squared()))


def kinetic_plan(grid: Grid, dt: Any, *, imaginary: bool, dtype: Any, layout: Any) -> splitstep.SplitStepPlan:
    """The engine's plan of the free kinetic factor e^{−i dt ½k²} (imaginary time e^{−dt ½k²}) for a field ending in
    the axes of ``grid`` (leading axes are components): dt checked once against the
    split-step bound dt·k_max²/2 ≤ π, the factor applied as ψ + F⁻¹[(f − 1) F ψ] (``increment``: the schemes that
    hold their norm without a projection), by the distributed FFT when ``layout`` is an FFTLayout."""
    return splitstep.plan(
        (kinetic_term(grid),),
        dt,
        shape=grid.shape,
        imaginary=imaginary,
        dtype=dtype,
        layout=layout,
        kinetic_max=kinetic_max(grid),
        label="k_max²/2",
        increment=True,
    )


class EquationParams(struct.PyTreeNode):
    """Everything one Strang step of a mixture, spin-1 or dipolar condensate reads (built by
    :func:`~ivhl_jax.physics.condensate.strang`).

    Attributes:
      system: the system (its couplings and potentials are traced leaves).
      plan: the kinetic factor and the half-step time, both from one dt
        (:class:`ivhl_jax.numerics.splitstep.SplitStepPlan`); ``params.dt`` reads the step size, a new dt is a new
        ``strang(system, dt)``.
      target: what the imaginary-time flow holds, as grid sums (no dV): a mixture one N_i per component (C,), a
        dipolar condensate N, a spin-1 condensate (N, M) (M None: free); None (or None entries) holds the values each
        step starts with.
      imaginary: static; imaginary-time steps (normalised gradient flow).
    """

    system: Any
    plan: splitstep.SplitStepPlan
    target: Any = None
    imaginary: bool = struct.field(pytree_node=False, default=False)

    @property
    def dt(self) -> Any:
        """The step size (a scalar in the system's real dtype)."""
        return self.plan.dt


@dataclasses.dataclass(frozen=True)
class Equation:
    """A condensate equation on the split-step engine (mixture, spin-1, dipolar): what its module supplies to the
    family's one builder (:func:`~ivhl_jax.physics.condensate.strang`) and the one flow search
    (:func:`~ivhl_jax.physics.condensate._descent.flow_ground_state`, behind
    :func:`~ivhl_jax.physics.condensate.ground_state`, which watches the family's
    :func:`~ivhl_jax.physics.condensate.energy`). The functions are module-level (the record is hashable).

    Attributes:
      system_type: the system class (a system of another type is refused in one line naming it).
      name: the stepper's name, ``<name>-strang[-imaginary]``; a precision error names the solver
        :attr:`solver`, "the <name> split-step solver".
      step: ``step(psi, params)``, one Strang step on :class:`EquationParams`.
      init: ``init(params, psi)``, the start state validated, cast and placed (dt checked against its local phase).
      targets: ``targets(system, norm, magnetization, imaginary)``, what the imaginary-time flow holds
        (``params.target``, grid sums), each argument checked.
      guess: ``guess(system, psi0, magnetization)``, the flow's start state (the default guess, or ``psi0``
        checked) in the system's complex dtype.
      real: the problem is real (real potentials and couplings, components coupled through their densities only):
        the flow keeps ψ real, one phase per component.
    """

    system_type: type
    name: str
    step: Callable[[Any, Any], Any]
    init: Callable[[Any, Any], Any]
    targets: Callable[[Any, Any, Any, bool], Any]
    guess: Callable[[Any, Any, Any], Any]
    real: bool

    @property
    def solver(self) -> str:
        """The solver as a precision error names it: "the <name> split-step solver"."""
        return f"the {self.name} split-step solver"

    def check(self, system: Any) -> Any:
        """``system``, or the one-line TypeError naming the class it must be."""
        if not isinstance(system, self.system_type):
            cls = self.system_type.__name__
            raise TypeError(f"system must be a {cls} ({cls}.create(...)), got {type(system).__name__}")
        return system


def cast_system(system: Any, policy: str | Policy | None, routine: str) -> Any:
    """``system`` (a pytree node) with every leaf in the real dtype of ``policy``'s complex state (None: the
    system's own)."""
    cdt = complex_state_dtype(policy, like=system.potential, routine=routine)
    rdt = jnp.finfo(cdt).dtype
    return jax.tree.map(lambda x: jnp.asarray(x, rdt), system)


def check_start(psi: Any, params: Any) -> None:
    """A start state handed to ``trajectory``/``chunked`` without ``init`` (a stepper's ``check_fn``): refused when
    it is sharded along its grid axes over a mesh that ``params.system`` has no layout for (every step would gather
    it onto one device, :func:`ivhl_jax.numerics.splitstep.check_placement`)."""
    splitstep.check_placement(psi, params.system.layout, params.system.grid.ndim)


def place_state(psi: jax.Array, system: Any) -> jax.Array:
    """ψ (its last axes the grid of ``system``) refused when sharded over a mesh the system has no layout for, else
    placed on the system's layout (none: ψ as it is)."""
    splitstep.check_placement(psi, system.layout, system.grid.ndim)
    return psi if system.layout is None else system.layout.place(psi, "psi")


def check_local_step(params: Any, psi: Any, local_energy: Any, formula: str) -> None:
    """The local factor of ``params``' step must be resolved where there are particles (empty corners of the box may
    have any V): dt·max|U| over the points holding ψ at most 2π (:func:`ivhl_jax.numerics.splitstep.check_local_dt`;
    real time the phase per step, imaginary time the decay), else a one-line error naming dt, ``formula`` and the
    bound. ``local_energy(psi_host)`` returns U in float64 NumPy (grid-shaped, or one U per component); the points
    are those where Σ_components |ψ|² exceeds 1e-6 of its peak. Checked for concrete values only (a field spread over
    several processes has no host copy: the builder's dt bound still applies)."""
    leaves = [params.dt, psi, *jax.tree.leaves(params.system)]
    if not all(is_concrete(x) for x in leaves) or not host_readable(psi):
        return
    ndim = params.system.grid.ndim
    p = np.asarray(psi)
    rho = np.abs(p) ** 2
    rho = rho.reshape((-1,) + rho.shape[rho.ndim - ndim :]).sum(axis=0)
    umax = splitstep.local_energy_max(local_energy(p), rho)
    # dt as the user gave it (plan.dt is 2·half_dt in the working precision): 6 digits, an integral step as an int
    shown = float(f"{float(np.asarray(params.dt)):.6g}")
    splitstep.check_local_dt(int(shown) if shown.is_integer() else shown, umax, params.imaginary, formula=formula)


def check_step(psi: Any, params: Any, shape: tuple[int, ...]) -> jax.Array:
    """The static facts a step of ``params`` (a system and the plan of its kinetic factor) checks, free under jit:
    a system still on the plan's grid and layout, ψ complex of ``shape``, and a concrete ψ not sharded over a mesh
    the system has no layout for."""
    system, plan = params.system, params.plan
    if plan.shape != system.grid.shape or plan.layout != system.layout:
        raise ValueError(
            "params.system (grid or layout) differs from the one the kinetic factor was built for; build a new "
            "stepper: condensate.strang(system, dt)"
        )
    psi = check_array(psi, "psi", shape=shape, kind="complex")
    splitstep.check_placement(psi, system.layout, system.grid.ndim)
    return psi


def as_leaf(x: Any, dtype: Any) -> Any:
    return None if x is None else jnp.asarray(x, dtype)


def check_system(system: Any) -> GPSystem:
    if not isinstance(system, GPSystem):
        raise TypeError(f"system must be a GPSystem, got {type(system).__name__}")
    return system


def with_policy(system: GPSystem, policy: str | Policy | None) -> GPSystem:
    """``system`` with V, g and Ω in the real dtype of ``policy``'s complex state; None is the default policy of
    ``system.potential`` (:func:`~ivhl_jax.core.precision.default_policy`: the system's own dtype).

    The solver's precision is the real dtype of the system (module docstring), so a policy is
    applied by casting the system: compute float32 → complex64 state, float64 → complex128.
    What a reduced policy cannot mean here: XLA has no complex bf16/f16 type and no bf16 FFT, so
    a bf16 policy could only round ψ to bf16 between float32 steps. Measured (bright soliton,
    1024 points, 2000 steps of dt = 1e-3, max density error relative to the peak, against the exact
    solution): bf16-rounded state 0.25, complex64 3.1e-4, complex128 5.4e-6 (the scheme's own
    O(dt²) error); see docs/guide/precision.md. So bf16/f16 anywhere in the policy is a ValueError.
    """
    cdt = complex_state_dtype(policy, like=system.potential, routine="the Gross-Pitaevskii split-step solver")
    rdt = jnp.finfo(cdt).dtype
    return system.replace(
        potential=jnp.asarray(system.potential, rdt),
        g=as_leaf(system.g, rdt),
        omega_rot=as_leaf(system.omega_rot, rdt),
        rotating=system.rotating,
        gamma=as_leaf(system.gamma, rdt),
        dissipative=system.dissipative,
    )


def cast_output(psi: jax.Array, policy: str | Policy | None) -> jax.Array:
    """ψ cast to complex(output_dtype) of the policy (None: the default policy of ψ, a no-op)."""
    pol = physics_policy(policy, like=psi)
    return psi.astype(jnp.result_type(pol.output_dtype, jnp.complex64))


def check_psi(psi: Any, system: GPSystem, name: str = "psi") -> jax.Array:
    # (a field spread over several processes has no host copy: it was checked before it was placed)
    psi = check_array(psi, name, shape=system.grid.shape, kind="inexact", finite=host_readable(psi))
    return psi.astype(system.complex_dtype)
