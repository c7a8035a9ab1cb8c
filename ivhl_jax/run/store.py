"""The run store: one self-describing, chunked, compressed Zarr v3 store per run that xarray opens directly.

:class:`RunStore` receives what :func:`ivhl_jax.run.runner.run_chunked` produces chunk by chunk and writes it
into ``<out>/run.zarr``:

* **observations** — every leaf of the observation pytree is one array named by its key path
  (``energy_kinetic``, ``norm``; a bare leaf is ``value``) with the record dimension ``time`` first, its
  ``units`` attribute, and the coordinates ``time`` (``step · dt``) and ``step`` (steps done when the record was
  taken);
* **snapshots** (:class:`Snapshots`) — fields of the state (ψ, or |ψ|² and arg ψ at a chosen precision) every
  ``every`` steps, with dimension ``snapshot_time`` first and then the grid axes (``x, y, z`` with their
  coordinate arrays and units). A sharded field is written shard by shard: each process writes the zarr chunks
  of the shards it holds (a chunk is one shard, so no two processes touch one file) and nothing is gathered;
* **attributes** of the root group — ``config`` (the run's configuration), ``settings`` (x64, XLA flags and
  what the caller adds), ``seeds``, ``library`` (version and git commit), ``runtime`` (devices, processes,
  versions), and the committed counts ``records`` and ``snapshots``; and the CF and ACDD global attributes
  ``Conventions`` (``"CF-1.10, ACDD-1.3"``), ``title``, ``summary``, ``source`` and ``date_created`` (ISO 8601,
  UTC, when the store was created).

Units are UDUNITS strings (``"1"`` for a dimensionless quantity or a count, ``"m^2"``, ``"s"``); the ``step``
coordinates count steps (``"1"``).

``xarray.open_zarr(path)`` gives all of it as one Dataset (consolidated metadata, named dimensions);
:func:`open_run` returns the observations and snapshots as Datasets cut to the committed records, plus the
metadata.

Safety. The arrays are allocated for the whole run when it starts (unwritten records hold NaN), so a chunk's
append only writes chunk files, each atomically (zarr's local store writes a temporary file and renames it);
``records``/``snapshots`` are raised after the chunk's files are written. A resumed run restarts from its
checkpoint at step ``S``: the committed counts are cut back to ``S`` and the chunks after ``S`` are written again
with the same bits, so a run killed at any moment and resumed leaves the store of an uninterrupted run. The store
refuses, in one line naming it, a folder that is not a run store and a store written by another configuration;
the folder holding it is locked (:func:`ivhl_jax.run.lock.lock_run_dir`), so two runs cannot write it.

Overlap. Writes run on one background thread: ``append`` hands the chunk's device arrays over and returns, so
the host copy, compression and file writes overlap the next chunk's compute; at most one chunk is in flight
(host memory stays bounded). :meth:`RunStore.flush` waits for it (``run_chunked`` calls it before each
checkpoint, so a checkpoint never counts a record the store lacks).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import importlib.metadata
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core import backend
from ivhl_jax.run.config import config_defaults, differing_keys
from ivhl_jax.run.lock import check_not_link, lock_run_dir, release_run_dir
from ivhl_jax.train.checkpoint import key_names

__all__ = [
    "RunStore",
    "write_final_state",
    "Snapshots",
    "open_run",
    "RunData",
    "StoreError",
    "STORE_NAME",
    "leaf_names",
    "library_info",
    "write_xdmf",
    "export_npy",
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


def _runtime() -> dict[str, Any]:
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


def _settings() -> dict[str, Any]:
    cfg: Any = jax.config
    return {
        "jax_enable_x64": bool(cfg.jax_enable_x64),
        "jax_default_matmul_precision": cfg.jax_default_matmul_precision,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_platforms": os.environ.get("JAX_PLATFORMS", ""),
    }


def _jsonable(obj: Any) -> Any:
    from ivhl_jax.run.io import to_jsonable

    return json.loads(json.dumps(to_jsonable(obj)))


@dataclasses.dataclass(frozen=True)
class Snapshots:
    """Which fields of the state a run writes, and how often.

    Attributes:
      every: steps between two snapshots (a multiple of the run's ``steps_per_chunk``: snapshots are taken at
        chunk ends, the first after ``every`` steps).
      fields: ``fields(state) -> {name: array}``, jittable; each array has the grid's shape (sharded like the
        state: its shards are written where they live). E.g. ``lambda psi: {"psi": psi}``.
      dims: names of the grid axes (``("x", "y", "z")``), one per field axis.
      coords: ``{dim: 1-D coordinate values}`` of the grid axes (optional per axis).
      units: ``{field or dim: unit}``.
    """

    every: int
    fields: Callable[[Any], Mapping[str, Any]]
    dims: tuple[str, ...]
    coords: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    units: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"snapshot every must be an integer >= 1 (steps between snapshots), got {self.every!r}")
        if not callable(self.fields):
            raise TypeError(f"snapshot fields must be a function state -> {{name: array}}, got {self.fields!r}")
        if not self.dims or not all(isinstance(d, str) and d for d in self.dims):
            raise ValueError(f"snapshot dims must name the grid axes, e.g. ('x', 'y'), got {self.dims!r}")


def _fill(dtype: np.dtype) -> Any:
    if np.issubdtype(dtype, np.complexfloating):
        return complex(np.nan, np.nan)
    if np.issubdtype(dtype, np.floating):
        return np.nan
    return False if dtype == np.bool_ else 0


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


class RunStore:
    """The store of one run at ``path`` (a ``.zarr`` folder), written by :func:`ivhl_jax.run.runner.run_chunked`
    (``sink=``).

    Args:
      path: the store's folder (``<out>/run.zarr``).
      config: the run's configuration (a dataclass or mapping), stored as the ``config`` attribute and compared
        on resume.
      resume: keep an existing store of the same configuration (the run resumes into it); False replaces it.
      extendable: config keys a resumed run may change (a larger step count extends a finished run).
      dt: time per step: the ``time`` coordinate is ``step · dt`` (without it ``time`` is the step count).
      time_unit: unit of ``time`` (``"steps"`` without ``dt``).
      units: ``{observation name: unit}`` (see :func:`leaf_names`); names without one get ``""``.
      snapshots: the field snapshots to write (:class:`Snapshots`), or None.
      seeds: ``{name: seed}`` recorded as the ``seeds`` attribute (default: the config keys holding ``seed``).
      settings: extra settings in force, merged into the ``settings`` attribute.
      attrs: further JSON-ready root attributes (``title`` and ``summary`` replace the defaults).
      lock: lock the folder that holds the store (:func:`ivhl_jax.run.lock.lock_run_dir`); a sub-store
        (:meth:`child`) is covered by its parent's lock.
      defaults: the configuration's default values (default: those of ``config``'s fields when it is a
        dataclass): a key missing from a store written before that setting existed matches its default
        (:func:`ivhl_jax.run.config.differing_keys`).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        config: Any = None,
        resume: bool = False,
        extendable: Sequence[str] = (),
        dt: float | None = None,
        time_unit: str | None = None,
        units: Mapping[str, str] | None = None,
        snapshots: Snapshots | None = None,
        seeds: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
        attrs: Mapping[str, Any] | None = None,
        lock: bool = True,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise TypeError(f"path must be the store's folder path, got {path!r}")
        if dt is not None and not (
            isinstance(dt, (int, float)) and not isinstance(dt, bool) and math.isfinite(dt) and dt > 0
        ):
            raise ValueError(f"dt must be a finite number > 0 (time per step) or None, got {dt!r}")
        if snapshots is not None and not isinstance(snapshots, Snapshots):
            raise TypeError(f"snapshots must be an ivhl_jax.run.store.Snapshots or None, got {snapshots!r}")
        self.path = os.path.abspath(os.fspath(path))
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise StoreError(f"run store {self.path} is a file; pass a folder path")
        self.dt = dt
        self.time_unit = time_unit if time_unit is not None else ("steps" if dt is None else "")
        self.units = dict(units or {})
        self.rename: dict[str, str] = {}
        self.dims: dict[str, tuple[str, ...]] = {}  # observation -> names of its axes after ``time``
        self.coords: dict[str, np.ndarray] = {}  # dimension -> coordinate values
        self.snapshots = snapshots
        self.extendable = tuple(extendable)
        if defaults is None and dataclasses.is_dataclass(config) and not isinstance(config, type):
            defaults = config_defaults(config)
        self._defaults = _jsonable(dict(defaults or {}))
        cfg = _jsonable(
            dataclasses.asdict(config)
            if dataclasses.is_dataclass(config) and not isinstance(config, type)
            else (config or {})
        )
        if seeds is None:
            seeds = {k: v for k, v in cfg.items() if "seed" in k} if isinstance(cfg, dict) else {}
        library = library_info()
        self._attrs = {
            "ivhl_format": FORMAT,
            "Conventions": "CF-1.10, ACDD-1.3",
            "title": "ivhl_jax run store",
            "summary": "The records of one ivhl_jax run: observations over time, snapshots and final fields.",
            "source": f"ivhl_jax {library['version']}",
            "config": cfg,
            "settings": {**_settings(), **_jsonable(settings or {})},
            "seeds": _jsonable(dict(seeds)),
            "library": library,
            "runtime": _runtime(),
            **_jsonable(dict(attrs or {})),
        }
        self._writer = jax.process_index() == 0  # writes metadata and the (replicated) observations
        check_not_link(self.path, "run store")  # a link would send this run's records into another run's store
        self._locked: str | None = None
        if lock:
            lock_run_dir(os.path.dirname(self.path))  # two runs cannot write the same store
            self._locked = os.path.dirname(self.path)
        try:
            if self._writer:
                if os.path.isdir(self.path) and resume:
                    self._check_existing(cfg)
                elif os.path.exists(self.path):
                    shutil.rmtree(self.path)
                if not os.path.isdir(self.path):
                    self._create()
            _barrier(f"ivhl-store-open:{self.path}")
            import zarr

            self._group: Any = zarr.open_group(self.path, mode="r+")
        except BaseException:
            if self._locked is not None:  # a store refused here holds nothing
                release_run_dir(self._locked)
            raise
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ivhl-store")
        self._pending: concurrent.futures.Future | None = None
        self._plan: dict[str, Any] | None = None
        self._extract: Callable[[Any], Any] | None = None
        self.snapshot_hlo: str | None = None  # the compiled snapshot program (set by begin)
        self._done = [0, 0]  # records and snapshots written by this process (committed by flush across processes)
        self._limits: dict[str, int] = {}  # the longest an existing array may be along each axis (set by begin)

    # --- opening -------------------------------------------------------------------------------------------
    def _create(self) -> None:
        import zarr

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        attrs = {**self._attrs, "date_created": created, "records": 0, "snapshots": 0}
        zarr.open_group(self.path, mode="w", attributes=attrs)

    def _check_existing(self, cfg: Any) -> None:
        attrs = _read_attrs(self.path)
        old = attrs.get("config")
        if isinstance(old, dict) and isinstance(cfg, dict):
            diff = differing_keys(old, cfg, defaults=self._defaults, extendable=self.extendable)
            if diff:
                raise StoreError(
                    f"run store {self.path} was written by a different configuration (differs in "
                    f"{diff}); use --no-resume to start over or another --out"
                )
        elif old != cfg:
            raise StoreError(
                f"run store {self.path} was written by a different configuration; use --no-resume to "
                "start over or another --out"
            )

    # --- the run -------------------------------------------------------------------------------------------
    def begin(
        self, observation_like: Any, *, steps_per_chunk: int, n_chunks: int, done_chunks: int, state_like: Any = None
    ) -> None:
        """Allocate the arrays for ``n_chunks`` chunks of ``steps_per_chunk`` steps (records per chunk: the
        observations' leading axis) and cut the committed counts back to ``done_chunks`` (a resume); called by
        :func:`ivhl_jax.run.runner.run_chunked` once the checkpoint is known."""
        import zarr

        leaves = jax.tree_util.tree_leaves(observation_like)
        per_chunk = int(leaves[0].shape[0]) if leaves else 0
        names = [self.rename.get(n, n) for n in leaf_names(observation_like)] if leaves else []
        n_records = n_chunks * per_chunk
        every = self.snapshots.every if self.snapshots is not None else 0
        if every and every % steps_per_chunk:
            raise ValueError(
                f"snapshot_every ({every}) must be a multiple of steps_per_chunk ({steps_per_chunk}): "
                "snapshots are taken at chunk ends"
            )
        n_snap = (n_chunks * steps_per_chunk) // every if every else 0
        snap_like: dict[str, Any] = {}
        if self.snapshots is not None:
            if state_like is None:
                raise ValueError("a store with snapshots needs state_like (the state's shapes)")
            fields = self.snapshots.fields
            self._extract = jax.jit(lambda s: {k: jnp.copy(v) for k, v in fields(s).items()})
            # compiled once here: its output shardings give the chunk shape (one chunk per shard), and
            # snapshot_hlo lets a caller check that no collective gathers the field
            compiled = self._extract.lower(state_like).compile()
            self.snapshot_hlo = compiled.as_text()
            snap_like = {
                k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=compiled.output_shardings[k])
                for k, v in jax.eval_shape(self._extract, state_like).items()
            }
        committed = _read_attrs(self.path)
        held_r, held_s = int(committed.get("records", 0)), int(committed.get("snapshots", 0))
        want_r, want_s = done_chunks * per_chunk, (done_chunks * steps_per_chunk) // every if every else 0
        if held_r < want_r or held_s < want_s:
            raise StoreError(
                f"run store {self.path} holds {held_r} records and {held_s} snapshots but the checkpoint "
                f"expects {want_r} and {want_s}; the store lost data after the checkpoint: rerun with "
                "--no-resume"
            )
        # An existing array is never grown or cut (nor read) to a length beyond what the configuration implies:
        # the store's own configuration's steps scale the records and snapshots this run writes.
        old_steps, new_steps = (c.get("steps") for c in (committed.get("config") or {}, self._attrs["config"] or {}))
        counts = [v for v in (old_steps, new_steps) if isinstance(v, int) and not isinstance(v, bool) and v > 0]
        scale = max(1.0, counts[0] / counts[1]) if len(counts) == 2 else 1.0
        self._limits = {"time": math.ceil(n_records * scale), "snapshot_time": math.ceil(n_snap * scale)}
        if self._writer:
            g = self._group
            record_steps = (np.arange(n_records) + 1) * (steps_per_chunk // per_chunk) if per_chunk else np.zeros(0)
            self._coord(g, "time", "time", self._times(record_steps), self.time_unit)
            self._coord(g, "step", "time", record_steps.astype(np.int64), "1")
            for dim, values in self.coords.items():
                if dim not in g:
                    self._coord(g, dim, dim, values, self.units.get(dim, ""))
            for name, leaf in zip(names, leaves, strict=True):
                shape = (n_records, *leaf.shape[1:])
                chunks = (per_chunk, *leaf.shape[1:])
                named = self.dims.get(name, tuple(f"{name}_dim{i}" for i in range(1, len(shape))))
                if len(named) != len(shape) - 1:
                    raise ValueError(f"observation {name!r} has {len(shape) - 1} axes after time, dims name {named}")
                dims = ("time", *named)
                self._array(g, name, shape, chunks, np.dtype(leaf.dtype), dims, self.units.get(name, ""), "step")
            if self.snapshots is not None:
                snap_steps = (np.arange(n_snap) + 1) * every
                self._coord(g, "snapshot_time", "snapshot_time", self._times(snap_steps), self.time_unit)
                self._coord(g, "snapshot_step", "snapshot_time", snap_steps.astype(np.int64), "1")
                for dim in self.snapshots.dims:
                    if dim in self.snapshots.coords:
                        c = np.asarray(self.snapshots.coords[dim])
                        self._coord(g, dim, dim, c, self.snapshots.units.get(dim, ""))
                for name, like in snap_like.items():
                    if len(like.shape) != len(self.snapshots.dims):
                        raise ValueError(
                            f"snapshot field {name!r} has shape {like.shape} but dims "
                            f"{self.snapshots.dims} name {len(self.snapshots.dims)} axes"
                        )
                    shard = like.sharding.shard_shape(like.shape)
                    self._array(
                        g,
                        name,
                        (n_snap, *like.shape),
                        (1, *shard),
                        np.dtype(like.dtype),
                        ("snapshot_time", *self.snapshots.dims),
                        self.snapshots.units.get(name, ""),
                        "snapshot_step",
                    )
            g.attrs.update({**self._attrs, "records": want_r, "snapshots": want_s})  # a resume may extend the steps
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "consolidated metadata is not part of the v3 spec" (xarray reads it)
                zarr.consolidate_metadata(self.path)
            self._group = zarr.open_group(self.path, mode="r+")
        _barrier(f"ivhl-store-begin:{self.path}")
        if not self._writer:
            self._group = zarr.open_group(self.path, mode="r+")
        self._plan = {
            "names": names,
            "per_chunk": per_chunk,
            "spc": steps_per_chunk,
            "every": every,
            "fields": list(snap_like),
        }
        self._done = [want_r, want_s]

    def _times(self, steps: np.ndarray) -> np.ndarray:
        return steps.astype(np.float64) * (self.dt if self.dt is not None else 1.0)

    def _coord(self, g: Any, name: str, dim: str, values: np.ndarray, unit: str) -> None:
        a = self._array(g, name, values.shape, values.shape or (1,), values.dtype, (dim,), unit, chunked=False)
        if values.size:
            a[...] = values

    def _array(
        self,
        g: Any,
        name: str,
        shape: tuple,
        chunks: tuple,
        dtype: np.dtype,
        dims: tuple,
        unit: str,
        coordinates: str = "",
        *,
        chunked: bool = True,
    ) -> Any:
        """Create ``name`` or grow/shrink it to ``shape`` (a resumed run that extends the steps). An existing array
        is first checked against what the run implies, from its metadata alone: its dtype, trailing shape and
        axes, its length (at most what the store's configuration implied) and, for a data array (``chunked``),
        its chunks; anything else is a StoreError naming its ``zarr.json`` before anything is resized or read."""
        chunks = tuple(max(1, int(c)) for c in chunks)
        if name in g:
            meta = os.path.join(self.path, name, "zarr.json")
            a = g[name]
            limit = self._limits.get(dims[0], shape[0]) if dims else 0
            if (
                a.dtype != dtype
                or a.shape[1:] != tuple(shape[1:])
                or tuple(a.metadata.dimension_names or ()) != dims
                or (len(a.shape) and a.shape[0] > max(limit, shape[0]))
                or (chunked and tuple(a.chunks) != chunks)
            ):
                raise StoreError(
                    f"run store metadata {meta} declares {a.dtype}{a.shape} in chunks {a.chunks} over "
                    f"{a.metadata.dimension_names}, but this run's configuration implies {dtype}{shape} in chunks "
                    f"{chunks} over {dims} (at most {max(limit, shape[0])} along {dims[0] if dims else '-'}): "
                    "rerun with --no-resume"
                )
            if a.shape != tuple(shape):
                a.resize(shape)
            return a
        return g.create_array(
            name,
            shape=shape,
            chunks=chunks,
            dtype=dtype,
            fill_value=_fill(dtype),
            dimension_names=dims,
            attributes={"units": unit, **({"coordinates": coordinates} if coordinates else {})},
        )

    def append(self, start: int, observations: Any, *, step: int | None = None, state: Any = None) -> None:
        """Queue one chunk: its observations (first record ``start``) and, when ``step`` is a snapshot step, the
        snapshot fields of ``state``. Returns once the previous chunk is written (one in flight)."""
        if self._plan is None:
            raise RuntimeError("RunStore.begin must be called before append (run_chunked does it)")
        obs = jax.tree_util.tree_leaves(observations)
        if len(obs) != len(self._plan["names"]):
            raise ValueError(
                f"observations hold {len(obs)} arrays, the store was set up for {len(self._plan['names'])}"
            )
        snap = None
        every = self._plan["every"]
        if every and step is not None and step % every == 0:
            if state is None:
                raise ValueError(f"step {step} is a snapshot step: pass the state")
            assert self._extract is not None
            snap = (step // every - 1, self._extract(state))  # new buffers: the next chunk may donate the state
        for leaf in obs:
            if hasattr(leaf, "copy_to_host_async"):
                leaf.copy_to_host_async()
        self.wait()
        self._pending = self._pool.submit(self._write, int(start), obs if self._writer else [], snap)

    def _write(self, start: int, obs: list[Any], snap: tuple[int, dict[str, Any]] | None) -> None:
        g = self._group
        plan = self._plan
        assert plan is not None
        per = plan["per_chunk"]
        for name, leaf in zip(plan["names"] if obs else [], obs, strict=True):
            g[name][start : start + per] = np.asarray(leaf)
        if snap is not None:
            index, fields = snap
            for name, arr in fields.items():
                for shard in getattr(arr, "addressable_shards", None) or ():
                    if shard.replica_id == 0:  # a replicated shard is written once
                        g[name][(index, *shard.index)] = np.asarray(shard.data)
                if not hasattr(arr, "addressable_shards"):
                    g[name][index] = np.asarray(arr)
        self._done = [start + per, snap[0] + 1 if snap is not None else self._done[1]]
        if jax.process_count() == 1:
            self._commit()

    def _commit(self) -> None:
        self._group.attrs.update({"records": self._done[0], "snapshots": self._done[1]})

    def wait(self) -> None:
        """Wait for the chunk in flight (its exception, if any, is raised here)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def flush(self) -> None:
        """Wait for every queued write and commit the counts (all processes call it: they meet here)."""
        self.wait()
        if jax.process_count() > 1:
            _barrier(f"ivhl-store-flush:{self.path}")
            if self._writer:
                self._commit()
            _barrier(f"ivhl-store-commit:{self.path}")

    def close(self) -> None:
        """Flush, stop the writer thread and release the store's hold of its folder's lock."""
        try:
            self.flush()
        finally:
            self.release()

    def release(self) -> None:
        """Stop the writer thread (queued writes finish first) and release the store's hold of its folder's lock,
        without committing the counts (:meth:`close` does both); a second call does nothing."""
        self._pool.shutdown(wait=True)
        locked, self._locked = self._locked, None
        if locked is not None:
            release_run_dir(locked)

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.release()

    def describe(
        self,
        *,
        dt: float | None = None,
        time_unit: str | None = None,
        units: Mapping[str, str] | None = None,
        snapshots: Snapshots | None = None,
        rename: Mapping[str, str] | None = None,
        dims: Mapping[str, Sequence[str]] | None = None,
        coords: Mapping[str, Any] | None = None,
    ) -> RunStore:
        """Set what a simulation knows of its records before the run starts (:meth:`begin`): the time per step,
        its unit, the observations' units, the snapshots, new names for observations (``{"value": "energy"}``
        for a bare scalar), the names of an observation's axes after ``time`` (``{"lengths": ("chain",
        "slice")}``; observations that share an axis share its name; default ``<name>_dim<i>``) and the 1-D
        coordinate values of such axes (``{"chain": np.arange(8)}``, units from ``units``). Returns the store."""
        if self._plan is not None:
            raise RuntimeError("describe the store before the run starts")
        if dt is not None:
            if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not (math.isfinite(dt) and dt > 0):
                raise ValueError(f"dt must be a finite number > 0 (time per step), got {dt!r}")
            self.dt = float(dt)
            self.time_unit = "" if time_unit is None else time_unit
        if time_unit is not None:
            self.time_unit = time_unit
        if units is not None:
            self.units.update(units)
        if rename is not None:
            self.rename.update(rename)
        if dims is not None:
            for name, names in dims.items():
                names = tuple(names)
                if not all(isinstance(d, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", d) for d in names):
                    raise ValueError(f"dims of {name!r} must be names (letters, digits, _), got {names!r}")
                self.dims[name] = names
        if coords is not None:
            for dim, values in coords.items():
                values = np.asarray(values)
                if values.ndim != 1:
                    raise ValueError(f"coordinate {dim!r} must be 1-D values, got shape {values.shape}")
                self.coords[dim] = values
        if snapshots is not None:
            if not isinstance(snapshots, Snapshots):
                raise TypeError(f"snapshots must be an ivhl_jax.run.store.Snapshots, got {snapshots!r}")
            self.snapshots = snapshots
        return self

    def write_field(
        self,
        name: str,
        array: Any,
        dims: Sequence[str],
        *,
        coords: Mapping[str, Any] | None = None,
        units: Mapping[str, str] | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        """Write one field of the run (e.g. its final state) as the array ``name`` over ``dims``, shard by shard.

        Every process calls it (they meet at barriers). A sharded ``array`` (a ``jax.Array``) is written as one
        zarr chunk per shard, each by the process that holds it (replicated shards once); nothing is gathered.
        ``coords`` gives 1-D coordinate values of the dims (written when the store lacks them), ``units``
        ``{name or dim: unit}``, ``attrs`` further JSON-ready attributes of the array. An array of that name from
        an earlier call (a resumed run) is replaced."""
        import zarr

        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            raise ValueError(f"name must be a letter then letters, digits or _, got {name!r}")
        dims = tuple(dims)
        shape = tuple(int(n) for n in np.shape(array))
        if len(dims) != len(shape) or not all(isinstance(d, str) and d for d in dims):
            raise ValueError(f"dims must name the {len(shape)} axes of {name!r} (shape {shape}), got {dims!r}")
        units = dict(units or {})
        sharding = getattr(array, "sharding", None)
        chunks = tuple(max(1, c) for c in (sharding.shard_shape(shape) if sharding is not None else shape))
        dtype = np.dtype(array.dtype)
        self.wait()  # the writer thread is idle: this thread may touch the group
        if self._writer:
            g: Any = zarr.open_group(self.path, mode="r+", use_consolidated=False)  # sees the arrays it creates
            for d, c in (coords or {}).items():
                if d not in g:
                    c = np.asarray(c)
                    self._coord(g, d, d, c, units.get(d, ""))
            if name in g:
                old = g[name]
                if (
                    old.shape != shape
                    or old.dtype != dtype
                    or tuple(old.metadata.dimension_names) != dims
                    or tuple(old.chunks) != chunks
                ):
                    del g[name]
            if name not in g:
                g.create_array(
                    name, shape=shape, chunks=chunks or (1,), dtype=dtype, fill_value=_fill(dtype), dimension_names=dims
                )
            g[name].attrs.update({"units": units.get(name, ""), **_jsonable(dict(attrs or {}))})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "consolidated metadata is not part of the v3 spec" (xarray reads it)
                zarr.consolidate_metadata(self.path)
            self._group = zarr.open_group(self.path, mode="r+")
        _barrier(f"ivhl-store-field-create:{self.path}:{name}")
        if not self._writer:
            self._group = zarr.open_group(self.path, mode="r+")
        target = self._group[name]
        shards = getattr(array, "addressable_shards", None)
        if shards is None:
            if self._writer:
                target[...] = np.asarray(array)
        else:
            for shard in shards:
                if shard.replica_id == 0:  # a replicated shard is written once
                    target[shard.index] = np.asarray(shard.data)
        _barrier(f"ivhl-store-field-written:{self.path}:{name}")

    def child(self, name: str) -> RunStore:
        """A sub-store ``<path>/<name>`` (a zarr group) for one stage of a run with several (each its own
        records); it keeps a store of the same configuration and is covered by this store's lock."""
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_]+", name):
            raise ValueError(f"name must be letters, digits or _, got {name!r}")
        sub = RunStore(
            os.path.join(self.path, name),
            config=self._attrs["config"],
            resume=True,
            extendable=self.extendable,
            dt=self.dt,
            time_unit=self.time_unit,
            units=self.units,
            seeds=self._attrs["seeds"],
            lock=False,
            defaults=self._defaults,
            attrs={k: self._attrs[k] for k in ("title", "summary")},
        )
        return sub

    # --- reading -------------------------------------------------------------------------------------------
    def read(self, like: Any = None) -> Any:
        """The committed observations as NumPy arrays: the pytree of ``like`` (an observation of the run),
        or ``{name: array}`` without it."""
        self.flush()
        return read_observations(self.path, like, rename=self.rename)


def _read_attrs(path: str) -> dict[str, Any]:
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


def _read_region(store: str, a: Any, region: tuple[slice, ...] | slice = slice(None)) -> np.ndarray:
    """``a[region]`` of the zarr array ``a`` of the run store at ``store``; a chunk that cannot be decoded (a
    damaged file: zarr would raise a long codec traceback) is a StoreError naming that chunk's file."""
    try:
        return np.asarray(a[region])
    except Exception as e:  # the codecs report damage in many ways; find the chunk to name it
        error = f"{type(e).__name__}: {e}".splitlines()[0]
        bad = _damaged_chunk(a)
        where = os.path.join(store, a.path, *bad.split("/")) if bad else os.path.join(store, a.path)
        raise StoreError(
            f"run store {store} is damaged: chunk file {where} of {a.path!r} cannot be read ({error}); remove the "
            "run folder or rerun with --no-resume"
        ) from None


def _damaged_chunk(a: Any) -> str | None:
    """The key (``c/3/0``) of the first chunk of ``a`` that cannot be read, None when each can."""
    for corner in np.ndindex(*a.cdata_shape):
        region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(corner, a.chunks, a.shape))
        try:
            a[region]
        except Exception:
            return str(a.metadata.encode_chunk_key(corner))
    return None


def read_observations(path: str | os.PathLike, like: Any = None, *, rename: Mapping[str, str] | None = None) -> Any:
    """The committed observations of the store at ``path`` as NumPy arrays (see :meth:`RunStore.read`)."""
    import zarr

    path = os.path.abspath(os.fspath(path))
    attrs = _read_attrs(path)
    n = int(attrs.get("records", 0))
    g: Any = zarr.open_group(path, mode="r")
    if like is None:
        return {
            k: _read_region(path, a, slice(0, n))
            for k, a in g.arrays()
            if a.metadata.dimension_names[0] == "time" and k not in ("time", "step")
        }
    names = [(rename or {}).get(n, n) for n in leaf_names(like)]
    leaves = []
    for name, x in zip(names, jax.tree_util.tree_leaves(like), strict=True):
        empty = np.zeros((0, *np.shape(x)[1:]), np.asarray(x).dtype)
        leaves.append(_read_region(path, g[name], slice(0, n)) if name in g else empty)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)


@dataclasses.dataclass
class RunData:
    """What :func:`open_run` returns.

    Attributes:
      observations: Dataset over ``time`` (with coordinate ``step``), the committed records only.
      snapshots: Dataset over ``snapshot_time`` and the grid axes (None when the run wrote none).
      attrs: the store's metadata (``config``, ``settings``, ``seeds``, ``library``, ``runtime``, counts).
      path: the store's folder.
      fields: Dataset of the fields written once (:meth:`RunStore.write_field`, e.g. ``final_state`` over the
        grid axes), None when there are none.
    """

    observations: Any
    snapshots: Any
    attrs: dict[str, Any]
    path: str
    fields: Any = None

    @property
    def config(self) -> dict[str, Any]:
        return self.attrs.get("config", {})


def write_final_state(
    store: RunStore,
    out: str | os.PathLike,
    state: Any,
    dims: Sequence[str],
    *,
    step: int,
    coords: Mapping[str, Any] | None = None,
    units: Mapping[str, str] | None = None,
) -> tuple[Any, bool] | None:
    """A simulation's final field into ``store`` as ``final_state`` (each process writes the shards it holds) and
    what its outputs then save: ``(state, True)`` in one process (the caller writes ``final_state.npy`` itself);
    under several processes ``(memmap, False)`` on process 0, which copies the store's field into
    ``out/final_state.npy`` shard by shard (:func:`export_npy`), and None on the others (they write no outputs)."""
    store.write_field("final_state", state, dims, coords=coords, units=units, attrs={"step": step})
    if jax.process_count() == 1:
        return state, True
    if jax.process_index() != 0:
        return None
    return export_npy(store.path, "final_state", os.path.join(os.fspath(out), "final_state.npy")), False


def export_npy(path: str | os.PathLike, name: str, out: str | os.PathLike) -> np.ndarray:
    """Copy the field ``name`` of the run store at ``path`` (see :meth:`RunStore.write_field`) into the ``.npy``
    file ``out``, one zarr chunk (one shard of the run) at a time, so that the host holds one shard, never the
    whole field; returns the file opened read-only as a memory map."""
    import zarr

    store = find_store(path)
    _read_attrs(store)
    g: Any = zarr.open_group(store, mode="r")
    if name not in g:
        raise StoreError(f"run store {store} holds no array {name!r}")
    a = g[name]
    out = os.path.abspath(os.fspath(out))
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out), suffix=".tmp")  # a fresh name: never a planted link
    os.close(fd)
    mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=a.dtype, shape=a.shape)
    ranges = [range(0, n, c) for n, c in zip(a.shape, a.chunks)]
    for corner in np.ndindex(*(len(r) for r in ranges)):
        region = tuple(slice(r[i], min(r[i] + c, n)) for r, i, c, n in zip(ranges, corner, a.chunks, a.shape))
        mm[region] = _read_region(store, a, region)
    mm.flush()
    del mm
    os.replace(tmp, out)  # a reader never sees a half-written file
    return np.load(out, mmap_mode="r")


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


def open_run(path: str | os.PathLike, *, group: str | None = None) -> RunData:
    """Open a run's store (a run folder or its ``run.zarr``): observations and snapshots as xarray Datasets cut
    to the committed records, plus the metadata. ``group`` opens a sub-store (e.g. ``"stage1"``). The
    observations are read here (a damaged chunk of them is a StoreError naming its file); snapshots and fields
    stay lazy, read when used."""
    import xarray as xr

    store = find_store(path)
    if group is not None:
        store = os.path.join(store, group)
    attrs = _read_attrs(store)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ds = xr.open_zarr(store, consolidated=None)
    except Exception as e:  # zarr/xarray report a damaged array in many ways
        raise StoreError(
            f"run store {store} is damaged and cannot be opened ({type(e).__name__}: {e}); remove it "
            "or rerun with --no-resume"
        ) from None
    obs_vars = [k for k, v in ds.data_vars.items() if v.dims[:1] == ("time",)]
    snap_vars = [k for k, v in ds.data_vars.items() if v.dims[:1] == ("snapshot_time",)]
    obs = ds[obs_vars].isel(time=slice(0, int(attrs.get("records", 0)))) if "time" in ds.dims else ds[obs_vars]
    try:
        obs = obs.load()  # small: read now, so that a damaged chunk is named here rather than deep in dask
    except Exception:
        import zarr

        g: Any = zarr.open_group(store, mode="r")
        for k in obs_vars:
            _read_region(store, g[k], slice(0, int(attrs.get("records", 0))))  # raises naming the chunk's file
        raise
    field_vars = [k for k, v in ds.data_vars.items() if k not in obs_vars and k not in snap_vars]
    snaps = None
    if snap_vars:
        snaps = ds[snap_vars].isel(snapshot_time=slice(0, int(attrs.get("snapshots", 0))))
    fields = ds[field_vars] if field_vars else None
    for d in (obs, snaps, fields):
        if d is not None:
            d.attrs = {}
    return RunData(observations=obs, snapshots=snaps, attrs=attrs, path=store, fields=fields)


def write_xdmf(path: str | os.PathLike, *, out: str | os.PathLike | None = None) -> str:
    """Write an XDMF description of a run's 3-D snapshots for ParaView and return its path.

    XDMF reads raw binary, not compressed zarr chunks: each snapshot field is written next to it
    (``<out>/<field>_<i>.bin``, little-endian, C order; complex fields as ``re``/``im`` pairs of |ψ|² and arg ψ),
    and the ``.xmf`` file describes them as a temporal collection of a 3-D rectilinear grid. This reads the whole
    field on one process: it is an export after the run, not part of it."""
    run = open_run(path)
    if run.snapshots is None or not run.snapshots.data_vars:
        raise StoreError(f"{run.path} holds no snapshots; run with --set snapshot_every=K")
    snaps = run.snapshots
    first = next(iter(snaps.data_vars.values()))
    dims = first.dims[1:]
    if len(dims) != 3:
        raise StoreError(f"XDMF export needs 3-D snapshots, {run.path} holds {len(dims)}-D ones")
    out_dir = (
        os.path.abspath(os.fspath(out))
        if out is not None
        else os.path.join(os.path.dirname(run.path), "snapshots_xdmf")
    )
    os.makedirs(out_dir, exist_ok=True)
    shape = [snaps.sizes[d] for d in dims]
    axes = []
    for d in dims:
        c = np.asarray(snaps[d].values if d in snaps.coords else np.arange(snaps.sizes[d]), np.float64)
        fn = os.path.join(out_dir, f"coord_{d}.bin")
        c.astype("<f8").tofile(fn)
        axes.append((d, fn, c.size))
    steps = []
    for i in range(snaps.sizes["snapshot_time"]):
        attrs_xml = []
        for name, var in snaps.data_vars.items():
            a = np.asarray(var.isel(snapshot_time=i).values)
            parts = {f"{name}_abs2": np.abs(a) ** 2, f"{name}_arg": np.angle(a)} if np.iscomplexobj(a) else {name: a}
            for pname, pa in parts.items():
                fn = os.path.join(out_dir, f"{pname}_{i:05d}.bin")
                # XDMF's rectilinear grid runs its first coordinate fastest: write the array transposed (z, y, x)
                np.ascontiguousarray(pa.astype("<f4").transpose(2, 1, 0)).tofile(fn)
                attrs_xml.append(
                    f'        <Attribute Name="{pname}" AttributeType="Scalar" Center="Node">\n'
                    f'          <DataItem Dimensions="{shape[2]} {shape[1]} {shape[0]}" NumberType="Float" '
                    f'Precision="4" Endian="Little" Format="Binary">{os.path.basename(fn)}</DataItem>\n'
                    f"        </Attribute>"
                )
        geo = "\n".join(
            f'          <DataItem Dimensions="{n}" NumberType="Float" Precision="8" Endian="Little" '
            f'Format="Binary">{os.path.basename(fn)}</DataItem>'
            for _, fn, n in axes
        )
        t = float(snaps["snapshot_time"].values[i])
        steps.append(
            f'      <Grid Name="snapshot{i}" GridType="Uniform">\n        <Time Value="{t!r}"/>\n'
            f'        <Topology TopologyType="3DRectMesh" Dimensions="{shape[2]} {shape[1]} {shape[0]}"/>\n'
            f'        <Geometry GeometryType="VXVYVZ">\n{geo}\n        </Geometry>\n'
            + "\n".join(attrs_xml)
            + "\n      </Grid>"
        )
    xmf = os.path.join(out_dir, "snapshots.xmf")
    from ivhl_jax.run.io import atomic_file

    with atomic_file(xmf, "w") as f:
        f.write(
            '<?xml version="1.0" ?>\n<Xdmf Version="3.0">\n  <Domain>\n'
            '    <Grid Name="snapshots" GridType="Collection" CollectionType="Temporal">\n'
            + "\n".join(steps)
            + "\n    </Grid>\n  </Domain>\n</Xdmf>\n"
        )
    return xmf
