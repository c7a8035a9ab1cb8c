"""Host memory over many checkpoint saves: does a long run's resident memory grow with each save?

    python -m ivhl_jax.bench.checkpoint_soak [--saves 10000] [--seconds 300] [--async-save] [--dir /dev/shm]

One :class:`ivhl_jax.train.checkpoint.Checkpointer` (``keep=3``, the default) saves a tiny state (a float32
vector of 16 and a step counter, with the run's metadata, as a run's checkpoints carry) ``--saves`` times, or as
many as fit in ``--seconds``; the process's resident set size (``VmRSS`` of ``/proc/self/status``) is sampled every
``--every`` saves. The first ``--warmup`` saves (Orbax's and JAX's one-time setup) are left out of the fitted slope,
which is reported in KiB per save with its projection over 10⁴ saves. Orbax alone (``ocp.CheckpointManager``
with the same items and ``max_to_keep``, no Checkpointer around it) is measured the same way (``--orbax-only``), so
that growth can be told apart as the library's or Orbax's, and Orbax once more with its TensorStore I/O metrics
query (``get_tensorstore_raw_bytes``, called around every array save) replaced by a constant inside this script
only (``--attribute``), with the TensorStore call alone repeated as the smallest reproducer. ``--dir`` puts the
checkpoints in another folder (a tmpfs such as ``/dev/shm`` makes each save cheap: the question is the growth per
save, not the disk). Results: ``bench/results/checkpoint_soak.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402 - after the platform the run depends on
import gc  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ivhl_jax.bench.harness import write_results  # noqa: E402
from ivhl_jax.train.checkpoint import Checkpointer  # noqa: E402


def rss_kib() -> int:
    """The resident set size of this process in KiB (Linux ``/proc/self/status``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status (this measurement needs Linux)")


def soak(save: Callable[[int], Any], saves: int, seconds: float, every: int, warmup: int) -> dict[str, Any]:
    """Call ``save(step)`` for steps 1..saves (or until ``seconds`` pass); RSS sampled every ``every`` saves."""
    samples: list[tuple[int, int]] = []
    t0 = time.perf_counter()
    done = 0
    try:
        for step in range(1, saves + 1):
            save(step)
            done = step
            if step % every == 0:
                gc.collect()
                samples.append((step, rss_kib()))
                if time.perf_counter() - t0 > seconds:
                    break
    except KeyboardInterrupt:  # Ctrl-C (SIGINT) ends the soak early: what was sampled is still fitted and written
        pass
    elapsed = time.perf_counter() - t0
    fit = [(s, r) for s, r in samples if s > warmup]
    slope = float(np.polyfit([s for s, _ in fit], [r for _, r in fit], 1)[0]) if len(fit) >= 2 else float("nan")
    return {
        "saves": done,
        "seconds": round(elapsed, 1),
        "saves_per_second": round(done / elapsed, 1),
        "rss_kib_first_sample": samples[0][1] if samples else None,
        "rss_kib_last_sample": samples[-1][1] if samples else None,
        "slope_kib_per_save_after_warmup": round(slope, 4),
        "projected_growth_mib_over_10000_saves": round(slope * 10_000 / 1024, 2),
        "samples_step_rss_kib": samples,
    }


def library(folder: str, async_save: bool) -> tuple[Callable[[int], Any], Callable[[], None]]:
    ck = Checkpointer(folder, keep=3, async_save=async_save, config={"steps": 10**9, "rate": 1.0})
    x = jnp.zeros(16, jnp.float32)

    def save(step: int) -> None:
        ck.save(step, {"x": x + step, "step": jnp.int32(step)}, metadata={"step": step, "energy": 1.0})

    return save, ck.close


def orbax_only(folder: str, async_save: bool) -> tuple[Callable[[int], Any], Callable[[], None]]:
    import orbax.checkpoint as ocp

    mngr = ocp.CheckpointManager(
        folder, options=ocp.CheckpointManagerOptions(max_to_keep=3, enable_async_checkpointing=async_save)
    )
    x = jnp.zeros(16, jnp.float32)

    def save(step: int) -> None:
        mngr.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave({"x": x + step, "step": jnp.int32(step)}),
                meta=ocp.args.JsonSave({"step": step, "energy": 1.0}),
            ),
        )

    def close() -> None:
        mngr.wait_until_finished()
        mngr.close()

    return save, close


def orbax_without_metrics(folder: str, async_save: bool) -> tuple[Callable[[int], Any], Callable[[], None]]:
    """Orbax alone with its TensorStore byte-count query made a constant: attributes the growth, changes no file."""
    from orbax.checkpoint._src.serialization import tensorstore_utils

    tensorstore_utils.get_tensorstore_raw_bytes = lambda *a, **k: 0  # this process only: a measurement, not a fix
    return orbax_only(folder, async_save)


def tensorstore_metrics_calls(calls: int) -> dict[str, Any]:
    """The smallest reproducer: after one tiny zarr write, repeat TensorStore's metrics query; RSS per call."""
    import tensorstore as ts

    with tempfile.TemporaryDirectory() as tmp:
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": tmp}}
        t = ts.open(spec, create=True, dtype=ts.float32, shape=[16]).result()
        t.write(np.arange(16, dtype=np.float32)).result()
    for _ in range(1000):
        ts.experimental_collect_matching_metrics("/tensorstore/kvstore/")
    gc.collect()
    before = rss_kib()
    for _ in range(calls):
        metrics = ts.experimental_collect_matching_metrics("/tensorstore/kvstore/")
    del metrics
    gc.collect()
    after = rss_kib()
    return {
        "calls": calls,
        "metrics_returned_per_call": len(ts.experimental_collect_matching_metrics("/tensorstore/kvstore/")),
        "rss_kib_before": before,
        "rss_kib_after": after,
        "kib_per_call": round((after - before) / calls, 3),
        "reproducer": (
            "t = ts.open({'driver': 'zarr3', 'kvstore': {'driver': 'file', 'path': d}}, create=True, "
            "dtype=ts.float32, shape=[16]).result(); t.write(np.arange(16, dtype=np.float32)).result(); "
            "then ts.experimental_collect_matching_metrics('/tensorstore/kvstore/') repeated; gc.collect(); "
            "VmRSS grows by kib_per_call per call"
        ),
    }


def findings(runs: dict[str, Any]) -> list[str]:
    """The notes of the results file, in words, from what was measured (nothing here is typed in by hand)."""
    out = []
    for name, r in runs.items():
        if "slope_kib_per_save_after_warmup" in r:
            out.append(
                f"{name}: {r['saves']} saves in {r['seconds']} s, {r['slope_kib_per_save_after_warmup']} KiB per save "
                f"after warm-up ({r['projected_growth_mib_over_10000_saves']} MiB over 10^4 saves)"
            )
    alone = runs.get("tensorstore_metrics_query_alone")
    if alone is not None:
        out.append(
            f"TensorStore's ts.experimental_collect_matching_metrics('/tensorstore/kvstore/') alone, after one tiny "
            f"zarr write, grows the process by {alone['kib_per_call']} KiB per call ({alone['calls']} calls, "
            f"{alone['metrics_returned_per_call']} metrics returned each). Orbax queries it around every array "
            "save (ts_utils.get_tensorstore_raw_bytes, for its raw-bytes I/O log line) and offers no setting that "
            "skips the query, so the library applies no workaround. Upstream reproducer: " + alone["reproducer"]
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saves", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=300.0, help="stop sampling after this long (per measurement)")
    ap.add_argument("--every", type=int, default=100, help="sample RSS every this many saves")
    ap.add_argument("--warmup", type=int, default=300, help="saves left out of the fitted slope")
    ap.add_argument("--async-save", action="store_true")
    ap.add_argument("--orbax-only", action="store_true", help="measure Orbax's CheckpointManager alone as well")
    ap.add_argument(
        "--attribute",
        action="store_true",
        help="also Orbax with its TensorStore metrics query made a constant, and that query alone",
    )
    ap.add_argument(
        "--compare-saves", type=int, default=None, help="saves of each Orbax-alone measurement (default: --saves)"
    )
    ap.add_argument(
        "--only", default=None, help="comma-separated names of the measurements to make (default: all asked for)"
    )
    ap.add_argument("--dir", default=None, help="folder for the checkpoints (default: the system's temporary folder)")
    ap.add_argument("--out", default="bench/results/checkpoint_soak.json")
    args = ap.parse_args(argv)
    runs: dict[str, Any] = {}
    makers: dict[str, Callable[[str, bool], tuple[Callable[[int], Any], Callable[[], None]]]] = {
        "checkpointer": library
    }
    if args.orbax_only or args.attribute:
        makers["orbax_checkpoint_manager"] = orbax_only
    if args.attribute:
        makers["orbax_without_tensorstore_metrics_query"] = orbax_without_metrics  # last: it patches Orbax
    if args.only:
        makers = {name: make for name, make in makers.items() if name in args.only.split(",")}
    doc = {
        "what": "host resident memory (VmRSS) over repeated checkpoint saves of a tiny state, keep=3",
        "checkpoint_folder": args.dir or tempfile.gettempdir(),
        "async_save": args.async_save,
        "saves_asked": args.saves,
        "compare_saves_asked": args.compare_saves or args.saves,
        "seconds_limit": args.seconds,
        "sample_every": args.every,
        "warmup_saves_left_out_of_slope": args.warmup,
        "runs": runs,
    }
    for name, make in makers.items():
        saves = args.saves if name == "checkpointer" else args.compare_saves or args.saves
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            save, close = make(os.path.join(tmp, "ckpt"), args.async_save)
            try:
                runs[name] = soak(save, saves, args.seconds, args.every, args.warmup)
            finally:
                close()
        r = runs[name]
        print(
            f"{name}: {r['saves']} saves in {r['seconds']} s, RSS {r['rss_kib_first_sample']} -> "
            f"{r['rss_kib_last_sample']} KiB, {r['slope_kib_per_save_after_warmup']} KiB/save after warm-up "
            f"({r['projected_growth_mib_over_10000_saves']} MiB over 10^4 saves)",
            flush=True,
        )
        doc["notes"] = findings(runs)
        write_results(args.out, doc)  # after each measurement: a long soak cut short keeps what it measured
    if args.attribute:
        runs["tensorstore_metrics_query_alone"] = tensorstore_metrics_calls(20_000)
        print("tensorstore metrics query alone:", runs["tensorstore_metrics_query_alone"]["kib_per_call"], "KiB/call")
    doc["notes"] = findings(runs)
    write_results(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
