"""Exports of a run store for tools that do not read Zarr: a field as a ``.npy`` file (:func:`export_npy`, shard by
shard) and the 3-D snapshots as XDMF for ParaView (:func:`write_xdmf`)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from ivhl_jax.run.store_format import StoreError, find_store, read_attrs, read_region
from ivhl_jax.run.store_reader import open_run

__all__ = ["export_npy", "write_xdmf"]


def export_npy(path: str | os.PathLike, name: str, out: str | os.PathLike) -> np.ndarray:
    """Copy the field ``name`` of the run store at ``path`` (see :meth:`RunStore.write_field`) into the ``.npy``
    file ``out``, one zarr chunk (one shard of the run) at a time, so that the host holds one shard, never the
    whole field; returns the file opened read-only as a memory map."""
    import zarr

    store = find_store(path)
    read_attrs(store)
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
        mm[region] = read_region(store, a, region)
    mm.flush()
    del mm
    os.replace(tmp, out)  # a reader never sees a half-written file
    return np.load(out, mmap_mode="r")


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
