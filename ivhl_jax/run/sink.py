"""Observations streamed to disk: :class:`ObservationSink` appends each chunk's records to a folder.

:func:`ivhl_jax.run.runner.run_chunked` already receives every chunk's observations on the host; with
``sink=ObservationSink(folder)`` it appends them there and keeps none in memory (nor in its checkpoints), so
host and device memory stay bounded whatever the number of saves.

Format: one NumPy ``.npz`` file per chunk, ``chunk-<first record>-<records>.npz``, holding the chunk's leaves as
``leaf0, leaf1, ...`` in ``jax.tree_util`` order. Each file is written to a temporary name and renamed into
place, so a killed run leaves only whole chunks. Plain ``.npz`` needs no library beyond NumPy, every tool reads
it, and one file per chunk makes the append atomic without a journal; a store with random access into one
array (Zarr, HDF5) would add a dependency the library does not otherwise need.

Resuming: a run restored from the checkpoint at step ``S`` first drops the chunks recorded after ``S`` (a run
killed after writing a chunk and before checkpointing it) and then writes them again, with the same bits, so
the folder never holds a record twice nor misses one. :meth:`ObservationSink.read` returns the records in order.
"""

from __future__ import annotations

import os
import re
from typing import Any

import jax
import numpy as np

from ivhl_jax.run.io import atomic_file

__all__ = ["ObservationSink"]

_CHUNK = re.compile(r"^chunk-(\d{12})-(\d+)\.npz$")


class ObservationSink:
    """Append chunks of observations (pytrees with a leading record axis) to ``.npz`` files in ``directory``.

    Args:
      directory: the folder (created if missing; a path that is a file is a ValueError).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise TypeError(f"directory must be a folder path, got {directory!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise ValueError(f"observation folder {self.directory} is a file; pass a folder path")
        os.makedirs(self.directory, exist_ok=True)

    def _chunks(self) -> list[tuple[int, int, str]]:
        """``(first record, records, path)`` of every complete chunk file, in record order."""
        out = []
        for name in os.listdir(self.directory):
            m = _CHUNK.match(name)
            if m:
                out.append((int(m.group(1)), int(m.group(2)), os.path.join(self.directory, name)))
        return sorted(out)

    def records(self) -> int:
        """How many records the folder holds, counted from 0 without a gap (a gap is a ValueError)."""
        n = 0
        for start, count, path in self._chunks():
            if start != n:
                raise ValueError(f"{path} starts at record {start} but the chunks before it end at {n}; the "
                                 "observation folder was edited: remove it and rerun with --no-resume")
            n += count
        return n

    def truncate(self, n_records: int) -> None:
        """Keep records ``[0, n_records)`` (whole chunks): the chunks that start at or after it are removed."""
        if isinstance(n_records, bool) or not isinstance(n_records, int) or n_records < 0:
            raise ValueError(f"n_records must be an integer >= 0, got {n_records!r}")
        held = self.records()
        if held < n_records:
            raise ValueError(f"{self.directory} holds {held} records but the checkpoint expects {n_records}; the "
                             "observations were removed after the checkpoint: rerun with --no-resume")
        for start, count, path in self._chunks():
            if start >= n_records:
                os.remove(path)
            elif start + count > n_records:
                raise ValueError(f"{path} ends past record {n_records}, where the run resumes; the chunks do not "
                                 "match the run's checkpoints: rerun with --no-resume")

    def append(self, start: int, observations: Any) -> str:
        """Write one chunk whose first record is ``start``; returns its path. The leaves must share their
        leading (record) axis."""
        leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(observations))]
        if not leaves:
            raise ValueError("observations must hold at least one array")
        counts = {a.shape[0] if a.ndim else None for a in leaves}
        if len(counts) != 1 or None in counts:
            raise ValueError(f"every observation leaf needs the same leading record axis, got shapes "
                             f"{[a.shape for a in leaves]}")
        count = counts.pop()
        path = os.path.join(self.directory, f"chunk-{int(start):012d}-{count}.npz")
        arrays: dict[str, Any] = {f"leaf{i}": a for i, a in enumerate(leaves)}
        with atomic_file(path, "wb") as f:
            np.savez(f, **arrays)
        return path

    def read(self, like: Any = None) -> Any:
        """Every record, in order: the leaves concatenated along the record axis, as the pytree of ``like``
        (an observation of the run, e.g. ``RunResult.history``), or as a list of leaves without it."""
        self.records()  # refuse a gap
        parts: list[list[np.ndarray]] = []
        for _, _, path in self._chunks():
            with np.load(path) as z:
                parts.append([z[f"leaf{i}"] for i in range(len(z.files))])
        if not parts:
            leaves: list[np.ndarray] = []
            if like is not None:
                leaves = [np.zeros((0, *np.shape(x)[1:]), np.asarray(x).dtype) for x in jax.tree_util.tree_leaves(like)]
        else:
            leaves = [np.concatenate(cols, axis=0) for cols in zip(*parts, strict=True)]
        if like is None:
            return leaves
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)
