"""Eager input validation and in-jit NaN/inf detection, shared by every public function.

Public functions call these helpers on their inputs *before* tracing work starts, so a bad argument
fails early with a message that names the argument, what was expected and what was received.
Checks that need concrete values (finiteness, ranges of arrays) are skipped for tracers, because
inside ``jit`` the values are not known; use :func:`checked` (``jax.experimental.checkify``) to
detect NaN/inf inside compiled code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

__all__ = [
    "is_concrete",
    "concrete_max",
    "check_array",
    "check_scalar",
    "check_choice",
    "check_broadcastable",
    "check_key",
    "check_couplings",
    "check_finite_tree",
    "checked",
]

_KINDS = {
    "floating": (np.floating,),
    "complex": (np.complexfloating,),
    "inexact": (np.floating, np.complexfloating),
    "integer": (np.integer,),
    "numeric": (np.number,),
    "bool": (np.bool_,),
}


def is_concrete(x: Any) -> bool:
    """True when ``x`` holds actual values (not a tracer inside jit/vmap/grad)."""
    return not isinstance(x, jax.core.Tracer)


def concrete_max(x: Any) -> float | None:
    """The largest element of ``x`` (a scalar or an array of parameters) when it holds values, None when traced."""
    return float(np.max(np.asarray(x))) if is_concrete(x) else None


def _dtype_ok(dtype: np.dtype, kind: str) -> bool:
    if kind not in _KINDS:
        raise ValueError(f"unknown dtype kind {kind!r}; use one of {sorted(_KINDS)}")
    # bfloat16 and other ml_dtypes are not numpy subclasses of np.floating; ask jnp.
    if kind in ("floating", "inexact", "numeric") and jnp.issubdtype(dtype, jnp.floating):
        return True
    if kind in ("complex", "inexact", "numeric") and jnp.issubdtype(dtype, jnp.complexfloating):
        return True
    return any(jnp.issubdtype(dtype, t) for t in _KINDS[kind])


def check_array(
    x: Any,
    name: str,
    *,
    ndim: int | Sequence[int] | None = None,
    shape: Sequence[int | None] | None = None,
    kind: str | None = None,
    finite: bool = False,
) -> jax.Array:
    """Validate an array argument and return it as a JAX array.

    Args:
      x: the value passed by the user (array-like).
      name: the argument's name, used in error messages.
      ndim: required number of dimensions (an int or a collection of allowed ints).
      shape: required shape; ``None`` entries are wildcards. Implies ``ndim``.
      kind: required dtype family: ``floating``, ``complex``, ``inexact``, ``integer``, ``numeric``,
        ``bool``.
      finite: reject NaN/inf (only checked for concrete values; see :func:`checked` under jit).

    Raises:
      TypeError: not array-like or wrong dtype family.
      ValueError: wrong rank/shape or non-finite values.
    """
    dt = getattr(x, "dtype", None)
    # ml_dtypes (bfloat16, float8) have NumPy kind "V", like structured void arrays: ask jnp which is numeric.
    if isinstance(dt, np.dtype) and (dt.kind in "OUSM" or (dt.kind == "V" and not jnp.issubdtype(dt, jnp.number))):
        raise TypeError(f"{name} must be a numeric array, got dtype {dt}")
    try:
        arr = jnp.asarray(x)
    except TypeError as e:
        raise TypeError(f"{name} must be array-like, got {type(x).__name__}") from e
    if kind is not None and not _dtype_ok(arr.dtype, kind):
        raise TypeError(f"{name} must have a {kind} dtype, got {arr.dtype}")
    if shape is not None:
        shape = tuple(shape)
        ok = arr.ndim == len(shape) and all(s is None or s == a for s, a in zip(shape, arr.shape))
        if not ok:
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{name} must have shape {want}, got {tuple(arr.shape)}")
    elif ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"{name} must be {want}-dimensional, got shape {tuple(arr.shape)}")
    if finite and is_concrete(arr) and jnp.issubdtype(arr.dtype, jnp.inexact):
        # NumPy on the host: inside a jit trace even jnp ops on a concrete constant produce tracers.
        host = np.asarray(arr)
        if host.dtype == jnp.bfloat16:
            host = host.astype(np.float32)
        if not np.all(np.isfinite(host)):
            raise ValueError(f"{name} contains NaN or inf values")
    return arr


def check_scalar(
    x: Any,
    name: str,
    *,
    positive: bool = False,
    nonnegative: bool = False,
    integer: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
) -> Any:
    """Validate a scalar (Python number or 0-d array); tracers pass through unchecked in value.

    Returns the input unchanged so it can be used inline.
    """
    if is_concrete(x):
        arr = np.asarray(x)
        if arr.ndim != 0:
            raise ValueError(f"{name} must be a scalar, got shape {arr.shape}")
        if not np.issubdtype(arr.dtype, np.number) and arr.dtype != np.bool_:
            raise TypeError(f"{name} must be a number, got {type(x).__name__}")
        # Any: a complex value makes the order comparisons below raise TypeError, as intended.
        v: Any = complex(arr) if np.iscomplexobj(arr) else float(arr)
        # Finiteness before the integer test: int(nan) / int(inf) would raise an error that names nothing.
        if isinstance(v, float) and not np.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
        if integer and not (np.issubdtype(arr.dtype, np.integer) or (isinstance(v, float) and v == int(v))):
            raise TypeError(f"{name} must be an integer, got {x!r}")
        # an integer given is echoed as one ("got -5", not "got -5.0")
        shown = int(arr) if np.issubdtype(arr.dtype, np.integer) else v
        if positive and not v > 0:
            raise ValueError(f"{name} must be > 0, got {shown}")
        if nonnegative and not v >= 0:
            raise ValueError(f"{name} must be >= 0, got {shown}")
        if minimum is not None and v < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {shown}")
        if maximum is not None and v > maximum:
            raise ValueError(f"{name} must be <= {maximum}, got {shown}")
    elif jnp.ndim(x) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(x)}")
    return x


def check_choice(x: Any, name: str, choices: Sequence[Any]) -> Any:
    """Validate that ``x`` is one of ``choices``."""
    if x not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {x!r}")
    return x


def check_broadcastable(x: Any, name: str, length: int, length_name: str) -> jax.Array:
    """Validate a per-item argument that is a scalar or has shape ``(length,)``; return shape (length,)."""
    arr = jnp.asarray(x)
    if arr.ndim == 0:
        return jnp.broadcast_to(arr, (length,))
    if arr.shape != (length,):
        raise ValueError(
            f"{name} must be a scalar or have shape ({length},) to match {length_name}, got {tuple(arr.shape)}"
        )
    return arr


def check_key(key: Any, name: str = "key") -> Any:
    """Validate a single PRNG key: a typed key (``jax.random.key(seed)``) or a legacy ``uint32[2]`` one.

    An integer seed, a float or a batch of keys fails here with a TypeError/ValueError naming ``name``
    instead of inside ``jax.random`` at the first split. Returns ``key`` unchanged.
    """
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if jnp.ndim(key) != 0:
            raise ValueError(f"{name} must be a single PRNG key, got a batch of shape {jnp.shape(key)}")
        return key
    if dtype is not None and dtype == jnp.uint32 and jnp.shape(key) == (2,):
        return key  # legacy raw key (jax.random.PRNGKey)
    raise TypeError(
        f"{name} must be a PRNG key, e.g. jax.random.key(seed), got {type(key).__name__}"
        + (f" of dtype {dtype} and shape {jnp.shape(key)}" if dtype is not None else f" {key!r}")
    )


def check_couplings(values: dict[str, Any], *, signed: Sequence[str] = ()) -> dict[str, Any]:
    """The couplings of a stepper's parameters, ``{name: value}``, each a number, an array or a tracer: every
    concrete element checked (a finite number; ``>= 0`` unless its name is in ``signed``). Returned in the same
    order: Python floats when all are scalars; float32 arrays of one broadcast shape when any is an array (one
    shape, so that ``jax.vmap`` over the parameters maps every coupling; float32, the precision the compiled
    steps compute with, so a batch runs bit-identically to its scalars); unchanged when any is traced (built
    inside ``jax.vmap``/``jit``: the arithmetic broadcasts)."""
    for name, v in values.items():
        if not is_concrete(v):
            continue
        if np.ndim(v) == 0:
            check_scalar(v, name, nonnegative=name not in signed)
            continue
        arr = np.asarray(v)
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise TypeError(f"{name} must be a number or an array of numbers, got {type(v).__name__}")
        for x in arr.reshape(-1):
            check_scalar(x, name, nonnegative=name not in signed)
    if not all(is_concrete(v) for v in values.values()):
        return dict(values)
    if all(np.ndim(v) == 0 for v in values.values()):
        return {name: float(v) for name, v in values.items()}
    try:
        shape = np.broadcast_shapes(*(np.shape(v) for v in values.values()))
    except ValueError:
        names = list(values)
        raise ValueError(
            f"{', '.join(names[:-1])} and {names[-1]} must broadcast to one shape, "
            f"got shapes {tuple(np.shape(v) for v in values.values())}"
        ) from None
    return {name: np.broadcast_to(np.asarray(v, np.float32), shape).copy() for name, v in values.items()}


def check_finite_tree(tree: Any, name: str) -> None:
    """Inside jit: register a checkify check that every inexact leaf of ``tree`` is finite.

    Has an effect only when the enclosing function runs under :func:`checked`. Concrete leaves (outside
    jit) are checked at once: a ValueError names the first non-finite leaf.
    """
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            where = f"{name}{jax.tree_util.keystr(path)}"
            if is_concrete(leaf):
                if not bool(np.all(np.isfinite(np.asarray(leaf)))):
                    raise ValueError(f"{where} contains NaN or inf values")
                continue
            checkify.check(jnp.all(jnp.isfinite(leaf)), f"{where} became NaN or inf")


def checked(fn: Callable, *, float_checks: bool = True) -> Callable:
    """Wrap ``fn`` so that NaN/inf produced inside it (even under jit) raise ``FloatingPointError``.

    Uses ``jax.experimental.checkify`` with the user checks registered by :func:`check_finite_tree`
    and, if ``float_checks``, XLA-level NaN checks on every floating operation. The wrapped function
    is jitted; use it for debugging runs (it is slower than ``fn``).
    """
    errors = checkify.user_checks | (checkify.float_checks if float_checks else set())
    checked_fn = jax.jit(checkify.checkify(fn, errors=errors))

    def wrapper(*args, **kwargs):
        err, out = checked_fn(*args, **kwargs)
        msg = err.get()
        if msg is not None:
            raise FloatingPointError(msg)
        return out

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    wrapper.__doc__ = fn.__doc__
    return wrapper
