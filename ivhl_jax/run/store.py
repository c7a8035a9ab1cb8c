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

Units are UDUNITS strings (``"1"`` for a dimensionless quantity or a count, ``"m^2"``, ``"s"``; a quantity in
natural units is a number, ``"1"``, whose ``long_name`` names the unit it counts in); the ``step`` coordinates count
steps (``"1"``), as does ``time`` without a ``dt``. A run of several stages writes each into a sub-store (a zarr
group, :meth:`RunStore.child`) that the root announces in its attribute ``groups``; :func:`open_run` opens them
(``RunData.groups``) and ``xarray.open_datatree(path, engine="zarr")`` reads the whole tree.

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

The code lives in :mod:`ivhl_jax.run.store_format` (the layout and conventions), :mod:`ivhl_jax.run.store_writer`,
:mod:`ivhl_jax.run.store_reader` and :mod:`ivhl_jax.run.store_export`; this module is their one public door.
"""

from __future__ import annotations

from ivhl_jax.run.store_export import export_npy, write_xdmf
from ivhl_jax.run.store_format import (
    STORE_NAME,
    StoreError,
    find_store,
    is_udunits,
    leaf_names,
    library_info,
    natural_units,
)
from ivhl_jax.run.store_reader import RunData, open_run, read_observations
from ivhl_jax.run.store_writer import RunStore, Snapshots, write_final_state

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
    "find_store",
    "read_observations",
    "is_udunits",
    "natural_units",
]
