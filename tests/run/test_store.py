"""The run store (ivhl_jax.run.store.RunStore through run_chunked): xarray opens it with names, units and
coordinates; it equals the in-memory trajectory; host and device memory stay flat over 10^4 saves; a sharded field
is written shard by shard (one zarr chunk per shard, no gather in the snapshot program); SIGKILL then resume gives
the store of an uninterrupted run; a foreign, damaged or locked store is refused in one line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

from ivhl_jax.numerics.rollout import Stepper, chunked
from ivhl_jax.run import open_run
from ivhl_jax.run.runner import run_chunked
from ivhl_jax.run.store import RunStore, Snapshots, StoreError


def _noisy(state, params):
    key, sub = jax.random.split(state["key"])
    return {"key": key, "x": params * state["x"] + jax.random.normal(sub, state["x"].shape)}


def _observe(state, params):
    return {"x": state["x"], "norm": jnp.sum(state["x"] ** 2)}


def _start():
    return {"key": jax.random.key(0), "x": jnp.zeros(256, jnp.float32)}


def test_ten_thousand_saves_equal_in_memory_and_keep_memory_flat(tmp_path):
    advance = chunked(Stepper.create(_noisy, jnp.float32(0.9)), 100, save_every=1, observe=_observe)
    in_memory = run_chunked(advance, _start(), n_chunks=100, steps_per_chunk=100, progress=False)
    expected = {k: np.asarray(v) for k, v in in_memory.history.items()}
    assert expected["x"].shape == (10_000, 256)
    del in_memory  # keep its 10 MB history out of the live arrays counted below
    held = sum(a.nbytes for a in jax.live_arrays())
    store = RunStore(tmp_path / "run.zarr", config={"seed": 0}, dt=0.5, time_unit="s", units={"norm": "m^2"})
    tracemalloc.start()
    streamed = run_chunked(advance, _start(), n_chunks=100, steps_per_chunk=100, progress=False, sink=store)
    _, host_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    store.close()
    grown = sum(a.nbytes for a in jax.live_arrays()) - held
    assert streamed.history["x"].shape == (0, 256)  # nothing kept in memory ...
    assert grown < 1_000_000, grown  # ... on the device, while the records take 10 MB
    assert host_peak < 4_000_000, host_peak  # ... nor on the host (a chunk is 100 kB)
    ds = xr.open_zarr(tmp_path / "run.zarr")  # no code of ours: names, dims, units, coordinates
    assert ds["x"].dims == ("time", "x_dim1") and ds["norm"].attrs["units"] == "m^2"
    assert ds["time"].attrs["units"] == "s" and float(ds["time"][0]) == 0.5 and int(ds["step"][-1]) == 10_000
    np.testing.assert_array_equal(ds["x"].values, expected["x"])
    np.testing.assert_array_equal(ds["norm"].sel(time=slice(100.0, 200.0)).values, expected["norm"][199:400])
    run = open_run(tmp_path)
    assert run.attrs["records"] == 10_000 and run.attrs["seeds"] == {"seed": 0}
    assert run.attrs["library"]["version"] and run.attrs["runtime"]["platform"] == "cpu"
    np.testing.assert_array_equal(store.read()["norm"], expected["norm"])


def _field_step(state, params):
    return state * params + jnp.float32(1.0)


def test_a_sharded_field_is_written_shard_by_shard_with_no_gather(tmp_path):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    x0 = jax.device_put(jnp.zeros((16, 8, 6), jnp.float32), NamedSharding(mesh, P("a", "b")))
    advance = chunked(
        Stepper.create(_field_step, jnp.float32(0.5)), 10, save_every=5, observe=lambda s, p: {"mean": jnp.mean(s)}
    )
    snaps = Snapshots(
        every=20,
        fields=lambda s: {"f": s, "g": (s * s).astype(jnp.float16)},
        dims=("x", "y", "z"),
        coords={"x": np.linspace(-1, 1, 16)},
        units={"f": "m", "x": "cm"},
    )
    store = RunStore(tmp_path / "run.zarr", dt=0.1, snapshots=snaps)
    result = run_chunked(advance, x0, n_chunks=6, steps_per_chunk=10, progress=False, sink=store)
    store.close()
    assert "all-gather" not in store.snapshot_hlo and "all-to-all" not in store.snapshot_hlo
    chunks = sorted(os.listdir(tmp_path / "run.zarr" / "f" / "c" / "2"))
    assert len(chunks) == 4  # 4 × 2 × 1 chunks of (1, 4, 4, 6): one per shard
    run = open_run(tmp_path)
    assert run.snapshots["f"].dims == ("snapshot_time", "x", "y", "z") and run.snapshots["f"].attrs["units"] == "m"
    assert run.snapshots["x"].attrs["units"] == "cm" and run.snapshots["g"].dtype == np.float16
    np.testing.assert_array_equal(run.snapshots["f"].sel(snapshot_time=6.0).values, np.asarray(result.state))
    np.testing.assert_array_equal(run.snapshots["snapshot_step"].values, [20, 40, 60])
    from ivhl_jax.run.store import write_xdmf

    xmf = write_xdmf(tmp_path)
    text = open(xmf).read()
    assert text.count("<Time Value=") == 3 and "3DRectMesh" in text


def test_write_field_writes_one_chunk_per_shard_and_export_npy_copies_it_chunk_by_chunk(tmp_path):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from ivhl_jax.run.store import export_npy

    mesh = jax.make_mesh((4, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    host = (np.arange(16 * 8 * 6) * (1 + 0.5j)).astype(np.complex64).reshape(16, 8, 6)
    field = jax.device_put(host, NamedSharding(mesh, P("a", "b")))
    store = RunStore(tmp_path / "run.zarr", config={"n": 16})
    store.write_field(
        "final_state",
        field,
        ("x", "y", "z"),
        coords={"x": np.linspace(0, 1, 16)},
        units={"final_state": "1", "x": "m"},
        attrs={"step": 7},
    )
    assert len(os.listdir(tmp_path / "run.zarr" / "final_state" / "c" / "0" / "0")) == 1  # one chunk per shard
    assert sum(len(fs) for _, _, fs in os.walk(tmp_path / "run.zarr" / "final_state" / "c")) == 8
    with pytest.raises(ValueError, match="dims must name the 3 axes"):
        store.write_field("other", field, ("x", "y"))
    with pytest.raises(ValueError, match="name must be"):
        store.write_field("bad name", field, ("x", "y", "z"))
    store.close()
    final = open_run(tmp_path).fields["final_state"]
    assert final.dims == ("x", "y", "z") and final.attrs == {"units": "1", "step": 7}
    assert final["x"].attrs["units"] == "m" and xr.open_zarr(tmp_path / "run.zarr")["final_state"].shape == host.shape
    np.testing.assert_array_equal(final.values, host)
    out = export_npy(tmp_path, "final_state", tmp_path / "final_state.npy")
    assert isinstance(out, np.memmap) and not out.flags.writeable
    np.testing.assert_array_equal(np.load(tmp_path / "final_state.npy"), host)
    with pytest.raises(StoreError, match="holds no array 'psi'"):
        export_npy(tmp_path, "psi", tmp_path / "psi.npy")
    # written again (a resumed run's end) with another sharding and shape: replaced
    store = RunStore(tmp_path / "run.zarr", config={"n": 16}, resume=True, lock=False)
    store.write_field("final_state", jnp.ones((16, 8, 3), jnp.float32), ("x", "y", "z"))
    store.close()
    np.testing.assert_array_equal(open_run(tmp_path).fields["final_state"].values, np.ones((16, 8, 3)))


def _wave_step(state, params):
    return state * params


def test_xdmf_export_is_valid_xdmf3_whose_binaries_match_the_snapshots(tmp_path):
    """write_xdmf: an XDMF 3 temporal collection of 3-D rectilinear grids; every DataItem's Dimensions match its
    binary file's size, and the binaries read back (x fastest) give the snapshots' coordinates, |ψ|² and arg ψ
    and the real fields, at every time."""
    import xml.etree.ElementTree as ET

    from ivhl_jax.run.store import write_xdmf

    shape = (6, 5, 4)  # unequal axes: a transposed or misordered description would not match
    x = np.linspace(-1, 1, 6)
    psi0 = jnp.exp(1j * jnp.arange(120, dtype=jnp.float32).reshape(shape) / 7).astype(jnp.complex64)
    advance = chunked(
        Stepper.create(_wave_step, jnp.complex64(0.9 * np.exp(0.3j))),
        2,
        save_every=2,
        observe=lambda s, p: {"mean": jnp.mean(jnp.abs(s))},
    )
    snaps = Snapshots(every=2, fields=lambda s: {"psi": s, "re": jnp.real(s)}, dims=("x", "y", "z"), coords={"x": x})
    store = RunStore(tmp_path / "run.zarr", dt=0.25, snapshots=snaps)
    run_chunked(advance, psi0, n_chunks=3, steps_per_chunk=2, progress=False, sink=store)
    store.close()
    snap = open_run(tmp_path).snapshots
    xmf = write_xdmf(tmp_path)
    folder = os.path.dirname(xmf)
    root = ET.parse(xmf).getroot()
    assert root.tag == "Xdmf" and root.get("Version") == "3.0"
    (collection,) = root.find("Domain")
    assert collection.get("GridType") == "Collection" and collection.get("CollectionType") == "Temporal"
    grids = collection.findall("Grid")
    assert [float(g.find("Time").get("Value")) for g in grids] == [0.5, 1.0, 1.5]

    def read(item):
        dims = tuple(int(n) for n in item.get("Dimensions").split())
        dtype = {("Float", "4"): "<f4", ("Float", "8"): "<f8"}[item.get("NumberType"), item.get("Precision")]
        assert item.get("Format") == "Binary" and item.get("Endian") == "Little"
        fn = os.path.join(folder, item.text.strip())
        assert os.path.getsize(fn) == np.prod(dims) * np.dtype(dtype).itemsize, fn  # the file is the array
        return np.fromfile(fn, dtype).reshape(dims)

    for i, g in enumerate(grids):
        assert g.get("GridType") == "Uniform"
        topo = g.find("Topology")
        assert topo.get("TopologyType") == "3DRectMesh" and topo.get("Dimensions") == "4 5 6"  # z y x, x fastest
        geo = g.find("Geometry")
        assert geo.get("GeometryType") == "VXVYVZ"
        vx, vy, vz = (read(item) for item in geo.findall("DataItem"))
        np.testing.assert_array_equal(vx, x)
        np.testing.assert_array_equal(vy, np.arange(5))
        np.testing.assert_array_equal(vz, np.arange(4))
        attrs = {a.get("Name"): a for a in g.findall("Attribute")}
        assert sorted(attrs) == ["psi_abs2", "psi_arg", "re"]
        psi = snap["psi"].isel(snapshot_time=i).values
        expected = {
            "psi_abs2": np.abs(psi) ** 2,
            "psi_arg": np.angle(psi),
            "re": snap["re"].isel(snapshot_time=i).values,
        }
        for name, a in attrs.items():
            assert a.get("AttributeType") == "Scalar" and a.get("Center") == "Node"
            (item,) = a.findall("DataItem")
            got = read(item).transpose(2, 1, 0)  # (z, y, x) in the file -> (x, y, z)
            np.testing.assert_allclose(got, expected[name], rtol=1e-6, atol=1e-6, err_msg=name)
    assert not np.allclose(expected["psi_arg"], np.angle(np.asarray(psi0)))  # the last snapshot is not the start


_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import jax, jax.numpy as jnp, numpy as np
    sys.path.insert(0, {here!r})
    from test_store import _noisy, _observe, _start
    from ivhl_jax.numerics.rollout import Stepper, chunked
    from ivhl_jax.run.runner import run_chunked
    from ivhl_jax.run.store import RunStore, Snapshots
    from ivhl_jax.train.checkpoint import Checkpointer

    out, mode, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    inner = chunked(Stepper.create(_noisy, jnp.float32(0.9)), 10, save_every=2, observe=_observe)
    calls = [0]

    def advance(state):
        if not isinstance(state["x"], jax.core.Tracer):
            calls[0] += 1
            if mode == "advance" and calls[0] == kill_at:  # one chunk past the checkpoint is in the store
                os.kill(os.getpid(), signal.SIGKILL)
        return inner(state)

    if mode == "write":  # killed inside a chunk's write: its first array written, the second not
        original = RunStore._write
        def _write(self, start, obs, snap):
            if start == 5 * (kill_at - 1):
                self._group["norm"][start:start + 5] = np.asarray(obs[0])
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, start, obs, snap)
        RunStore._write = _write

    snaps = Snapshots(every=20, fields=lambda s: {{"field": s["x"]}}, dims=("i",))
    with Checkpointer(os.path.join(out, "ckpt"), save_every=20) as ck:
        resume = ck.latest_step() is not None
        store = RunStore(os.path.join(out, "run.zarr"), config={{"n": 1}}, resume=resume, snapshots=snaps)
        run_chunked(advance, _start(), n_chunks=8, steps_per_chunk=10, checkpointer=ck, progress=False, sink=store)
        store.close()
""")


def _tree(path):
    """Every file under a store with its bytes (zarr.json as parsed JSON less the run's environment and date)."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            key = os.path.relpath(p, path)
            if f == "zarr.json":
                doc = json.load(open(p))
                for k in ("library", "runtime", "date_created"):
                    doc.get("attributes", {}).pop(k, None)
                out[key] = doc
            else:
                out[key] = open(p, "rb").read()
    return out


@pytest.mark.slow  # five fresh processes: about 30 s
@pytest.mark.parametrize("mode,kill_at", [("advance", 4), ("advance", 6), ("write", 5)])
def test_sigkill_then_resume_gives_the_store_of_an_uninterrupted_run(tmp_path, mode, kill_at):
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT.format(here=os.path.dirname(__file__)))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    run = [sys.executable, str(script)]
    killed, straight = str(tmp_path / "killed"), str(tmp_path / "straight")
    p = subprocess.run([*run, killed, mode, str(kill_at)], env=env, capture_output=True, text=True)
    assert p.returncode == -9, p.stderr
    for out in (killed, straight):
        p = subprocess.run([*run, out, "none", "0"], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    a, b = open_run(killed), open_run(straight)
    assert a.attrs["records"] == b.attrs["records"] == 40 and a.attrs["snapshots"] == 4
    assert _tree(a.path) == _tree(b.path)  # every chunk file and metadata document, bit for bit


def test_foreign_damaged_or_missing_stores_are_refused_in_one_line(tmp_path):
    store = RunStore(tmp_path / "a" / "run.zarr", config={"n": 1, "steps": 4}, extendable=("steps",))
    run_chunked(lambda s: (s + 1, s[None]), jnp.zeros(2), n_chunks=2, steps_per_chunk=1, progress=False, sink=store)
    store.close()
    RunStore(tmp_path / "a" / "run.zarr", config={"n": 1, "steps": 8}, resume=True, extendable=("steps",))  # extends
    with pytest.raises(StoreError, match=r"different configuration \(differs in \['n'\]\)") as e:
        RunStore(tmp_path / "a" / "run.zarr", config={"n": 2, "steps": 4}, resume=True)
    assert "\n" not in str(e.value) and str(tmp_path / "a" / "run.zarr") in str(e.value)
    other = tmp_path / "b" / "run.zarr"
    other.mkdir(parents=True)
    (other / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    with pytest.raises(StoreError, match="is not an ivhl run store"):
        RunStore(other, resume=True)
    (other / "zarr.json").write_text("{trunc")
    with pytest.raises(StoreError, match="is damaged"):
        open_run(other)
    with pytest.raises(StoreError, match="holds no run store"):
        open_run(tmp_path / "nothing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        RunStore(tmp_path / "file")
    with pytest.raises(TypeError, match="sink must be"):
        run_chunked(
            lambda s: (s, s[None]), jnp.zeros(1), n_chunks=1, steps_per_chunk=1, progress=False, sink=str(tmp_path)
        )
    with pytest.raises(ValueError, match=r"snapshot_every \(15\) must be a multiple of steps_per_chunk \(10\)"):
        s = RunStore(tmp_path / "c" / "run.zarr", snapshots=Snapshots(every=15, fields=lambda s: {"s": s}, dims=("i",)))
        run_chunked(lambda s: (s, s[None]), jnp.zeros(2), n_chunks=1, steps_per_chunk=10, progress=False, sink=s)


def test_two_runs_cannot_write_one_store(tmp_path):
    store = RunStore(tmp_path / "run.zarr")
    code = f"from ivhl_jax.run.store import RunStore\nRunStore({str(tmp_path / 'run.zarr')!r})"
    p = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True
    )
    assert p.returncode == 1 and "is in use: another run holds its lock" in p.stderr.strip().splitlines()[-1]
    store.close()


def test_a_setting_added_after_a_run_was_written_resumes_at_its_default(tmp_path):
    """A run written before a setting existed (its saved config lacks the key) resumes when the new setting
    holds its default, in both the checkpoint folder and the run store; a non-default value is a difference."""
    import dataclasses
    import json

    from ivhl_jax.run.config import prepare_run_dir

    @dataclasses.dataclass(frozen=True)
    class Old:
        n: int = 1
        steps: int = 4

    @dataclasses.dataclass(frozen=True)
    class New:
        n: int = 1
        steps: int = 4
        system: str = "scalar"

    out = tmp_path / "run"
    ckpt = prepare_run_dir(out, Old(), resume=True)
    os.makedirs(os.path.join(ckpt, "2"))  # a checkpoint step ties the folder to its configuration
    store = RunStore(out / "run.zarr", config=Old(), lock=False)
    run_chunked(lambda s: (s + 1, s[None]), jnp.zeros(2), n_chunks=2, steps_per_chunk=1, progress=False, sink=store)
    store.close()
    assert "system" not in json.loads((out / "config.json").read_text())

    prepare_run_dir(out, New(), resume=True)
    RunStore(out / "run.zarr", config=New(), resume=True, lock=False).child("stage0").close()
    # the saved files now hold the new key; a run written without it with a non-default value still differs
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(Old())))
    with pytest.raises(ValueError, match=r"differs in \['system'\]"):
        prepare_run_dir(out, New(system="spin1"), resume=True)
    with pytest.raises(StoreError, match=r"differs in \['system'\]"):
        RunStore(out / "run.zarr", config=New(system="spin1"), resume=True, lock=False)
