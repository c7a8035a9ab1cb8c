"""The layout of a run store, shared by its writer (:mod:`ivhl_jax.run.store_writer`), its reader
(:mod:`ivhl_jax.run.store_reader`) and its exporters (:mod:`ivhl_jax.run.store_export`): the folder's name, the
format marker, the metadata of the root group, the unit convention, and reading the root attributes and a region of
an array with damage named.

The convention every store follows (checked for each ``ivhl sim`` by ``tests/contracts/test_store_convention.py``):
the CF and ACDD global attributes (``Conventions``, ``title``, ``summary``, ``source``, ``date_created``); named
dimensions, shared across the variables that share an axis, each with a coordinate variable; and on every variable a
``units`` attribute that is a UDUNITS string (:func:`is_udunits`): ``"1"`` for a pure number or a count (a step or
sweep count, a quantity in natural units such as trap units, whose ``long_name`` names the unit it counts in), else
a product of powers of SI symbols with prefixes, optionally scaled by a number (``"m^2"``, ``"kg m s-2"``,
``"1.2e-06 m"``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ivhl_jax.core import backend
from ivhl_jax.train.checkpoint import key_names

__all__ = [
    "STORE_NAME",
    "FORMAT",
    "StoreError",
    "leaf_names",
    "library_info",
    "runtime_info",
    "settings_info",
    "jsonable",
    "fill_value",
    "barrier",
    "read_attrs",
    "read_region",
    "damaged_chunk",
    "find_store",
    "CONVENTIONS",
    "CHUNK_TIME",
    "record_rates",
    "record_counts",
    "is_udunits",
    "check_unit",
    "consolidate",
    "natural_units",
]

STORE_NAME = "run.zarr"  # the store's folder inside a run folder
FORMAT = "ivhl-run-store/1"  # root attribute that marks a run store (and its layout version)


class StoreError(ValueError):
    """A run store that cannot be used: not a run store, damaged, or written by another configuration."""


def leaf_names(tree: Any) -> list[str]:
    """The name of every leaf of ``tree`` in ``jax.tree_util`` order: its key path joined by ``.`` (dict keys,
    attribute names, sequence indices), ``value`` for a bare array; names are unique."""
    names = []
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names.append(".".join(key_names(path)) or "value")
    if len(set(names)) != len(names):
        raise ValueError(f"observation names are not unique: {names}")
    return names


def library_info() -> dict[str, Any]:
    """``{"version", "commit", "dirty"}`` of ivhl_jax: the installed version and, from a git checkout, the commit
    (None outside one)."""
    try:
        version: str | None = importlib.metadata.version("ivhl_jax")
    except importlib.metadata.PackageNotFoundError:
        version = None
    here = os.path.dirname(os.path.abspath(__file__))
    commit, dirty = None, None
    try:
        r = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            commit = r.stdout.strip()
            s = subprocess.run(
                ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            dirty = bool(s.stdout.strip()) if s.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"version": version, "commit": commit, "dirty": dirty}


def runtime_info() -> dict[str, Any]:
    """Devices, processes and versions of this run (differs between machines, so it is not compared)."""
    versions: dict[str, str | None] = {}
    for lib in ("jax", "jaxlib", "numpy", "zarr", "xarray"):
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            versions[lib] = None
    d = jax.devices()[0]
    return {
        "platform": backend.platform(),
        "device_kind": d.device_kind,
        "device_count": jax.device_count(),
        "process_count": jax.process_count(),
        "versions": versions,
    }


def settings_info() -> dict[str, Any]:
    cfg: Any = jax.config
    return {
        "jax_enable_x64": bool(cfg.jax_enable_x64),
        "jax_default_matmul_precision": cfg.jax_default_matmul_precision,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_platforms": os.environ.get("JAX_PLATFORMS", ""),
    }


def jsonable(obj: Any) -> Any:
    from ivhl_jax.run.io import to_jsonable

    return json.loads(json.dumps(to_jsonable(obj)))


def fill_value(dtype: np.dtype) -> Any:
    if np.issubdtype(dtype, np.complexfloating):
        return complex(np.nan, np.nan)
    if np.issubdtype(dtype, np.floating):
        return np.nan
    return False if dtype == np.bool_ else 0


def barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def read_attrs(path: str) -> dict[str, Any]:
    """The root attributes of the run store at ``path``; a StoreError naming it when it is none."""
    meta = os.path.join(path, "zarr.json")
    try:
        with open(meta) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise StoreError(f"{path} is not a run store (no zarr.json); remove it or use --no-resume") from None
    except (OSError, ValueError) as e:
        raise StoreError(
            f"run store {path} is damaged ({meta} is not readable JSON: {e}); remove it or use --no-resume"
        ) from None
    attrs = doc.get("attributes") if isinstance(doc, dict) else None
    if not isinstance(attrs, dict) or attrs.get("ivhl_format") != FORMAT:
        raise StoreError(
            f"{path} is not an ivhl run store (zarr.json lacks ivhl_format={FORMAT!r}); remove it or use --no-resume"
        )
    return attrs


def read_region(store: str, a: Any, region: tuple[slice, ...] | slice = slice(None)) -> np.ndarray:
    """``a[region]`` of the zarr array ``a`` of the run store at ``store``; a chunk that cannot be decoded (a
    damaged file: zarr would raise a long codec traceback) is a StoreError naming that chunk's file."""
    try:
        return np.asarray(a[region])
    except Exception as e:  # the codecs report damage in many ways; find the chunk to name it
        error = f"{type(e).__name__}: {e}".splitlines()[0]
        bad = damaged_chunk(a)
        where = os.path.join(store, a.path, *bad.split("/")) if bad else os.path.join(store, a.path)
        raise StoreError(
            f"run store {store} is damaged: chunk file {where} of {a.path!r} cannot be read ({error}); remove the "
            "run folder or rerun with --no-resume"
        ) from None


def damaged_chunk(a: Any) -> str | None:
    """The key (``c/3/0``) of the first chunk of ``a`` that cannot be read, None when each can."""
    for corner in np.ndindex(*a.cdata_shape):
        region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(corner, a.chunks, a.shape))
        try:
            a[region]
        except Exception:
            return str(a.metadata.encode_chunk_key(corner))
    return None


def find_store(path: str | os.PathLike) -> str:
    """The run store of ``path``: ``path`` itself, or ``path/run.zarr`` for a run folder."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isfile(os.path.join(path, "zarr.json")):
        return path
    inner = os.path.join(path, STORE_NAME)
    if os.path.isdir(inner):
        return inner
    raise StoreError(
        f"{path} holds no run store (neither {path}/zarr.json nor {inner}); pass a run folder that "
        "`ivhl sim` wrote or its run.zarr"
    )


CONVENTIONS = "CF-1.10, ACDD-1.3"  # the root attribute ``Conventions``
CHUNK_TIME = "chunk_time"  # the record dimension of observations taken once per chunk beside more frequent ones


def record_rates(names: list[str], leaves: list[Any]) -> int:
    """The records per chunk of a run's observations (``leaves``, named ``names``, each with its records first):
    the most any leaf holds. A store keeps two rates apart, each on its own dimension: that one (``time``, e.g. a
    loss per step) and one record per chunk (``chunk_time``, e.g. a test accuracy at each chunk's end); another
    count is a ValueError naming the observation."""
    rates = [int(np.shape(x)[0]) if np.ndim(x) else -1 for x in leaves]
    per_chunk = max(rates, default=0)
    for name, rate in zip(names, rates, strict=True):
        if rate not in (per_chunk, 1):
            raise ValueError(
                f"observation {name!r} holds {rate if rate >= 0 else 'no'} records per chunk; a run store keeps "
                f"records at one rate ({per_chunk} per chunk, the most any observation holds) and at one per chunk: "
                "give every observation a leading record axis of one of those lengths"
            )
    return per_chunk


def record_counts(attrs: Mapping[str, Any]) -> dict[str, int]:
    """The committed records along each record dimension of a store with root attributes ``attrs``."""
    n = int(attrs.get("records", 0))
    per_chunk = int(attrs.get("records_per_chunk", 0) or 0)
    return {"time": n, CHUNK_TIME: n // per_chunk if per_chunk else 0}


# UDUNITS symbols a store's units are built from, and the prefixes they take
_SYMBOLS = frozenset(
    p + s
    for p in ("", "Y", "Z", "E", "P", "T", "G", "M", "k", "h", "da", "d", "c", "m", "u", "µ", "n", "p", "f", "a")
    for s in "m g s A K mol cd rad sr Hz N Pa J W C V F ohm S Wb T H eV L min h d degree percent".split()
)
_FACTOR = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_TERM = re.compile(r"([A-Za-zµ]+)(?:\^?-?\d+)?")


def is_udunits(unit: Any) -> bool:
    """Whether ``unit`` is a UDUNITS string of this convention: ``"1"``, or an optional number then a product
    (spaces, ``.`` or ``*``) or quotient (``/``) of SI symbols with prefixes, each with an optional integer power
    (``m2``, ``m^2``, ``s-1``)."""
    if not isinstance(unit, str) or not unit.strip():
        return False
    text = unit.strip()
    if text == "1":
        return True
    scaled = re.fullmatch(rf"({_FACTOR.pattern})\s+(\S.*)", text)
    terms = re.split(r"[\s.*/]+", scaled[2] if scaled else text)
    return all(t == "1" or ((m := _TERM.fullmatch(t)) is not None and m[1] in _SYMBOLS) for t in terms)


def check_unit(name: str, unit: Any) -> str:
    """``unit`` when it is a UDUNITS string (:func:`is_udunits`), else a ValueError naming ``name`` and the fix."""
    if not is_udunits(unit):
        raise ValueError(
            f'the unit of {name!r} must be a UDUNITS string ("1" for a number or a count, "m", "J/m^3", '
            f'"1.2e-06 m"), got {unit!r}: give a quantity in natural units the unit "1" and name them in its '
            "long_name"
        )
    return unit


def consolidate(path: str) -> Any:
    """Consolidate the metadata of the store at ``path`` (what xarray reads) and return its root group reopened."""
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "consolidated metadata is not part of the v3 spec" (xarray reads it)
        zarr.consolidate_metadata(path)
    return zarr.open_group(path, mode="r+")


def natural_units(
    units: Mapping[str, str], scales: Mapping[str, str] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """``(units, long_names)`` for :meth:`RunStore.describe <ivhl_jax.run.store_writer.RunStore.describe>` from
    ``{variable: unit}`` where some units are natural ones a UDUNITS reader does not know (``"ħω"``, ``"trap
    length"``, ``"sweep"``). With ``scales``, ``{natural unit: its UDUNITS value}`` (``{"ħω": "1.32e-31 J"}``:
    the trap units of a given atom and trap), such a variable gets that unit, a scaled SI one; otherwise it holds
    a pure number, the quantity divided by its unit, so its unit is ``"1"``. Either way its ``long_name`` names
    the natural unit (``"energy_total in units of ħω"``); a UDUNITS unit is kept as it is."""
    out, names = {}, {}
    for name, unit in units.items():
        if is_udunits(unit):
            out[name] = unit
        else:
            out[name] = check_unit(name, (scales or {}).get(unit, "1"))
            names[name] = f"{name} in units of {unit}"
    return out, names
