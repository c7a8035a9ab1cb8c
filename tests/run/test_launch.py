"""`ivhl launch`: two local processes wired by jax.distributed — reduction, data-parallel step, checkpoints
saved by 2 processes and restored by 1, and a dying process making the other fail within bounded time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from ivhl_jax.run import launch
from tests.run.launching import launch_command, launch_env

WORKER = textwrap.dedent("""
    import json, os, sys, time
    from ivhl_jax.run.launch import initialize
    info = initialize()
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jax.experimental import multihost_utils
    from ivhl_jax import parallel, training
    from ivhl_jax.train.checkpoint import Checkpointer

    mode, out = sys.argv[1], sys.argv[2]
    pid = jax.process_index()
    res = dict(info, n_dev=jax.device_count(), n_local=jax.local_device_count())
    mesh = parallel.make_mesh({"data": -1})
    local = np.full((jax.local_device_count(),), pid + 1.0, np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
    res["sum"] = float(total.addressable_data(0))
    if mode == "die":
        if pid == int(os.environ.get("DIE_PID", "1")):
            os._exit(3)
        f = jax.jit(lambda a: jnp.sum(a), out_shardings=NamedSharding(mesh, P()))
        t0 = time.time()
        try:
            for i in range(100000):
                f(x + i).block_until_ready()
                time.sleep(0.01)
        except Exception as e:  # a failed collective raises; the coordination service may also abort us
            print(f"worker {pid}: collective failed after {time.time() - t0:.1f} s: {e}", file=sys.stderr)
            sys.exit(7)
        sys.exit(0)

    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(16, 32)).astype(np.float32) / 4, "b1": np.zeros(32, np.float32),
              "w2": rng.normal(size=(32, 4)).astype(np.float32) / 6}
    batch = {"x": rng.normal(size=(16, 16)).astype(np.float32), "y": rng.normal(size=(16, 4)).astype(np.float32)}

    def loss_fn(p, b, key, extra):
        y = jnp.tanh(b["x"] @ p["w1"] + p["b1"]) @ p["w2"]
        loss = jnp.mean((y - b["y"]) ** 2)
        return loss, ({}, extra)

    opt = training.make_optimizer(learning_rate=1e-2)
    state = training.init_train_state(params, opt, key=jax.random.key(0))
    spec = {"data": -1} if mode == "dp" else {"fsdp": -1}
    mesh = parallel.make_mesh(spec)
    sh = parallel.state_shardings(state, mesh, min_size=1)
    gstate = parallel.shard_tree(state, sh)
    n = batch["x"].shape[0] // jax.process_count()
    mine = {k: v[pid * n:(pid + 1) * n] for k, v in batch.items()}  # this host's rows only
    gbatch = parallel.shard_batch(mine, mesh, process_local=True)
    step = parallel.jit_train_step(training.make_train_step(loss_fn, opt), sh,
                                   jax.tree_util.tree_map(lambda a: a.sharding, gbatch), mesh)
    for _ in range(2):
        gstate, m = step(gstate, gbatch)
    res["loss"] = float(m["loss"])
    ref_step = jax.jit(training.make_train_step(loss_fn, opt))
    dev = jax.local_devices()[0]
    ref = jax.device_put(state, dev)
    for _ in range(2):
        ref, rm = ref_step(ref, jax.device_put(batch, dev))
    res["ref_loss"] = float(rm["loss"])
    full = multihost_utils.process_allgather(gstate.params, tiled=True)
    res["max_param_diff"] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                for a, b in zip(jax.tree_util.tree_leaves(full), jax.tree_util.tree_leaves(ref.params)))
    res["w1_spec"] = str(gstate.params["w1"].sharding.spec)
    if mode == "ckpt":
        with Checkpointer(os.path.join(out, "ckpt")) as ck:
            ck.save(int(gstate.step), gstate, metadata={"processes": jax.process_count()})
        if pid == 0:
            np.savez(os.path.join(out, "params.npz"), **{k: np.asarray(v) for k, v in full.items()})
    with open(os.path.join(out, f"result{pid}.json"), "w") as fh:
        json.dump(res, fh)
""")


def _write_worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return str(path)


def _run_launch(tmp_path, mode, timeout=240):
    worker = _write_worker(tmp_path)
    cmd = launch_command(worker, mode, str(tmp_path), devices_per_process=2, heartbeat_timeout=10, timeout=timeout - 20)
    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp_path / f"result{i}.json").read_text()) for i in range(2)]


DRIVER_WORKER = textwrap.dedent('''
    import dataclasses, json, os, sys
    from ivhl_jax.run.config import option
    from ivhl_jax.run.driver import Simulation, run_main

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        n: int = option(1, "unused")

    class Report(Simulation):
        """Reports the processes it runs among."""
        prog = "ivhl sim report"
        config_type = Cfg
        own_checkpoints = True
        multiprocess = os.environ.get("REPORT_MULTIPROCESS", "1") == "1"

        def run(self, cfg, ctx):
            import jax
            path = os.path.join(ctx.out, f"proc{jax.process_index()}.json")
            with open(path, "w") as fh:
                json.dump({"initialized": jax.distributed.is_initialized(), "count": jax.process_count()}, fh)
            return {"report": path}

        def default_out(self, cfg, args):
            return "runs/report"

    sys.exit(run_main(Report(), sys.argv[1:]))
''')


def test_the_driver_joins_the_launched_processes_for_every_simulation(tmp_path):
    """run_main calls initialize() itself (no simulation has to): under the variables `ivhl launch` exports
    the process joins the distributed runtime before any JAX work; alone it stays a single process."""
    script = tmp_path / "report.py"
    script.write_text(DRIVER_WORKER)
    alone, launched = tmp_path / "alone", tmp_path / "launched"
    env = launch.child_env(0, 1, launch.free_port(), base=launch_env())
    for out, run_env in ((alone, launch_env()), (launched, env)):
        p = subprocess.run(
            [sys.executable, str(script), "--out", str(out)], env=run_env, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((alone / "proc0.json").read_text()) == {"initialized": False, "count": 1}
    assert json.loads((launched / "proc0.json").read_text()) == {"initialized": True, "count": 1}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_simulation_under_launch_runs_as_one_job_of_two_processes(tmp_path):
    """A multi-process simulation runs as one job of the two processes; a one-process simulation refuses the
    job in one line (N copies of it would write one folder) and the launcher stops with its status."""
    script = tmp_path / "report.py"
    script.write_text(DRIVER_WORKER)
    for multiprocess in ("1", "0"):
        out = tmp_path / f"run{multiprocess}"
        p = subprocess.run(
            launch_command(str(script), "--out", str(out), devices_per_process=1, heartbeat_timeout=10, timeout=200),
            env=launch_env(REPORT_MULTIPROCESS=multiprocess),
            capture_output=True,
            text=True,
            timeout=240,
        )
        if multiprocess == "1":
            assert p.returncode == 0, p.stderr[-3000:]
            for pid in range(2):
                assert json.loads((out / f"proc{pid}.json").read_text()) == {"initialized": True, "count": 2}
        else:
            assert p.returncode == 2, p.stderr[-3000:]
            assert "ivhl sim report: runs as one process, but this job has 2 (ivhl)" in p.stderr, p.stderr[-3000:]
            assert not list(out.glob("proc*.json"))


def test_detect_environment_and_child_env():
    assert launch.detect_environment({}) == "single"
    assert launch.detect_environment({"IVHL_COORDINATOR": "127.0.0.1:1"}) == "ivhl"
    assert launch.detect_environment({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}) == "slurm"
    assert launch.detect_environment({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}) == "single"
    assert launch.detect_environment({"OMPI_COMM_WORLD_SIZE": "2"}) == "ompi"
    env = launch.child_env(
        1, 2, 12345, devices_per_process=4, base={"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo"}
    )
    assert env["IVHL_COORDINATOR"] == "127.0.0.1:12345" and env["IVHL_PROCESS_ID"] == "1"
    assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=4"
    assert launch.initialize(env={}) == {"environment": "single", "process_id": 0, "num_processes": 1}
    with pytest.raises(ValueError, match=">= 1 second"):
        launch.initialize(env={}, heartbeat_timeout=0)


def test_launch_cli_errors(capsys):
    with pytest.raises(SystemExit):
        launch.main(["--nproc", "2"])  # no command
    assert "no command" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launch.main(["--nproc", "0", "--", "true"])
    # a failing child makes the launcher return its exit code
    assert launch.main(["--nproc", "2", "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert launch.main(["--nproc", "2", "--", sys.executable, "-c", "pass"]) == 0


def test_launcher_stops_the_others_when_one_fails_or_it_is_terminated():
    import signal

    # process 1 would run for ten minutes; process 0 fails: the launcher returns 4 after the 1 s grace. The bound
    # only tells "stopped" from "waited for process 1", so it is wide: a loaded host cannot reach it.
    code = (
        "import os, sys, time; first = os.environ['IVHL_PROCESS_ID'] == '0'; "
        "time.sleep(0.2 if first else 600); sys.exit(4)"
    )
    t0 = time.monotonic()
    assert launch.main(["--nproc", "2", "--grace", "1", "--", sys.executable, "-c", code]) == 4
    assert time.monotonic() - t0 < 300
    # SIGTERM to the launcher (a scheduler, `timeout`) terminates its children too
    marker = "import time; time.sleep(61.5)"
    p = subprocess.Popen(
        launch_command("-c", marker),
        env=launch_env(),
    )
    # Signal once the launcher and both children are up (it installs its SIGTERM handler before it starts
    # them); a fixed sleep raced the launcher's import on a loaded host (default action: killed, -15).
    deadline = time.monotonic() + 60
    pattern = r"time\.sleep\(61\.5\)"  # pgrep takes a regex: the marker's parentheses and dots escaped
    while len(subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()) < 3:
        assert time.monotonic() < deadline, "the launcher did not start its two children within 60 s"
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 143
    left = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    assert not left


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_reduce_and_train_data_parallel(tmp_path):
    res = _run_launch(tmp_path, "dp")
    for i, r in enumerate(res):
        assert r["process_id"] == i and r["num_processes"] == 2 and r["n_dev"] == 4 and r["n_local"] == 2
        assert r["sum"] == pytest.approx(2 * 1.0 + 2 * 2.0)  # cross-process reduction
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)  # DP step over 2 hosts == one device
        assert r["max_param_diff"] < 1e-6
    assert res[0]["loss"] == res[1]["loss"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_checkpoint_from_two_processes_restores_on_one(tmp_path):
    import jax.numpy as jnp

    from ivhl_jax import parallel, training
    from ivhl_jax.train.checkpoint import Checkpointer

    res = _run_launch(tmp_path, "ckpt")
    assert "fsdp" in res[0]["w1_spec"] and res[0]["max_param_diff"] < 1e-6
    saved = np.load(tmp_path / "params.npz")
    like = training.init_train_state(
        {k: jnp.zeros_like(saved[k]) for k in saved.files},
        training.make_optimizer(learning_rate=1e-2),
        key=jax.random.key(0),
    )
    for devices in (jax.devices(), jax.devices()[:4], jax.devices()[:1]):
        mesh = parallel.make_mesh({"fsdp": -1}, devices=devices)
        step, state, meta = Checkpointer(tmp_path / "ckpt").restore(
            like, sharding=parallel.state_shardings(like, mesh, min_size=1)
        )
        assert step == 2 and meta == {"processes": 2}
        for k in saved.files:
            np.testing.assert_array_equal(np.asarray(state.params[k]), saved[k])  # bit-exact
        assert len(state.params["w1"].sharding.device_set) == len(devices)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("dead", [1, 0], ids=["worker_dies", "coordinator_dies"])
def test_dead_process_makes_the_other_fail_in_bounded_time(tmp_path, dead):
    worker = _write_worker(tmp_path)
    port = launch.free_port()
    procs = []
    for i in range(2):
        env = launch.child_env(i, 2, port, devices_per_process=1, heartbeat_timeout=5, base=launch_env())
        env["DIE_PID"] = str(dead)
        procs.append(
            subprocess.Popen(
                [sys.executable, worker, "die", str(tmp_path)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    survivor = procs[1 - dead]
    try:
        procs[dead].communicate(timeout=180)
        t_dead = time.monotonic()
        _, err = survivor.communicate(timeout=60)  # bounded: the survivor must stop on its own
        waited = time.monotonic() - t_dead
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    print(f"process {dead} died; the survivor exited with code {survivor.returncode} after {waited:.1f} s")
    assert procs[dead].returncode == 3
    assert survivor.returncode != 0
    assert waited < 60
    assert any(s in err for s in ("collective failed", "heartbeat", "Terminating process")), err[-2000:]


# --- fault injection: a worker that raises, one killed mid-run, a kill during a checkpoint save -------------

FAULT_WORKER = textwrap.dedent("""
    import os, signal, sys, time
    from ivhl_jax.run.launch import initialize
    initialize()
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from ivhl_jax import parallel

    pid = jax.process_index()
    mesh = parallel.make_mesh({"data": -1})
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")),
                                               np.ones(jax.local_device_count(), np.float32))
    f = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))
    print(f"rank {pid} sum {float(f(x).addressable_data(0))}")
    if pid == int(os.environ["FAULT_RANK"]):
        if os.environ["FAULT"] == "raise":
            raise RuntimeError(f"injected failure in rank {pid}")
        if os.environ["FAULT"] == "hang":  # alive and heartbeating, but never enters the peer's next collective
            time.sleep(3600)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.time()
    while time.time() - t0 < 90:  # the healthy peer keeps running collectives until it is stopped
        f(x).block_until_ready()
        time.sleep(0.01)
""")


def _launch_fault_worker(tmp_path, fault: str, rank: int, heartbeat: int):
    """``ivhl launch`` of two FAULT_WORKER ranks where ``rank`` injects ``fault``; returns (result, seconds)."""
    script = tmp_path / "fault_worker.py"
    script.write_text(FAULT_WORKER)
    cmd = launch_command(str(script), devices_per_process=1, heartbeat_timeout=heartbeat, grace=5, timeout=100)
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd,
        env=launch_env(FAULT=fault, FAULT_RANK=str(rank)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, time.monotonic() - t0


@pytest.mark.multiprocess
@pytest.mark.slow  # two racing processes and a bound on the time to stop them: not for a loaded shared host
@pytest.mark.parametrize(
    "fault,rank",
    [("raise", 1), ("raise", 0), ("sigkill", 1)],
    ids=["worker_raises", "coordinator_raises", "worker_sigkilled"],
)
def test_a_failing_rank_stops_the_job_with_its_traceback_first(tmp_path, fault, rank):
    """One rank raising (or being SIGKILLed) stops every process within the heartbeat
    timeout; the launcher exits non-zero naming that rank (the first to exit, though the peer fails a few ms
    later), shows its traceback in one block and repeats the root cause on its last line; every relayed line
    carries its rank, and Gloo's connection chatter is gone."""
    heartbeat = 10
    proc, elapsed = _launch_fault_worker(tmp_path, fault, rank, heartbeat)
    err, out = proc.stderr, proc.stdout
    print(f"{fault} in rank {rank}: launcher exit {proc.returncode} after {elapsed:.1f} s")
    if fault == "raise":
        assert proc.returncode == 1, err[-3000:]
        assert f"process {rank} exited with code 1; stopping the others" in err
        assert f"[rank {rank}] RuntimeError: injected failure in rank {rank}" in err
        # the launcher's report shows the first failure's traceback in one block, and its last line repeats
        # the root cause, even though the peer failed a few milliseconds later with an error of its own
        block = err[err.index(f"---- process {rank}: traceback ----") :]
        assert f"[rank {rank}] RuntimeError: injected failure in rank {rank}" in block.split("\n----\n")[0]
        assert (
            err.strip()
            .splitlines()[-1]
            .startswith(f"ivhl launch: process {rank} failed first (exited with code 1: RuntimeError: injected failure")
        )
    else:
        assert proc.returncode == 128 + 9, err[-3000:]
        assert f"process {rank} was killed by SIGKILL" in err
        assert f"process {rank} failed first (was killed by SIGKILL)" in err.strip().splitlines()[-1]
    # without the exit hook a raising rank waited in jax's distributed shutdown until its peer's 90 s were over
    assert elapsed < heartbeat + 5 + 25, err[-3000:]  # heartbeat + grace + start-up on a loaded host
    assert "[Gloo]" not in err + out
    for line in (err + out).splitlines():
        assert line.startswith(("[rank ", "ivhl launch:", "----")), line
    assert f"[rank {1 - rank}] rank {1 - rank} sum 2.0" in out


@pytest.mark.multiprocess
@pytest.mark.slow  # two racing processes and a bound on the time to stop them: not for a loaded shared host
@pytest.mark.parametrize("rank", [1, 0], ids=["worker_hangs", "coordinator_hangs"])
def test_a_rank_hanging_outside_a_collective_stops_the_job_naming_it(tmp_path, rank):
    """Launch fault injection: one rank blocks for ever (it still heartbeats, so the coordination service
    sees nothing) while its peer waits for it in a collective. Within the stall timeout (= the heartbeat timeout)
    the launcher sees that no process uses CPU, shows every rank's stack, names the rank and the line it stopped
    at, stops every process (none is left behind) and exits 124."""
    heartbeat = 5
    proc, elapsed = _launch_fault_worker(tmp_path, "hang", rank, heartbeat)
    err = proc.stderr
    print(f"rank {rank} hangs: launcher exit {proc.returncode} after {elapsed:.1f} s\n{err[-1500:]}")
    assert proc.returncode == launch.HANG_EXIT_CODE, err[-3000:]
    assert f"no process used CPU for {heartbeat} s: the job hangs" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("ivhl launch: hang: "), last
    assert f"process {rank} stopped at fault_worker.py:" in last and "time.sleep(3600)" in last, last
    assert f"process {1 - rank}" in last, last  # where the peer waits is named too
    assert f"[rank {rank}]   File " in err  # the stacks were shown, rank-prefixed
    assert elapsed < heartbeat + 40, err[-3000:]  # stall timeout + start-up and stack dump on a loaded host
    script = tmp_path / "fault_worker.py"  # written by _launch_fault_worker
    left = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left running: {left}"


def test_stall_watch_and_stack_parsing():
    """The pieces of the hang detection: a faulthandler dump's main-thread frame, and the CPU watch on idle and
    busy process trees (a shell wrapper's busy child counts for the wrapper)."""
    dump = [
        "Thread 0x00007f01 (most recent call first):",
        '  File "/x/threading.py", line 324 in wait',
        "",
        "Current thread 0x00007f02 (most recent call first):",
        '  File "/w/jax/_src/array.py", line 9 in sync',
        '  File "/w/run.py", line 14 in <module>',
        "other output",
    ]
    assert launch._main_thread_frame(dump) == ("/w/jax/_src/array.py", 9, "sync")
    assert launch._in_jax("/w/jax/_src/array.py") and not launch._in_jax("/w/run.py")
    assert launch._main_thread_frame(["no dump here"]) is None
    with pytest.raises(ValueError, match="stall_timeout"):
        launch.launch(["true"], 1, stall_timeout=-1)
    idle = subprocess.Popen(["sleep", "30"])
    busy = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'while True: pass'"])
    try:
        watch = launch._StallWatch([idle.pid, busy.pid], stall=1.5)
        t = time.monotonic()
        hung = False
        for k in range(1, 5):
            hung = watch.hung([0, 1], t + k * 1.0) or hung
            time.sleep(1.0)
        assert not hung  # the busy tree keeps the job alive
        assert watch.active_at[1] > watch.active_at[0]
        assert watch.hung([0], time.monotonic() + 1.0)  # the idle one alone: hung
    finally:
        for p in (idle, busy):
            for q in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split():
                os.kill(int(q), 9)
            p.kill()
            p.wait()


SAVE_WORKER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import orbax.checkpoint as ocp
    from ivhl_jax.train import checkpoint as C

    out, where = sys.argv[1], sys.argv[2]
    marker = os.path.join(out, "in_save")

    def stall():  # tell the test we are inside the third save, then wait to be killed
        open(marker, "w").close()
        time.sleep(120)

    if where == "orbax":  # after the arrays are written to the temporary folder, before Orbax commits it
        finalize = ocp.StandardCheckpointHandler.finalize
        seen = []

        def slow_finalize(self, *a, **k):
            seen.append(1)
            if len(seen) == 3:
                stall()
            return finalize(self, *a, **k)

        ocp.StandardCheckpointHandler.finalize = slow_finalize
    else:  # after Orbax committed the step, while our checksum file is being written
        write_sums = C.Checkpointer._write_sums

        def slow_write_sums(self, step, sums):
            if step == 3:
                stall()
            return write_sums(self, step, sums)

        C.Checkpointer._write_sums = slow_write_sums
    with C.Checkpointer(os.path.join(out, "ckpt"), keep=5) as ck:
        for step in (1, 2, 3):
            ck.save(step, {"x": np.full((64, 64), step, np.float32), "n": np.int32(step)}, metadata={"step": step})
""")


@pytest.mark.parametrize("where", ["orbax", "checksums"])
def test_kill_during_checkpoint_save_leaves_the_previous_one_restorable(tmp_path, where):
    """A SIGKILL in the middle of a save (while Orbax writes the step, or while the checksum file is written)
    never costs the previous checkpoint: it restores bit-exactly, and the run can save the step again."""
    from ivhl_jax.train.checkpoint import Checkpointer

    script = tmp_path / "save_worker.py"
    script.write_text(SAVE_WORKER)
    p = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), where],
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "in_save").exists():
            assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the worker never reached its third save"
            time.sleep(0.05)
        p.kill()  # SIGKILL: no handler, no cleanup
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    like = {"x": np.zeros((64, 64), np.float32), "n": np.int32(0)}
    with Checkpointer(tmp_path / "ckpt", keep=5) as ck:
        step, state, meta = ck.restore(like)
        # killed before the commit: step 3 does not exist; killed after it: the data is complete (no checksum
        # file yet, so only the finiteness check applies) and restores
        assert step == (2 if where == "orbax" else 3)
        np.testing.assert_array_equal(np.asarray(state["x"]), np.full((64, 64), step, np.float32))
        assert int(state["n"]) == step and meta == {"step": step}
        assert ck.restore(like, step=2)[0] == 2  # the previous checkpoint is intact either way
        if where == "orbax":  # the half-written step is written again without complaint
            assert ck.save(3, {"x": np.full((64, 64), 3, np.float32), "n": np.int32(3)}, metadata={"step": 3})
            ck.wait()
            assert ck.restore(like)[0] == 3
