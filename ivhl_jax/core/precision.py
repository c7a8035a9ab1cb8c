"""Precision policies and dynamic loss scaling.

A :class:`Policy` names three dtypes, as in jmp and MaxText: parameters are *stored* in
``param_dtype`` (fp32 master weights), arithmetic runs in ``compute_dtype`` (bf16/fp16 for speed),
and results are returned in ``output_dtype``. Casts touch floating leaves only: integer leaves
(token ids, step counters, PRNG keys) and complex leaves (wave functions, whose precision is set by
the physics, not by the ML policy) pass through unchanged.

fp16 has a narrow exponent range (max 65504), so small gradients underflow unless the loss is
multiplied by a scale S before differentiation and the gradients divided by S afterwards.
:class:`DynamicLossScale` adapts S: on any non-finite gradient the step is skipped and S halves;
after ``period`` consecutive finite steps S doubles (PyTorch's GradScaler uses the same rule).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from ivhl_jax.core.validation import check_scalar

__all__ = [
    "Policy",
    "get_policy",
    "all_finite",
    "select_tree",
    "DynamicLossScale",
    "NoOpLossScale",
    "loss_scale_for",
    "PHYSICS_PRESETS",
    "default_policy",
    "physics_policy",
    "real_compute_dtype",
    "complex_state_dtype",
    "round_complex",
    "BF16_STATE_NORM_CHANGE",
]

_DTYPE_NAMES = {
    "float32": jnp.float32,
    "fp32": jnp.float32,
    "f32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "bf16": jnp.bfloat16,
    "float16": jnp.float16,
    "fp16": jnp.float16,
    "f16": jnp.float16,
    "float64": jnp.float64,
    "fp64": jnp.float64,
}


def _cast_floating(tree: Any, dtype: Any) -> Any:
    def cast(x):
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return x.astype(dtype)
        return x

    return jax.tree_util.tree_map(cast, tree)


@dataclasses.dataclass(frozen=True)
class Policy:
    """Mixed-precision policy: storage, compute and output dtypes of floating values."""

    param_dtype: Any = jnp.float32
    compute_dtype: Any = jnp.float32
    output_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        for field in ("param_dtype", "compute_dtype", "output_dtype"):
            value = getattr(self, field)
            try:
                dt = jnp.dtype(value)
            except TypeError as e:
                raise TypeError(f"{field} must be a floating dtype such as jnp.float32, got {value!r}") from e
            if not jnp.issubdtype(dt, jnp.floating):
                # A complex dtype is a state dtype, not a policy dtype: the complex state of a solver follows
                # from the real compute dtype (float32 -> complex64, float64 -> complex128).
                raise TypeError(
                    f"{field} must be a floating dtype (float16/bfloat16/float32/float64), got {dt.name}; "
                    "a complex state dtype follows from the real compute dtype"
                )

    def cast_to_param(self, tree: Any) -> Any:
        """Cast floating leaves of ``tree`` to ``param_dtype``."""
        return _cast_floating(tree, self.param_dtype)

    def cast_to_compute(self, tree: Any) -> Any:
        """Cast floating leaves of ``tree`` to ``compute_dtype``."""
        return _cast_floating(tree, self.compute_dtype)

    def cast_to_output(self, tree: Any) -> Any:
        """Cast floating leaves of ``tree`` to ``output_dtype``."""
        return _cast_floating(tree, self.output_dtype)

    @property
    def needs_loss_scaling(self) -> bool:
        """fp16 compute needs dynamic loss scaling; bf16 has fp32's exponent range and does not."""
        return jnp.dtype(self.compute_dtype) == jnp.dtype(jnp.float16)

    def __str__(self) -> str:
        n = lambda d: jnp.dtype(d).name
        return f"params={n(self.param_dtype)},compute={n(self.compute_dtype)},output={n(self.output_dtype)}"


_PRESETS = {
    "fp32": Policy(jnp.float32, jnp.float32, jnp.float32),
    "f32": Policy(jnp.float32, jnp.float32, jnp.float32),
    # float64 everywhere: the reference policy of the physics kernels (needs jax_enable_x64).
    "f64": Policy(jnp.float64, jnp.float64, jnp.float64),
    "bf16": Policy(jnp.float32, jnp.bfloat16, jnp.float32),
    "fp16": Policy(jnp.float32, jnp.float16, jnp.float32),
    "pure_bf16": Policy(jnp.bfloat16, jnp.bfloat16, jnp.bfloat16),
}


def get_policy(name: str | Policy, *, argname: str = "policy") -> Policy:
    """Return a policy by preset name or ``"params=float32,compute=bfloat16,output=float32"`` spec.

    Presets: ``fp32`` (alias ``f32``); ``f64`` (everything float64, needs ``jax_enable_x64``);
    ``bf16`` (bf16 compute, fp32 params and outputs); ``fp16`` (fp16 compute, fp32 params and
    outputs; use with :class:`DynamicLossScale`); ``pure_bf16`` (everything bf16). ``argname`` is
    the caller's argument name, used in error messages.
    """
    if isinstance(name, Policy):
        return name
    if not isinstance(name, str):
        raise TypeError(f"{argname} must be a preset name {sorted(_PRESETS)} or a Policy, got {type(name).__name__}")
    if name in _PRESETS:
        return _PRESETS[name]
    fields = {}
    for part in name.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in ("params", "compute", "output") or value not in _DTYPE_NAMES:
            raise ValueError(
                f"{argname}={name!r} is neither a preset {sorted(_PRESETS)} nor a spec like "
                "'params=float32,compute=bfloat16,output=float32'"
            )
        fields[f"{'param' if key == 'params' else key}_dtype"] = _DTYPE_NAMES[value]
    return Policy(**fields)


# ----------------------------------------------------------------------------------------------
# Policies of the physics kernels
#
# Every physics kernel takes a Policy / preset name; ``policy=None`` is :func:`default_policy` of the kernel's
# inputs (every dtype the inputs' own), so each kernel has one dtype path. What each dtype controls is stated per
# kernel; in short (measured errors in docs/guide/precision.md):
#   fields.superpose / fields.vortex: param_dtype = storage of points, sources and per-source values;
#     the pair arithmetic (distance, phase k·r + θ, sin/cos) runs in at least float32; output_dtype =
#     rounding of Re ψ, Im ψ (returned as complex64 for bf16/f16 outputs: XLA has no complex bf16).
#   condensate / gft split-step: the state is complex(compute_dtype): float32 → complex64,
#     float64 → complex128; bf16/f16 are rejected (no complex bf16 FFT in XLA).
#   adaptive dynamics / GRU: weights stored in param_dtype, matmuls and nonlinearities in
#     compute_dtype, carried state and outputs in output_dtype.

#: The presets the physics kernels are documented and tested with.
PHYSICS_PRESETS = ("f64", "f32", "bf16", "pure_bf16")


def _show(policy: Any) -> str:
    return repr(policy) if isinstance(policy, str) else f"Policy({policy})"


def _dtypes(policy: Policy) -> tuple[Any, Any, Any]:
    return jnp.dtype(policy.param_dtype), jnp.dtype(policy.compute_dtype), jnp.dtype(policy.output_dtype)


def default_policy(*like: Any) -> Policy:
    """The policy of ``policy=None``: ``Policy(d, d, d)``, with ``d`` the floating dtype of the inputs ``like``.

    ``d`` is the promoted dtype (``jnp.result_type``, canonical: float64 only with ``jax_enable_x64`` on) of the
    inexact array leaves of ``like``, a complex leaf counting as its real dtype (complex64 → float32, complex128 →
    float64); float32 when ``like`` holds no floating array. So float32 inputs (JAX's default) run in float32
    everywhere and float64 inputs (x64 on) in float64 everywhere: the kernel's one dtype path, with every cast a
    no-op.
    """
    dts = []
    for leaf in jax.tree_util.tree_leaves(like):
        dt = getattr(leaf, "dtype", None)
        if dt is None or jax.dtypes.issubdtype(dt, jax.dtypes.extended):  # Python scalars, PRNG keys
            continue
        dt = jax.dtypes.canonicalize_dtype(dt)  # float64 → float32 when x64 is off, as jnp.asarray does
        if jnp.issubdtype(dt, jnp.complexfloating):
            dt = jnp.finfo(dt).dtype
        if jnp.issubdtype(dt, jnp.floating):
            dts.append(dt)
    d = jnp.dtype(jnp.result_type(*dts)) if dts else jnp.dtype(jnp.float32)
    return Policy(d, d, d)


def physics_policy(policy: str | Policy | None, *, like: Any, argname: str = "policy") -> Policy:
    """Resolve a physics kernel's ``policy`` argument: a preset name or Policy, or None for
    :func:`default_policy` of the kernel's inputs ``like`` (a pytree of arrays or ``jax.ShapeDtypeStruct``).

    Checks that a float64 policy runs with ``jax_enable_x64`` on. Without x64 JAX would silently create float32
    arrays, so that is an error (wrap the call in ``with jax.enable_x64(True):``), never a quiet
    float32 run.

    Raises:
      ValueError: unknown preset name (the message lists the valid ones) or float64 without x64.
        TypeError: neither a string nor a Policy.
    """
    if policy is None:
        return default_policy(like)
    pol = get_policy(policy, argname=argname)  # a Policy holds real floating dtypes only (Policy.__post_init__)
    if any(dt == jnp.dtype(jnp.float64) for dt in _dtypes(pol)) and not jax.config.read("jax_enable_x64"):
        raise ValueError(
            f"{argname}={_show(policy)} asks for float64 but "
            "jax_enable_x64 is off, so JAX would silently compute in float32; wrap the call in "
            "`with jax.enable_x64(True):` (or set jax.config.update('jax_enable_x64', True))"
        )
    return pol


def real_compute_dtype(policy: str | Policy, *, minimum: Any = jnp.float32) -> Any:
    """The compute dtype, raised to at least ``minimum`` (for kernels whose arithmetic needs ≥ 24 bits)."""
    return jnp.promote_types(get_policy(policy).compute_dtype, minimum)


#: What a bfloat16 state costs a split-step solver, measured (``bench/results/condensate_precision.json``, its
#: ``summary.bf16_storage_norm_drift_range``): the relative change of the norm after 1000 steps with ψ's real and
#: imaginary parts rounded to bfloat16 after every float32 step, smallest and largest over the scalar GP, damped GP,
#: two-component mixture, spin-1 and dipolar runs (float32 itself: ≤ 3.5e-6). :func:`complex_state_dtype` quotes it
#: when it refuses a bf16/f16 policy.
BF16_STATE_NORM_CHANGE = (0.0046, 0.040)


def complex_state_dtype(
    policy: str | Policy | None, *, like: Any, argname: str = "policy", routine: str = "this solver"
) -> Any:
    """Complex state dtype of a split-step (FFT) solver: complex(compute_dtype) of ``policy`` (None: of
    :func:`default_policy` of the solver's data ``like``, i.e. its own dtype).

    float32 → complex64, float64 → complex128. bfloat16/float16 compute is rejected: XLA has no
    complex bf16/f16 type and no reduced-precision FFT, so such a policy could only mean "round the
    state to bf16 between float32 steps" (:func:`round_complex`), which costs accuracy and gains no speed: the
    one-line error quotes the measured cost, :data:`BF16_STATE_NORM_CHANGE`. The param/output dtypes must be
    float32 or float64 for the same reason.
    """
    pol = physics_policy(policy, like=like, argname=argname)
    for field_name, dt in zip(("param_dtype", "compute_dtype", "output_dtype"), _dtypes(pol), strict=True):
        if jnp.finfo(dt).bits < 32:
            lo, hi = (f"{100 * v:.2g}" for v in BF16_STATE_NORM_CHANGE)
            raise ValueError(
                f"{argname}={_show(policy)}: {routine} evolves a "
                f"complex state with FFTs, which XLA has only in complex64/complex128, so "
                f"{field_name}={dt} is not supported: a state stored in bfloat16 changes the norm by {lo}-{hi} % "
                f"in 1000 steps of the condensate terms (bench/results/condensate_precision.json); use 'f32' "
                f"(complex64) or 'f64' (complex128)"
            )
    return jnp.result_type(jnp.dtype(pol.compute_dtype), jnp.complex64)


def round_complex(z: Any, dtype: Any) -> jax.Array:
    """``z`` with Re and Im rounded to the real ``dtype`` (round to nearest even) and returned in z's own dtype.

    The storage of a complex state in a real dtype that has no complex form (bfloat16, float16): what a bf16
    policy of a split-step solver could only mean, ``z`` rounded after every step while the steps compute in
    float32 (its measured cost: :func:`complex_state_dtype`).
    """
    z = jnp.asarray(z)
    if not jnp.issubdtype(z.dtype, jnp.complexfloating):
        raise TypeError(f"z must be a complex array, got dtype {z.dtype}")
    try:
        ok = dtype is not None and jnp.issubdtype(jnp.dtype(dtype), jnp.floating)
    except TypeError:
        ok = False
    if not ok:
        raise TypeError(f"dtype must be a real floating dtype such as jnp.bfloat16, got {dtype!r}")
    rdt = jnp.finfo(z.dtype).dtype
    return jax.lax.complex(z.real.astype(dtype).astype(rdt), z.imag.astype(dtype).astype(rdt)).astype(z.dtype)


def all_finite(tree: Any) -> jax.Array:
    """Scalar bool: every inexact leaf of ``tree`` is free of NaN and inf."""
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def select_tree(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
    """Leafwise ``where(pred, on_true, on_false)`` for two pytrees of equal structure."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


class DynamicLossScale(flax.struct.PyTreeNode):
    """Loss-scale state (a pytree, so it can live in a scanned/jitted training state); build it with
    :meth:`create`, which checks the settings (the node itself checks nothing when it is rebuilt).

    Attributes:
      loss_scale: current scale S (fp32 scalar).
      counter: consecutive finite steps since the last change.
      period: finite steps before S grows by ``factor`` (static).
      factor: growth/backoff factor (static).
      min_loss_scale: S never drops below this (static).
    """

    loss_scale: jax.Array
    counter: jax.Array
    period: int = flax.struct.field(pytree_node=False, default=2000)
    factor: float = flax.struct.field(pytree_node=False, default=2.0)
    min_loss_scale: float = flax.struct.field(pytree_node=False, default=1.0)

    @classmethod
    def create(
        cls, initial: float = 2.0**15, period: int = 2000, factor: float = 2.0, min_loss_scale: float = 1.0
    ) -> DynamicLossScale:
        """A fresh loss scale. ``initial`` should keep S·max|g| below 65504 for fp16."""
        check_scalar(initial, "initial", positive=True)
        check_scalar(period, "period", integer=True, minimum=1)
        check_scalar(factor, "factor", minimum=1.0 + 1e-6)
        check_scalar(min_loss_scale, "min_loss_scale", positive=True)
        return cls(
            loss_scale=jnp.asarray(initial, jnp.float32),
            counter=jnp.zeros((), jnp.int32),
            period=int(period),
            factor=float(factor),
            min_loss_scale=float(min_loss_scale),
        )

    def scale(self, tree: Any) -> Any:
        """Multiply every floating leaf by S (in its own dtype); apply to the loss before ``grad``."""
        return jax.tree_util.tree_map(lambda x: x * self.loss_scale.astype(x.dtype), tree)

    def unscale(self, tree: Any) -> Any:
        """Divide every floating leaf by S, in fp32 (so tiny fp16 gradients are not flushed)."""
        inv = 1.0 / self.loss_scale

        def f(x):
            if jnp.issubdtype(x.dtype, jnp.floating):
                return x.astype(jnp.float32) * inv
            return x

        return jax.tree_util.tree_map(f, tree)

    def adjust(self, grads_finite: jax.Array) -> DynamicLossScale:
        """Next state: halve S on a non-finite step, double it after ``period`` finite steps."""
        grow = grads_finite & (self.counter + 1 >= self.period)
        new_scale = jnp.where(
            grads_finite,
            jnp.where(grow, self.loss_scale * self.factor, self.loss_scale),
            jnp.maximum(self.loss_scale / self.factor, self.min_loss_scale),
        )
        # A scale that grows to inf would poison every later step; keep the old one instead.
        new_scale = jnp.where(jnp.isfinite(new_scale), new_scale, self.loss_scale)
        new_counter = jnp.where(grads_finite & ~grow, self.counter + 1, 0)
        return self.replace(loss_scale=new_scale.astype(jnp.float32), counter=new_counter.astype(jnp.int32))


class NoOpLossScale(flax.struct.PyTreeNode):
    """Loss scale of 1 that never changes: the fp32/bf16 counterpart of :class:`DynamicLossScale`."""

    def scale(self, tree: Any) -> Any:
        return tree

    def unscale(self, tree: Any) -> Any:
        return tree

    def adjust(self, grads_finite: jax.Array) -> NoOpLossScale:
        return self


def loss_scale_for(policy: str | Policy, **kwargs: Any) -> DynamicLossScale | NoOpLossScale:
    """The loss scale a policy (preset name or Policy) needs: dynamic for fp16 compute, no-op otherwise."""
    return DynamicLossScale.create(**kwargs) if get_policy(policy).needs_loss_scaling else NoOpLossScale()
