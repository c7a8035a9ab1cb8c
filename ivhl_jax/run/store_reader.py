"""Reading a run store: :func:`open_run` (observations, snapshots, fields and the stage groups as xarray Datasets,
plus the metadata) and :func:`read_observations` (the records as NumPy arrays, in an observation's pytree)."""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ivhl_jax.run.store_format import (
    CHUNK_TIME,
    StoreError,
    find_store,
    leaf_names,
    read_attrs,
    read_region,
    record_counts,
)

__all__ = ["open_run", "RunData", "read_observations", "announced_groups"]


def read_observations(path: str | os.PathLike, like: Any = None, *, rename: Mapping[str, str] | None = None) -> Any:
    """The committed observations of the store at ``path`` as NumPy arrays (see :meth:`RunStore.read`)."""
    import zarr

    path = os.path.abspath(os.fspath(path))
    counts = record_counts(read_attrs(path))
    g: Any = zarr.open_group(path, mode="r")

    def read(a: Any) -> np.ndarray:
        return read_region(path, a, slice(0, counts[a.metadata.dimension_names[0]]))

    if like is None:
        coords = ("time", "step", CHUNK_TIME, "chunk_step")
        return {k: read(a) for k, a in g.arrays() if a.metadata.dimension_names[0] in counts and k not in coords}
    names = [(rename or {}).get(n, n) for n in leaf_names(like)]
    leaves = []
    for name, x in zip(names, jax.tree_util.tree_leaves(like), strict=True):
        empty = np.zeros((0, *np.shape(x)[1:]), np.asarray(x).dtype)
        leaves.append(read(g[name]) if name in g else empty)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)


@dataclasses.dataclass
class RunData:
    """What :func:`open_run` returns.

    Attributes:
      observations: Dataset over ``time`` (with coordinate ``step``), the committed records only; observations
        recorded once per chunk beside more frequent ones are over ``chunk_time`` (coordinate ``chunk_step``).
      snapshots: Dataset over ``snapshot_time`` and the grid axes (None when the run wrote none).
      attrs: the store's metadata (``config``, ``settings``, ``seeds``, ``library``, ``runtime``, counts).
      path: the store's folder.
      fields: Dataset of the fields written once (:meth:`RunStore.write_field`, e.g. ``final_state`` over the
        grid axes), None when there are none.
      groups: the sub-stores the root announces in its attribute ``groups`` (a run of several stages:
        ``{"stage1": RunData, "stage2": RunData, …}``, numbered as the run's log numbers them), each opened like
        the root; a stage not started yet is absent. ``xarray.open_datatree(path, engine="zarr")`` reads the same
        tree.
    """

    observations: Any
    snapshots: Any
    attrs: dict[str, Any]
    path: str
    fields: Any = None
    groups: dict[str, RunData] = dataclasses.field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        return self.attrs.get("config", {})


def open_run(path: str | os.PathLike, *, group: str | None = None) -> RunData:
    """Open a run's store (a run folder or its ``run.zarr``): observations and snapshots as xarray Datasets cut
    to the committed records, plus the metadata, and the sub-stores the root announces (``RunData.groups``: the
    stages of a MERA run). ``group`` opens one sub-store alone (e.g. ``"stage1"``). The observations are read here
    (a damaged chunk of them is a StoreError naming its file); snapshots and fields stay lazy, read when used."""
    store = find_store(path)
    if group is not None:
        if not os.path.isfile(os.path.join(store, group, "zarr.json")):
            raise StoreError(
                f"run store {store} holds no group {group!r}; its groups: {announced_groups(store) or 'none'}"
            )
        store = os.path.join(store, group)
    return _open_store(store)


def announced_groups(store: str) -> list[str]:
    """The sub-stores the run store at ``store`` announces in its root attribute ``groups`` that exist (in order)."""
    names = read_attrs(store).get("groups") or []
    return [g for g in names if isinstance(g, str) and os.path.isfile(os.path.join(store, g, "zarr.json"))]


def _open_store(store: str) -> RunData:
    """:func:`open_run` of the store at the folder ``store`` and of the groups it announces."""
    import xarray as xr

    attrs = read_attrs(store)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ds = xr.open_zarr(store, consolidated=None)
    except Exception as e:  # zarr/xarray report a damaged array in many ways
        raise StoreError(
            f"run store {store} is damaged and cannot be opened ({type(e).__name__}: {e}); remove it "
            "or rerun with --no-resume"
        ) from None
    counts = record_counts(attrs)
    obs_vars = [k for k, v in ds.data_vars.items() if v.dims[:1] and v.dims[0] in counts]
    snap_vars = [k for k, v in ds.data_vars.items() if v.dims[:1] == ("snapshot_time",)]
    obs = ds[obs_vars].isel({d: slice(0, n) for d, n in counts.items()}, missing_dims="ignore")
    try:
        obs = obs.load()  # small: read now, so that a damaged chunk is named here rather than deep in dask
    except Exception:
        import zarr

        g: Any = zarr.open_group(store, mode="r")
        for k in obs_vars:
            read_region(store, g[k], slice(0, counts[ds[k].dims[0]]))  # raises naming the chunk's file
        raise
    field_vars = [k for k, v in ds.data_vars.items() if k not in obs_vars and k not in snap_vars]
    snaps = None
    if snap_vars:
        snaps = ds[snap_vars].isel(snapshot_time=slice(0, int(attrs.get("snapshots", 0))))
    fields = ds[field_vars] if field_vars else None
    for d in (obs, snaps, fields):
        if d is not None:
            d.attrs = {}
    groups = {g: _open_store(os.path.join(store, g)) for g in announced_groups(store)}
    return RunData(observations=obs, snapshots=snaps, attrs=attrs, path=store, fields=fields, groups=groups)
