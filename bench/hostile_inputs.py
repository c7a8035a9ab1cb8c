"""Runs under faults and against hostile files: what survives, what is refused in one line, and what refusing the
largest declared store shape costs.

    python -m ivhl_jax.bench.hostile_inputs

Each fault is made on purpose (a Ctrl-C inside a chunk of a sharded run, a finished sharded run given more steps,
a checkpoint's checksum file lost after Orbax's commit, a stray step off the schedule, a template of another dtype
or structure, another configuration's checkpoint, a second writer, a full disk) and *survived* when the run resumes
bit for bit or the library refuses it in one line without touching a good checkpoint. Each hostile file (a link
where the run writes, a damaged or deeply nested ``config.json`` or config file, a store whose ``zarr.json``
declares a huge shape) is *refused in one line* when the run exits with status 2 (or the call raises) with a
single line that names the file, and writes nothing through a link. The run store declaring 10¹² records is
refused in a fresh process, whose time and peak-memory growth until the refusal are recorded. The sharded faults
run on 8 emulated CPU devices (``--set mesh=8``). Results: ``bench/results/hostile_inputs.json``.
"""

from __future__ import annotations

import os

# the sharded faults need several devices: 8 emulated CPU ones unless the caller chose
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MPLBACKEND", "Agg")

import argparse  # noqa: E402 - after the environment the devices depend on
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import errno  # noqa: E402
import fcntl  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ivhl_jax.bench.harness import write_results  # noqa: E402
from ivhl_jax.run.config import load_config, option  # noqa: E402
from ivhl_jax.run.driver import Simulation, run_main  # noqa: E402
from ivhl_jax.run.io import save_npy  # noqa: E402
from ivhl_jax.run.runner import run_chunked  # noqa: E402
from ivhl_jax.train.checkpoint import CHECKSUM_FILE, Checkpointer  # noqa: E402

HUGE_RECORDS = 10**12  # declared by a hostile store: 8 TB of float64 records


@dataclasses.dataclass(frozen=True)
class CountConfig:
    steps: int = option(4, "steps")
    rate: float = option(1.0, "added per step")


class CountSimulation(Simulation):
    """A streaming toy run: x += rate per step, records in <out>/run.zarr, checkpoints every 2 steps, the final
    state in <out>/final_state.npy."""

    prog = "ivhl sim count"
    config_type = CountConfig
    description = "count"
    extendable = ("steps",)
    streams = True

    def run(self, cfg, ctx):
        res = run_chunked(
            lambda x: (x + cfg.rate, x[None]),
            jnp.zeros(2),
            n_chunks=cfg.steps,
            steps_per_chunk=1,
            checkpointer=ctx.checkpointer,
            progress=False,
            sink=ctx.sink,
        )
        return {"final_state": save_npy(os.path.join(ctx.out, "final_state.npy"), res.state)}

    def default_out(self, cfg, args):
        return "runs/count"

    def checkpoint_every(self, cfg):
        return 2


def _main(argv: list[str]) -> tuple[int, str]:
    """``run_main`` of the toy run: (exit status, what it printed on stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = run_main(CountSimulation(), argv)
    return status, err.getvalue().strip()


def _one_line(status: int, err: str, name: str) -> bool:
    return status == 2 and "\n" not in err and name in err


def declare_huge(out: str, array: str) -> str:
    """Make the store of run ``out`` declare ``HUGE_RECORDS`` records for ``array`` (its zarr.json and the root's
    consolidated copy); the array's zarr.json path."""
    meta, root = (os.path.join(out, "run.zarr", *p, "zarr.json") for p in ((array,), ()))
    for path, doc_of in ((meta, lambda d: d), (root, lambda d: d["consolidated_metadata"]["metadata"][array])):
        with open(path) as f:
            doc = json.load(f)
        node = doc_of(doc)
        node["shape"] = [HUGE_RECORDS, *node["shape"][1:]]
        with open(path, "w") as f:
            json.dump(doc, f)
    return meta


def probe_huge(out: str) -> dict[str, Any]:
    """In this (fresh) process: a run, its store made to declare a huge shape, then the resume that must refuse
    it; the time and the growth of the peak resident memory from the resume's start to its refusal (0: the
    refusal stayed under the peak the process had already reached), and that peak."""
    _main(["--out", out])
    meta = declare_huge(out, "value")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    status, err = _main(["--out", out, "--set", "steps=6"])
    return {
        "declared_shape": [HUGE_RECORDS],
        "declared_bytes": HUGE_RECORDS * 8,
        "seconds_to_refuse": time.perf_counter() - t0,
        "peak_rss_growth_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "refused_in_one_line": _one_line(status, err, meta),
        "message": err,
    }


def _bec(out: str, *sets: str) -> int:
    from ivhl_jax.sims import bec

    small = ["grid=16", "length=12.0", "ground_steps=100", "g=50", "steps_per_chunk=50", "save_every=25"]
    argv = ["--no-progress", "--out", out, *(a for s in (*small, "checkpoint_every=100", *sets) for a in ("--set", s))]
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return bec.main(argv)


def _same_run(a: str, b: str) -> bool:
    from ivhl_jax.run import open_run

    ra, rb = open_run(a), open_run(b)
    same_obs = all(np.array_equal(ra.observations[k].values, rb.observations[k].values) for k in rb.observations)
    final = np.array_equal(np.load(os.path.join(a, "final_state.npy")), np.load(os.path.join(b, "final_state.npy")))
    ground = [json.load(open(os.path.join(d, "observables.json")))["ground_state"] for d in (a, b)]
    return bool(same_obs and final and ground[0] == ground[1] is not None)


Record = Callable[[str, bool, str], None]


def faults(tmp: str) -> list[dict[str, Any]]:
    """Every fault made, with whether it was survived and how."""
    out: list[dict[str, Any]] = []

    def record(name: str, survived: bool, how: str) -> None:
        out.append({"fault": name, "survived": bool(survived), "how": how})

    sharded_faults(tmp, record)
    checkpoint_faults(tmp, record)
    run_folder_faults(tmp, record)
    return out


def sharded_faults(tmp: str, record: Record) -> None:
    """A sharded condensate run (mesh=8) finished and given more steps, and one interrupted inside a chunk."""
    from ivhl_jax.sims import bec

    mesh = "mesh=8"
    straight, extended, killed = (os.path.join(tmp, n) for n in ("straight", "extended", "killed"))
    _bec(straight, mesh, "steps=200")
    _bec(extended, mesh, "steps=100")
    ok = _bec(extended, mesh, "steps=200") == 0 and _same_run(extended, straight)
    record("sharded run (mesh=8) finished, then given more steps", ok, "extends on its mesh, bit for bit")
    original = bec.chunked

    def interrupting(*args: Any, **kwargs: Any) -> Callable:
        advance, calls = original(*args, **kwargs), [0]

        def inner(state: Any) -> Any:
            import jax

            if not isinstance(state, jax.core.Tracer):
                calls[0] += 1
                if calls[0] == 4:
                    raise KeyboardInterrupt
            return advance(state)

        return inner

    bec.chunked = interrupting
    try:
        first = _bec(killed, mesh, "steps=200")
    finally:
        bec.chunked = original
    ok = first == 130 and _bec(killed, mesh, "steps=200") == 0 and _same_run(killed, straight)
    record("sharded run (mesh=8) interrupted inside chunk 4", ok, "resumes from the step-150 checkpoint, bit for bit")


def checkpoint_faults(tmp: str, record: Record) -> None:
    """A checksum file lost after Orbax's commit, templates of another dtype or structure, a stray step."""
    d = os.path.join(tmp, "ck")
    with Checkpointer(d) as ck:
        for s in (1, 2):
            ck.save(s, {"x": jnp.full(8, s, jnp.float32)})
    os.remove(os.path.join(d, "2", CHECKSUM_FILE))
    with Checkpointer(d) as ck:
        step, _, _ = ck.restore({"x": jnp.zeros(8, jnp.float32)})
    record("kill between Orbax's commit and the checksum file", step == 2, "checksums committed with the step")
    for what, template in (("dtype", {"x": jnp.zeros(8, jnp.int32)}), ("structure", {"y": jnp.zeros(8)})):
        try:
            with Checkpointer(d) as ck:
                ck.restore(template)
            refused = False
        except ValueError as e:
            refused = "checkpoint itself is fine" in str(e)
        kept = not os.path.exists(d + ".bad") and sorted(os.listdir(d)).count("2") == 1
        record(f"restore into a template of another {what}", refused and kept, "the template's fault; nothing moved")

    with Checkpointer(os.path.join(tmp, "stray", "ckpt"), save_every=10) as ck:
        run_chunked(
            lambda x: (x + 1, x[None]), jnp.zeros(1), n_chunks=2, steps_per_chunk=10, checkpointer=ck, progress=False
        )
        ck.save(25, {"state": jnp.zeros(1), "history": jnp.zeros((2, 1))}, force=True)
    with (
        Checkpointer(os.path.join(tmp, "stray", "ckpt"), save_every=10) as ck,
        contextlib.redirect_stderr(io.StringIO()),
    ):
        res = run_chunked(
            lambda x: (x + 1, x[None]), jnp.zeros(1), n_chunks=4, steps_per_chunk=10, checkpointer=ck, progress=False
        )
    record("a stray step off the schedule (25 of chunks of 10)", res.resumed_from == 20, "skipped with a warning")


def run_folder_faults(tmp: str, record: Record) -> None:
    """Another configuration's checkpoint copied in, a second writer, a full disk."""
    a, b = os.path.join(tmp, "cfg_a"), os.path.join(tmp, "cfg_b")
    _main(["--out", a, "--set", "rate=2.0"])
    _main(["--out", b, "--set", "steps=2"])
    shutil.rmtree(os.path.join(b, "ckpt"))
    shutil.copytree(os.path.join(a, "ckpt"), os.path.join(b, "ckpt"))
    status, err = _main(["--out", b, "--set", "steps=6"])
    record("another configuration's checkpoint copied in", status == 2 and "['rate']" in err, "refused naming keys")

    run = os.path.join(tmp, "locked")
    _main(["--out", run])
    with open(os.path.join(run, ".lock"), "a") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the run ended
            freed = True
        except BlockingIOError:
            freed = False
        status, err = _main(["--out", run, "--set", "steps=6"])
        try:
            Checkpointer(os.path.join(run, "ckpt"))
            api_refused = False
        except ValueError:
            api_refused = True
    record(
        "a finished run in a live process, then a second writer",
        freed and status == 2 and api_refused,
        "the lock is released when the run ends; CLI and API writers are refused while it is held",
    )

    def full(path: Any, array: Any) -> str:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    global save_npy
    kept_save, save_npy = save_npy, full
    try:
        status, err = _main(["--out", os.path.join(tmp, "full")])
    finally:
        save_npy = kept_save
    record(
        "a full disk while writing the outputs",
        status == 1 and "\n" not in err and "resumes" in err,
        "one line naming the path, saying that rerunning resumes",
    )


def hostile_files(tmp: str) -> list[dict[str, Any]]:
    """Every hostile file tried, with whether it was refused in one line naming it (or, for a link where an output
    is written, replaced without its target being written)."""
    out: list[dict[str, Any]] = []
    os.makedirs(tmp)
    victim = os.path.join(tmp, "victim")

    def fresh(name: str) -> str:
        with open(victim, "wb") as f:
            f.write(b"precious")
        d = os.path.join(tmp, name)
        os.makedirs(d)
        return d

    for link in (".lock", "run.zarr", "ckpt"):
        d = fresh("link" + link.replace(".", "_"))
        os.symlink(victim, os.path.join(d, link))
        status, err = _main(["--out", d])
        out.append({"file": f"{link} a symbolic link", "refused_in_one_line": _one_line(status, err, link)})
    d = fresh("link_step")
    _main(["--out", d])
    os.makedirs(victim + "_folder", exist_ok=True)
    os.symlink(victim + "_folder", os.path.join(d, "ckpt", "1"))
    status, err = _main(["--out", d, "--set", "steps=6"])
    ok = _one_line(status, err, os.path.join("ckpt", "1")) and os.path.isdir(victim + "_folder")
    out.append({"file": "ckpt/1 a symbolic link to a folder elsewhere", "refused_in_one_line": ok})
    for link in ("final_state.npy", "config.json", "settings.json"):
        d = fresh("out_" + link.replace(".", "_"))
        os.symlink(victim, os.path.join(d, link))
        status, _ = _main(["--out", d])
        untouched = open(victim, "rb").read() == b"precious" and not os.path.islink(os.path.join(d, link))
        out.append(
            {
                "file": f"{link} a symbolic link",
                "refused_in_one_line": status == 0 and untouched,
                "how": "replaced by the run's file; the target untouched",
            }
        )
    for i, text in enumerate([b"[1, 2]", b"{trunc", b"\xff", b"[" * 100_000]):
        d = fresh(f"config_json{i}")
        _main(["--out", d])
        path = os.path.join(d, "config.json")
        with open(path, "wb") as f:
            f.write(text)
        status, err = _main(["--out", d])
        ok = _one_line(status, err, path)
        out.append({"file": f"run folder config.json: {text[:12]!r}", "refused_in_one_line": ok})
    for name, content in (("deep.json", "[" * 100_000), ("deep.toml", "a = " + "[" * 100_000), ("list.json", "[1]")):
        path = os.path.join(tmp, name)
        with open(path, "w") as fh:
            fh.write(content)
        try:
            load_config(CountConfig, path)
            line = ""
        except ValueError as e:
            line = str(e)
        out.append({"file": f"config file {name}", "refused_in_one_line": "\n" not in line and path in line})
    for array in ("value", "time"):
        d = fresh(f"huge_{array}")
        _main(["--out", d])
        meta = declare_huge(d, array)
        status, err = _main(["--out", d, "--set", "steps=6"])
        out.append(
            {
                "file": f"run.zarr/{array}/zarr.json declaring {HUGE_RECORDS} records",
                "refused_in_one_line": _one_line(status, err, meta),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "hostile_inputs.json"))
    ap.add_argument("--probe-huge", metavar="DIR", help=argparse.SUPPRESS)  # the fresh process of the huge probe
    args = ap.parse_args(argv)
    if args.probe_huge:
        print(json.dumps(probe_huge(args.probe_huge)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        done = faults(os.path.join(tmp, "faults"))
        files = hostile_files(os.path.join(tmp, "files"))
        probe = subprocess.run(
            [sys.executable, "-m", "ivhl_jax.bench.hostile_inputs", "--probe-huge", os.path.join(tmp, "probe")],
            capture_output=True,
            text=True,
            check=True,
        )
        largest = json.loads(probe.stdout.strip().splitlines()[-1])
    doc = {
        "faults": {"tried": len(done), "survived": sum(f["survived"] for f in done), "each": done},
        "hostile_files": {
            "tried": len(files),
            "refused_in_one_line": sum(f["refused_in_one_line"] for f in files),
            "each": files,
        },
        "largest_declared_shape": largest,
    }
    print(
        f"faults survived {doc['faults']['survived']}/{doc['faults']['tried']}; hostile files refused in one "
        f"line {doc['hostile_files']['refused_in_one_line']}/{doc['hostile_files']['tried']}; a store declaring "
        f"{HUGE_RECORDS} records refused in {largest['seconds_to_refuse']:.2f} s, peak memory +"
        f"{largest['peak_rss_growth_mib']:.1f} MiB"
    )
    write_results(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
