"""Writing a run store: :class:`RunStore` (what :func:`ivhl_jax.run.runner.run_chunked` streams into it, chunk by
chunk, on a background thread), :class:`Snapshots` (which fields of the state it writes, how often) and
:func:`write_final_state` (a simulation's final field, shard by shard). The layout and its conventions are
described in :mod:`ivhl_jax.run.store`."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import math
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.run.config import config_defaults, differing_keys
from ivhl_jax.run.lock import check_not_link, lock_run_dir, release_run_dir
from ivhl_jax.run.store_export import export_npy
from ivhl_jax.run.store_format import (
    CHUNK_TIME,
    CONVENTIONS,
    FORMAT,
    StoreError,
    barrier,
    check_unit,
    consolidate,
    fill_value,
    jsonable,
    leaf_names,
    library_info,
    read_attrs,
    record_rates,
    runtime_info,
    settings_info,
)
from ivhl_jax.run.store_reader import read_observations

__all__ = ["RunStore", "Snapshots", "write_final_state"]


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
        self.path = os.path.abspath(os.fspath(path))
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise StoreError(f"run store {self.path} is a file; pass a folder path")
        self.dt: float | None = None
        self.time_unit = "1"
        self.units: dict[str, str] = {}
        self.long_names: dict[str, str] = {}  # variable -> its CF long_name (what it is, in which natural unit)
        self.rename: dict[str, str] = {}
        self.dims: dict[str, tuple[str, ...]] = {}  # observation -> names of its axes after ``time``
        self.coords: dict[str, np.ndarray] = {}  # dimension -> coordinate values
        self.snapshots: Snapshots | None = None
        self._plan: dict[str, Any] | None = None
        self._parent: RunStore | None = None  # the store this one is a group of (:meth:`child`)
        self.describe(dt=dt, time_unit=time_unit, units=units, snapshots=snapshots)
        self.extendable = tuple(extendable)
        self._attrs, self._defaults = self._root_attrs(config, seeds, settings, attrs, defaults)
        self._writer = jax.process_index() == 0  # writes metadata and the (replicated) observations
        self._group: Any = self._open(resume, lock)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ivhl-store")
        self._pending: concurrent.futures.Future | None = None
        self._extract: Callable[[Any], Any] | None = None
        self.snapshot_hlo: str | None = None  # the compiled snapshot program (set by begin)
        self._done = [0, 0]  # records and snapshots written by this process (committed by flush across processes)

    @staticmethod
    def _root_attrs(
        config: Any,
        seeds: Mapping[str, Any] | None,
        settings: Mapping[str, Any] | None,
        attrs: Mapping[str, Any] | None,
        defaults: Mapping[str, Any] | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The root group's attributes (the format marker, the CF and ACDD attributes, the configuration and the
        run's provenance) and the configuration's defaults, JSON-ready."""
        is_config = dataclasses.is_dataclass(config) and not isinstance(config, type)
        if defaults is None and is_config:
            defaults = config_defaults(config)
        cfg = jsonable(dataclasses.asdict(config) if is_config else (config or {}))
        if seeds is None:
            seeds = {k: v for k, v in cfg.items() if "seed" in k} if isinstance(cfg, dict) else {}
        library = library_info()
        root = {
            "ivhl_format": FORMAT,
            "Conventions": CONVENTIONS,
            "title": "ivhl_jax run store",
            "summary": "The records of one ivhl_jax run: observations over time, snapshots and final fields.",
            "source": f"ivhl_jax {library['version']}",
            "config": cfg,
            "settings": {**settings_info(), **jsonable(settings or {})},
            "seeds": jsonable(dict(seeds)),
            "library": library,
            "runtime": runtime_info(),
            **jsonable(dict(attrs or {})),
        }
        return root, jsonable(dict(defaults or {}))

    def _open(self, resume: bool, lock: bool) -> Any:
        """Lock the store's folder (with ``lock``), keep the existing store of this configuration (``resume``) or
        create a fresh one, and open its root group; a refused store releases the lock."""
        check_not_link(self.path, "run store")  # a link would send this run's records into another run's store
        self._locked: str | None = None
        if lock:
            lock_run_dir(os.path.dirname(self.path))  # two runs cannot write the same store
            self._locked = os.path.dirname(self.path)
        try:
            if self._writer:
                if os.path.isdir(self.path) and resume:
                    self._check_existing(self._attrs["config"])
                elif os.path.exists(self.path):
                    shutil.rmtree(self.path)
                if not os.path.isdir(self.path):
                    self._create()
            barrier(f"ivhl-store-open:{self.path}")
            import zarr

            return zarr.open_group(self.path, mode="r+")
        except BaseException:
            if self._locked is not None:  # a store refused here holds nothing
                release_run_dir(self._locked)
            raise

    # --- opening -------------------------------------------------------------------------------------------
    def _create(self) -> None:
        import zarr

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        attrs = {**self._attrs, "date_created": created, "records": 0, "snapshots": 0}
        zarr.open_group(self.path, mode="w", attributes=attrs)

    def _check_existing(self, cfg: Any) -> None:
        attrs = read_attrs(self.path)
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
        leaves = jax.tree_util.tree_leaves(observation_like)
        names = [self.rename.get(n, n) for n in leaf_names(observation_like)] if leaves else []
        per_chunk = record_rates(names, leaves)
        every = self.snapshots.every if self.snapshots is not None else 0
        if every and every % steps_per_chunk:
            raise ValueError(
                f"snapshot_every ({every}) must be a multiple of steps_per_chunk ({steps_per_chunk}): "
                "snapshots are taken at chunk ends"
            )
        n_records = n_chunks * per_chunk
        n_snap = (n_chunks * steps_per_chunk) // every if every else 0
        snap_like = self._compile_snapshots(state_like)
        want_r, want_s = done_chunks * per_chunk, (done_chunks * steps_per_chunk) // every if every else 0
        self._check_committed(want_r, want_s, n_records, n_snap, n_chunks)
        if self._writer:
            g = self._group
            record_steps = (np.arange(n_records) + 1) * (steps_per_chunk // per_chunk) if per_chunk else np.zeros(0)
            self._allocate_records(g, record_steps, names, leaves, per_chunk)
            if any(int(leaf.shape[0]) < per_chunk for leaf in leaves):  # one record per chunk beside them
                chunk_steps = (np.arange(n_chunks) + 1) * steps_per_chunk
                self._coord(g, CHUNK_TIME, CHUNK_TIME, self._times(chunk_steps), self.time_unit)
                self._coord(g, "chunk_step", CHUNK_TIME, chunk_steps.astype(np.int64), "1")
            if self.snapshots is not None:
                self._allocate_snapshots(g, (np.arange(n_snap) + 1) * every, snap_like)
            counts = {"records": want_r, "snapshots": want_s, "records_per_chunk": per_chunk}
            g.attrs.update({**self._attrs, **counts})  # a resume may extend the steps
            self._group = self._consolidate()
        barrier(f"ivhl-store-begin:{self.path}")
        if not self._writer:
            import zarr

            self._group = zarr.open_group(self.path, mode="r+")
        self._plan = {"names": names, "per_chunk": per_chunk, "spc": steps_per_chunk, "every": every}
        self._plan["fields"] = list(snap_like)
        self._done = [want_r, want_s]

    def _compile_snapshots(self, state_like: Any) -> dict[str, Any]:
        """Compile the snapshot program for states like ``state_like`` and return ``{field: ShapeDtypeStruct}`` with
        the output shardings (the chunk shape: one chunk per shard); ``{}`` without snapshots."""
        if self.snapshots is None:
            return {}
        if state_like is None:
            raise ValueError("a store with snapshots needs state_like (the state's shapes)")
        fields = self.snapshots.fields
        self._extract = jax.jit(lambda s: {k: jnp.copy(v) for k, v in fields(s).items()})
        # compiled once here: its output shardings give the chunk shape (one chunk per shard), and
        # snapshot_hlo lets a caller check that no collective gathers the field
        compiled = self._extract.lower(state_like).compile()
        self.snapshot_hlo = compiled.as_text()
        return {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=compiled.output_shardings[k])
            for k, v in jax.eval_shape(self._extract, state_like).items()
        }

    def _check_committed(self, want_r: int, want_s: int, n_records: int, n_snap: int, n_chunks: int) -> None:
        """Refuse a store that holds fewer records or snapshots than the checkpoint counts, and set the longest the
        arrays may be: an existing array is never grown or cut (nor read) to a length beyond what the
        configuration implies, the store's own configuration's steps scaling the records and snapshots."""
        committed = read_attrs(self.path)
        held_r, held_s = int(committed.get("records", 0)), int(committed.get("snapshots", 0))
        if held_r < want_r or held_s < want_s:
            raise StoreError(
                f"run store {self.path} holds {held_r} records and {held_s} snapshots but the checkpoint "
                f"expects {want_r} and {want_s}; the store lost data after the checkpoint: rerun with "
                "--no-resume"
            )
        old_steps, new_steps = (c.get("steps") for c in (committed.get("config") or {}, self._attrs["config"] or {}))
        counts = [v for v in (old_steps, new_steps) if isinstance(v, int) and not isinstance(v, bool) and v > 0]
        scale = max(1.0, counts[0] / counts[1]) if len(counts) == 2 else 1.0
        self._limits = {"time": math.ceil(n_records * scale), "snapshot_time": math.ceil(n_snap * scale)}
        self._limits[CHUNK_TIME] = math.ceil(n_chunks * scale)

    def _allocate_records(
        self, g: Any, record_steps: np.ndarray, names: list[str], leaves: list[Any], per_chunk: int
    ) -> None:
        """The ``time`` and ``step`` coordinates, the coordinates described for the observations' other axes and
        one array per observation over ``("time", *its axes)`` (``("chunk_time", *its axes)`` for an observation
        recorded once per chunk beside others recorded more often: :func:`record_rates`)."""
        self._coord(g, "time", "time", self._times(record_steps), self.time_unit)
        self._coord(g, "step", "time", record_steps.astype(np.int64), "1")
        for dim, values in self.coords.items():
            if dim not in g:
                self._coord(g, dim, dim, values, self.units.get(dim, ""))
        for name, leaf in zip(names, leaves, strict=True):
            rate = int(leaf.shape[0])
            shape = (len(record_steps) // per_chunk * rate, *leaf.shape[1:])
            named = self.dims.get(name, tuple(f"{name}_dim{i}" for i in range(1, len(shape))))
            if len(named) != len(shape) - 1:
                raise ValueError(f"observation {name!r} has {len(shape) - 1} axes after time, dims name {named}")
            dims, coord = (("time", *named), "step") if rate == per_chunk else ((CHUNK_TIME, *named), "chunk_step")
            unit = self.units.get(name, "")
            self._array(g, name, shape, (rate, *leaf.shape[1:]), np.dtype(leaf.dtype), dims, unit, coord)

    def _allocate_snapshots(self, g: Any, snap_steps: np.ndarray, snap_like: dict[str, Any]) -> None:
        """The ``snapshot_time`` and ``snapshot_step`` coordinates, the grid's coordinates and one array per field
        over ``("snapshot_time", *grid axes)``, chunked one snapshot and one shard at a time."""
        snaps = self.snapshots
        assert snaps is not None
        self._coord(g, "snapshot_time", "snapshot_time", self._times(snap_steps), self.time_unit)
        self._coord(g, "snapshot_step", "snapshot_time", snap_steps.astype(np.int64), "1")
        for dim in snaps.dims:
            if dim in snaps.coords:
                self._coord(g, dim, dim, np.asarray(snaps.coords[dim]), snaps.units.get(dim, ""))
        for name, like in snap_like.items():
            if len(like.shape) != len(snaps.dims):
                raise ValueError(
                    f"snapshot field {name!r} has shape {like.shape} but dims {snaps.dims} name {len(snaps.dims)} axes"
                )
            shape, chunks = (len(snap_steps), *like.shape), (1, *like.sharding.shard_shape(like.shape))
            dims = ("snapshot_time", *snaps.dims)
            self._array(g, name, shape, chunks, np.dtype(like.dtype), dims, snaps.units.get(name, ""), "snapshot_step")

    def _long_name(self, name: str) -> dict[str, str]:
        """``{"long_name": …}`` of the variable ``name`` (described, or the default of a time coordinate), else {}."""
        counted = "steps done" if self.dt is None else "time"
        defaults = {n: counted for n in ("time", "snapshot_time", CHUNK_TIME)}
        defaults |= {n: "steps done" for n in ("step", "snapshot_step", "chunk_step")}
        text = self.long_names.get(name) or defaults.get(name)
        if name in ("snapshot_time", CHUNK_TIME) and "time" in self.long_names:
            text = self.long_names["time"]
        return {"long_name": text} if text else {}

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
            fill_value=fill_value(dtype),
            dimension_names=dims,
            attributes={
                "units": unit,
                **self._long_name(name),
                **({"coordinates": coordinates} if coordinates else {}),
            },
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
            rate = int(np.shape(leaf)[0])  # per chunk: records at the store's rate, or one
            first = start // per * rate
            g[name][first : first + rate] = np.asarray(leaf)
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
            barrier(f"ivhl-store-flush:{self.path}")
            if self._writer:
                self._commit()
            barrier(f"ivhl-store-commit:{self.path}")

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
        long_names: Mapping[str, str] | None = None,
    ) -> RunStore:
        """Set what a simulation knows of its records before the run starts (:meth:`begin`): the time per step,
        its unit, the observations' units, the snapshots, new names for observations (``{"value": "energy"}``
        for a bare scalar), the names of an observation's axes after ``time`` (``{"lengths": ("chain",
        "slice")}``; observations that share an axis share its name; default ``<name>_dim<i>``), the 1-D
        coordinate values of such axes (``{"chain": np.arange(8)}``, units from ``units``) and the CF
        ``long_name`` of any variable (what it is and, for a quantity in natural units, which: ``{"time": "time in
        trap units 1/omega"}``). Units are UDUNITS strings (:func:`ivhl_jax.run.store_format.is_udunits`); another
        string is a ValueError naming the variable. Returns the store."""
        if self._plan is not None:
            raise RuntimeError("describe the store before the run starts")
        if dt is not None:
            if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not (math.isfinite(dt) and dt > 0):
                raise ValueError(f"dt must be a finite number > 0 (time per step) or None, got {dt!r}")
            self.dt = float(dt)
            self.time_unit = "" if time_unit is None else time_unit  # unknown until the caller names it
        if time_unit is not None:
            self.time_unit = check_unit("time", time_unit)
        if units is not None:
            self.units.update({k: check_unit(k, u) for k, u in units.items()})
        if long_names is not None:
            self.long_names.update({str(k): str(v) for k, v in long_names.items()})
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
                raise TypeError(f"snapshots must be an ivhl_jax.run.store.Snapshots or None, got {snapshots!r}")
            for k, u in snapshots.units.items():
                check_unit(k, u)
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
                    self._coord(g, d, d, c, check_unit(d, units[d]) if units.get(d) else "")
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
                    name,
                    shape=shape,
                    chunks=chunks or (1,),
                    dtype=dtype,
                    fill_value=fill_value(dtype),
                    dimension_names=dims,
                )
            unit = check_unit(name, units[name]) if units.get(name) else ""
            g[name].attrs.update({"units": unit, **self._long_name(name), **jsonable(dict(attrs or {}))})
            self._group = self._consolidate()
        barrier(f"ivhl-store-field-create:{self.path}:{name}")
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
        barrier(f"ivhl-store-field-written:{self.path}:{name}")

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
        sub.long_names.update(self.long_names)
        self.announce([name])
        sub._parent = self
        return sub

    def _consolidate(self) -> Any:
        """Consolidate this store's metadata and that of the stores above it (a parent's consolidated metadata
        lists its groups' arrays, so xarray's ``open_datatree`` reads the whole tree from it); the reopened group."""
        if self._parent is not None:
            self._parent._consolidate()
        return consolidate(self.path)

    def announce(self, groups: Sequence[str]) -> None:
        """Add ``groups`` (sub-store names, in order) to the root attribute ``groups``, which :func:`open_run` opens
        (``RunData.groups``): a run of several stages announces them all when it starts."""
        if self._writer:
            held = list(self._group.attrs.get("groups", []))
            self._group.attrs.update({"groups": [*held, *(g for g in groups if g not in held)]})

    # --- reading -------------------------------------------------------------------------------------------
    def read(self, like: Any = None) -> Any:
        """The committed observations as NumPy arrays: the pytree of ``like`` (an observation of the run),
        or ``{name: array}`` without it."""
        self.flush()
        return read_observations(self.path, like, rename=self.rename)


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
