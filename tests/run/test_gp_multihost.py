"""The pencil-sharded 3-D Gross–Pitaevskii run across processes: ``ivhl launch`` starts 2 processes × 4 emulated
devices, the distributed FFT spans both, the result equals one process, checkpoints move between the 2-process run
and a 1-process run bit-exactly (both ways), and the run store's ψ snapshots, written shard by shard by the process
that holds each shard, equal the 1-process store bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from tests.run.launching import launch_command, launch_env, store_files

# Shared by the workers and the test: the system and the initial state (a 16³ trapped cloud with a vortex).
CASE = textwrap.dedent("""
    import jax.numpy as jnp
    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.physics import condensate as C

    STEPS, DT = 10, 1e-2

    def case(layout):
        grid = C.Grid.uniform((16, 16, 16), 10.0)
        system = C.GPSystem.create(grid, C.harmonic(grid, 1.0), 5.0, layout=layout)
        psi = C.imprint_vortices(C.gaussian(grid), grid, jnp.array([[0.5, 0.0]]), jnp.array([1]))
        return C.strang(system, DT), psi

    def run(stepper, psi):
        return jax.jit(lambda st, p: trajectory(st, p, STEPS)[0])(stepper, psi)
""")

WORKER = textwrap.dedent("""
    import json, os, sys
    from ivhl_jax.run.launch import initialize
    info = initialize()
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from ivhl_jax.numerics import distributed_fft as D
    from ivhl_jax.train.checkpoint import Checkpointer
    exec(open(sys.argv[2]).read())

    out = sys.argv[1]
    pid = jax.process_index()
    layout = D.parse_mesh("4x2", 3)  # a pencil over the 8 devices of both processes
    stepper, psi0 = case(layout)
    psi = stepper.init(psi0)
    res = dict(info, n_dev=jax.device_count(), n_local=jax.local_device_count(),
               shard=list(psi.addressable_shards[0].data.shape), spec=str(psi.sharding.spec))
    final = run(stepper, psi)
    res["final_spec"] = str(final.sharding.spec)
    full = multihost_utils.process_allgather(final, tiled=True)
    if pid == 0:
        np.save(os.path.join(out, "final2.npy"), full)
    with Checkpointer(os.path.join(out, "ckpt2")) as ck:
        ck.save(10, {"psi": final})
    # the 1-process checkpoint, restored onto this 2-process pencil
    step, back, _ = Checkpointer(os.path.join(out, "ckpt1")).restore({"psi": final}, sharding=layout.sharding())
    back = back["psi"]
    ref = np.load(os.path.join(out, "state1.npy"))
    got = multihost_utils.process_allgather(back, tiled=True)
    res["restored_step"] = step
    res["restored_bit_exact"] = bool(np.array_equal(got.view(np.uint64), ref.view(np.uint64)))
    res["restored_spec"] = str(back.sharding.spec)
    with open(os.path.join(out, f"result{pid}.json"), "w") as fh:
        json.dump(res, fh)
""")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_pencil_gp_on_two_processes_equals_one_and_checkpoints_move_both_ways(tmp_path):
    from ivhl_jax.numerics import distributed_fft as D
    from ivhl_jax.train.checkpoint import Checkpointer

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    ns: dict = {"jax": jax}
    exec(CASE, ns)
    stepper, psi0 = ns["case"](None)
    single = np.asarray(ns["run"](stepper, jax.device_put(psi0, jax.devices()[0])))
    # a 1-process checkpoint (pencil over this process's 8 devices) for the 2-process run to restore
    layout1 = D.parse_mesh("4x2", 3)
    st1, _ = ns["case"](layout1)
    state1 = ns["run"](st1, st1.init(psi0))
    np.save(tmp_path / "state1.npy", np.asarray(state1))
    with Checkpointer(tmp_path / "ckpt1") as ck:
        ck.save(10, {"psi": state1})
    (tmp_path / "case.py").write_text(CASE)
    (tmp_path / "worker.py").write_text(WORKER)
    files = [str(tmp_path / "worker.py"), str(tmp_path), str(tmp_path / "case.py")]
    cmd = launch_command(*files, devices_per_process=4, heartbeat_timeout=20, timeout=400)
    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=450)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = [json.loads((tmp_path / f"result{i}.json").read_text()) for i in range(2)]
    for i, r in enumerate(res):
        assert r["num_processes"] == 2 and r["process_id"] == i and r["n_dev"] == 8 and r["n_local"] == 4
        assert r["shard"] == [4, 8, 16] and r["spec"] == r["final_spec"] == "P('x', 'y', None)"
        assert r["restored_step"] == 10 and r["restored_bit_exact"], r  # 1 process -> 2 processes
    final2 = np.load(tmp_path / "final2.npy")
    scale = np.abs(single).max()
    np.testing.assert_allclose(final2, single, rtol=0, atol=1e-6 * scale)  # 2 processes == one device
    # the 2-process checkpoint restored onto this one process: the 8-device pencil and a single device
    for sharding in (layout1.sharding(), jax.sharding.SingleDeviceSharding(jax.devices()[0])):
        step, back, _ = Checkpointer(tmp_path / "ckpt2").restore(
            {"psi": jax.numpy.zeros_like(state1)}, sharding=sharding
        )
        back = back["psi"]
        assert step == 10
        np.testing.assert_array_equal(np.asarray(back).view(np.uint64), final2.view(np.uint64))  # bit-exact


SIM = [
    "sim",
    "bec",
    "--set",
    "dims=3",
    "--set",
    "grid=16",
    "--set",
    "length=10",
    "--set",
    "g=50",
    "--set",
    "steps=20",
    "--set",
    "steps_per_chunk=10",
    "--set",
    "save_every=5",
    "--set",
    "checkpoint_every=10",
    "--set",
    "ground_steps=200",
    "--set",
    "ground_method=flow",  # the one-device run searches as the mesh runs do (cg runs on one device only)
    "--no-progress",
]


def test_sim_bec_mesh_setting_errors(tmp_path, capsys):
    from ivhl_jax import cli

    for mesh, dims, match in [
        ("3", 3, "does not divide the grid"),
        ("4x2", 2, "needs one axis unsplit"),
        ("4x2x1", 3, "one (slab) or two (pencil)"),
        ("eight", 3, "not of the form"),
    ]:
        code = cli.main([*SIM, "--set", f"dims={dims}", "--set", f"mesh={mesh}", "--out", str(tmp_path / "r")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "mesh=" in err[0] and match in err[0], err


# Runs `ivhl sim bec` with every process_allgather recorded (name and size) and the run store's compiled snapshot
# program checked for collectives, so the test can show that no field-sized gather happens anywhere in the run.
PROBE = textwrap.dedent("""
    import json, os, sys
    from jax.experimental import multihost_utils
    from ivhl_jax.run import store as S

    gathers, hlo = [], []
    _gather, _begin = multihost_utils.process_allgather, S.RunStore.begin

    def gather(x, *a, **k):
        import jax
        gathers.append([int(sum(getattr(l, "size", 1) for l in jax.tree_util.tree_leaves(x)))])
        return _gather(x, *a, **k)

    def begin(self, *a, **k):
        _begin(self, *a, **k)
        if self.snapshot_hlo is not None:
            hlo.append([c for c in ("all-gather", "all-to-all", "all-reduce", "collective-permute")
                        if c in self.snapshot_hlo])

    multihost_utils.process_allgather, S.RunStore.begin = gather, begin
    from ivhl_jax import cli
    code = cli.main(sys.argv[2:])
    import jax
    with open(os.path.join(sys.argv[1], f"probe{jax.process_index()}.json"), "w") as fh:
        json.dump({"gathers": gathers, "snapshot_collectives": hlo}, fh)
    sys.exit(code)
""")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sim_bec_pencil_in_one_process_and_under_launch_equals_one_device(tmp_path):
    from ivhl_jax import cli
    from ivhl_jax.run import open_run

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    assert cli.main([*SIM, "--out", str(tmp_path / "one")]) == 0
    snap = ["--set", "snapshot_every=10"]  # ψ every chunk into run.zarr, each process writing its own shards
    assert cli.main([*SIM, *snap, "--set", "mesh=4x2", "--out", str(tmp_path / "pencil")]) == 0
    (tmp_path / "probe.py").write_text(PROBE)
    cmd = [
        sys.executable,
        "-m",
        "ivhl_jax.cli",
        "launch",
        "--nproc",
        "2",
        "--devices-per-process",
        "4",
        "--heartbeat-timeout",
        "20",
        "--timeout",
        "400",
        "--",
        sys.executable,
        str(tmp_path / "probe.py"),
        str(tmp_path),
        *SIM,
        *snap,
        "--set",
        "mesh=4x2",
        "--out",
        str(tmp_path / "launch"),
    ]
    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=450)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ref = np.load(tmp_path / "one" / "final_state.npy")
    # 200 imaginary-time steps and 20 real-time steps: the FFTs' round-off differs, within 1e-5 of the peak
    for run in ("pencil", "launch"):
        got = np.load(tmp_path / run / "final_state.npy")
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    obs = json.loads((tmp_path / "launch" / "observables.json").read_text())
    assert obs["config"]["mesh"] == "4x2"
    # nothing field-sized (16³ values) is gathered: not the snapshots (their program has no collective), not the
    # final state (each process writes its shards of final_state into the store; process 0 copies it chunk by
    # chunk into final_state.npy)
    for i in range(2):
        probe = json.loads((tmp_path / f"probe{i}.json").read_text())
        assert probe["snapshot_collectives"] == [[]], probe
        assert all(n < 16**3 for (n,) in probe["gathers"]), probe
    # the stores of 1 and 2 processes: the same files, the same metadata documents (less the environment:
    # devices, processes, XLA flags), a pencil shard per chunk of (1, 4, 8, 16), the same values up to the
    # round-off of the cross-process reductions (the bits of the writing path: test_store_of_two_processes_...)
    pencil, launch = (store_files(tmp_path / run / "run.zarr") for run in ("pencil", "launch"))
    assert sorted(pencil) == sorted(launch) and len([k for k in launch if k.startswith("psi/c/1/")]) == 8
    assert {k: v for k, v in pencil.items() if k.endswith("zarr.json")} == {
        k: v for k, v in launch.items() if k.endswith("zarr.json")
    }
    one, two = open_run(tmp_path / "pencil"), open_run(tmp_path / "launch")
    assert two.snapshots["psi"].dims == ("snapshot_time", "x", "y", "z") and two.snapshots.sizes["snapshot_time"] == 2
    # (fields: within 1e-5 of their peak; observations, per particle in trap units, of order 1 or, as ⟨L_z⟩ of
    # this vortex-free cloud, zero up to round-off: within 1e-5)
    for a, b, floor in (
        (one.snapshots, two.snapshots, 0.0),
        (one.fields, two.fields, 0.0),
        (one.observations, two.observations, 1.0),
    ):
        for k in a.data_vars:
            scale = max(float(np.abs(a[k]).max()), floor)
            np.testing.assert_allclose(b[k].values, a[k].values, rtol=0, atol=1e-5 * scale, err_msg=k)
    final = np.load(tmp_path / "launch" / "final_state.npy")
    for data in (two.snapshots["psi"].isel(snapshot_time=-1), two.fields["final_state"]):
        np.testing.assert_array_equal(data.values.view(np.uint64), final.view(np.uint64))


STORE_CASE = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from ivhl_jax.numerics import distributed_fft as D
    from ivhl_jax.numerics.rollout import chunked
    from ivhl_jax.run.runner import run_chunked
    from ivhl_jax.run.store import RunStore, Snapshots

    def write_store(path):
        """A pencil-sharded GP run (no cross-device sums: the raw scheme, whose phase-range check only decides a
        branch; the FFT's transposes move data; the peak is a max) whose store holds ψ every 5 steps and the final
        state. The default scheme restores the norm with a global sum, whose order differs between meshes."""
        stepper, psi0 = case(D.parse_mesh("4x2", 3))
        stepper = C.strang(stepper.params.system, DT, project_norm=False)
        grid = stepper.params.system.grid
        peak = lambda psi, params: {"peak": jnp.max(jnp.abs(psi) ** 2)}
        advance = chunked(stepper, 5, save_every=5, observe=peak)
        snaps = Snapshots(every=5, fields=lambda psi: {"psi": psi}, dims=("x", "y", "z"),
                          coords={d: np.asarray(c) for d, c in zip("xyz", grid.coords)})
        store = RunStore(path, config={"case": "pencil"}, dt=DT, snapshots=snaps)
        result = run_chunked(advance, stepper.init(psi0), n_chunks=2, steps_per_chunk=5, progress=False, sink=store)
        store.write_field("final_state", result.state, ("x", "y", "z"))
        store.close()
        return store.snapshot_hlo
''')

STORE_WORKER = textwrap.dedent("""
    import json, os, sys
    from ivhl_jax.run.launch import initialize
    initialize()
    import jax
    exec(open(sys.argv[2]).read())
    exec(open(sys.argv[3]).read())
    hlo = write_store(os.path.join(sys.argv[1], "two", "run.zarr"))
    with open(os.path.join(sys.argv[1], f"store{jax.process_index()}.json"), "w") as fh:
        json.dump({"collectives": [c for c in ("all-gather", "all-to-all", "all-reduce") if c in hlo],
                   "n_local": jax.local_device_count()}, fh)
""")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_store_of_two_processes_equals_one_process_bit_for_bit(tmp_path):
    """2 processes × 4 devices write a pencil-sharded run's store (snapshots, observations, final state), each
    process its own shards, with no collective in the snapshot program; it equals file for file, bit for bit,
    the store of the same run in one process over 8 devices."""
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    ns: dict = {"jax": jax}
    exec(CASE, ns)
    exec(STORE_CASE, ns)
    ns["write_store"](str(tmp_path / "one" / "run.zarr"))
    for name, text in (("case.py", CASE), ("store_case.py", STORE_CASE), ("worker.py", STORE_WORKER)):
        (tmp_path / name).write_text(text)
    files = [str(tmp_path / "worker.py"), str(tmp_path), str(tmp_path / "case.py"), str(tmp_path / "store_case.py")]
    cmd = launch_command(*files, devices_per_process=4, heartbeat_timeout=20, timeout=400)
    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=450)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for i in range(2):
        assert json.loads((tmp_path / f"store{i}.json").read_text()) == {"collectives": [], "n_local": 4}
    one, two = (store_files(tmp_path / run / "run.zarr") for run in ("one", "two"))
    assert len([k for k in two if k.startswith("psi/c/")]) == 2 * 8  # 2 snapshots × 8 shards, one chunk each
    assert len([k for k in two if k.startswith("final_state/c/")]) == 8
    assert sorted(one) == sorted(two)
    for k in one:
        assert one[k] == two[k], k
