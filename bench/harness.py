"""Benchmark harness: jitted vs op-by-op, compile time apart, peers in the same process, JSON out.

Method (the same for every op):
  * ``compile_s``: wall time of ``jax.jit(fn).lower(*args).compile()``.
  * jit: ``warmup`` untimed calls of the compiled function, then ``repeats`` timed calls, each
    ending in ``block_until_ready``; median and inter-quartile range reported, raw samples kept.
  * op-by-op: the same function under ``jax.disable_jit()`` (every primitive dispatched eagerly,
    the analogue of PyTorch eager). Slow cases take fewer samples (``max_eager_s`` budget).
  * peers (optional): zero-argument callables (NumPy, PyTorch eager, ``torch.compile``) built by
    the op's factory; timed in the same process, interleaved round by round with the jit calls, so
    ratios stay meaningful on a noisy host.

Ops register themselves in modules ``ivhl_jax.bench.ops_<area>`` via a dict
``OPS = {"name": factory}`` where ``factory(size) -> BenchCase``.

Every file under ``bench/results/`` is written by :func:`write_results`, which puts the
:func:`provenance` header first: the command that reproduces it, the git commit and whether the tree
was dirty, the date, the machine and the versions (``tests/contracts/test_results.py`` checks it).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

# the timing helpers and the results header live in the library (the tuner uses them too); bench code keeps
# reaching them here
from ivhl_jax.run.measure import calls_per_sample as calls_per_sample
from ivhl_jax.run.measure import interleaved_rounds as interleaved_rounds
from ivhl_jax.run.measure import summarize as summarize
from ivhl_jax.run.measure import time_in_windows as time_in_windows
from ivhl_jax.run.provenance import invocation as invocation
from ivhl_jax.run.provenance import provenance as provenance
from ivhl_jax.run.provenance import write_results as write_results

SIZES = ("small", "medium", "large", "extreme")


@dataclasses.dataclass
class BenchCase:
    """One benchmarked operation at one problem size.

    Attributes:
      op: op name (unique across the registry).
      size: one of :data:`SIZES`.
      fn: pure JAX function ``fn(*args)``; the harness jits it.
      args: positional arguments (arrays/pytrees) for ``fn``.
      params: problem description recorded in the JSON (shapes, counts, dtypes).
      flops: floating-point operations per call (for GFLOP/s); if None, XLA's cost analysis of the
        compiled program is used and the record says so.
      bytes_moved: bytes read + written per call, if known (for GB/s vs the bandwidth bound).
      peers: name -> builder; a builder is called once (setup, compile) and returns a zero-arg
        callable that runs the peer once and returns after its work is finished.
      op_by_op: whether to time the function with ``jax.disable_jit()``.
      items_per_call: work items per call (steps, samples, tokens) for a throughput figure.
      items_name: what the items are ("steps", "samples", ...).
      notes: free text stored in the JSON.
    """

    op: str
    size: str
    fn: Callable[..., Any]
    args: tuple
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    flops: float | None = None
    bytes_moved: float | None = None
    peers: dict[str, Callable[[], Callable[[], Any]]] = dataclasses.field(default_factory=dict)
    op_by_op: bool = True
    items_per_call: float | None = None
    items_name: str = "calls"
    notes: str = ""


def time_callable(
    call: Callable[[], Any], *, repeats: int = 5, warmup: int = 1, budget_s: float | None = None
) -> dict[str, Any]:
    """Time ``call()`` (which must block until its work is done) ``repeats`` times after ``warmup``.

    With ``budget_s``, stop early (at least one sample) once the samples exceed the budget.
    """
    for _ in range(warmup):
        call()
    samples: list[float] = []
    spent = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        dt = time.perf_counter() - t0
        samples.append(dt)
        spent += dt
        if budget_s is not None and spent > budget_s:
            break
    return summarize(samples)


def blocking_call(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    """A call of ``fn(*args)`` that waits for its result (``jax.block_until_ready``): a contestant of
    :func:`interleaved_rounds` or :func:`time_callable`, its arguments bound now (not a loop's last value)."""
    return lambda: jax.block_until_ready(fn(*args))


def median_ms(call: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``call()`` in milliseconds over ``repeats`` calls after one warm-up (compile apart):
    :func:`time_callable`'s median. ``call`` must block until its work is done."""
    return 1e3 * float(time_callable(call, repeats=repeats, warmup=1)["median_s"])


def run_checks(
    checks: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[dict[str, Any]], str]]],
) -> dict[str, Any]:
    """Run the named checks of a ``gpu_check`` in order: ``checks[name] = (run, line)``, ``run()`` returning the
    check's record and ``line(record)`` its one-line summary.

    A check that raises records ``{"error": "Type: message"}`` (the message cut to 300 characters) and the others
    still run (one failing, e.g. out of memory, must not hide the rest). Returns ``{"device": the first device,
    "results": {name: record}, "summary": [one line per check]}``.
    """
    doc: dict[str, Any] = {"device": str(jax.devices()[0]), "results": {}}
    summary = []
    for name, (run, line) in checks.items():
        try:
            rec = run()
            text = line(rec)
        except Exception as e:  # noqa: BLE001 - one check failing must not hide the others
            rec = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            text = f"{name}: {rec['error']}"
        doc["results"][name] = rec
        summary.append(text)
    doc["summary"] = summary
    return doc


def gpu_check_main(module: str, gpu_check: Callable[..., dict[str, Any]], argv: Sequence[str] | None = None) -> int:
    """The command line of a ``bench/ops_<area>.py`` GPU check: ``python -m ivhl_jax.bench.MODULE --out FILE
    [--quick]`` runs ``gpu_check(quick=...)`` on this device, writes it with :func:`write_results` (the command
    that made it first) and prints its summary lines."""
    import argparse

    prog = f"python -m ivhl_jax.bench.{module}"
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="CPU-sized (seconds)")
    args = list(sys.argv[1:] if argv is None else argv)
    a = p.parse_args(args)
    doc = gpu_check(quick=a.quick)
    write_results(a.out, doc, command=" ".join([prog, *args]))
    print("\n".join(doc["summary"]))
    return 0


def module_at(rev: str, path: str, name: str, folder: str) -> Any:
    """The module ``path`` (a file of this repository) as it is at git revision ``rev``, loaded under ``name``
    from a copy in ``folder``: another revision's kernels next to the current ones, timed in one process."""
    src = subprocess.run(["git", "show", f"{rev}:{path}"], check=True, capture_output=True, text=True).stdout
    file = os.path.join(folder, f"{name}.py")
    with open(file, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} of {rev} from {file}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses (flax structs) resolve their annotations through the module
    spec.loader.exec_module(mod)
    return mod


def before_after_setup(
    modules: Mapping[str, str], *, rounds: int, against_help: str = "the git revision to time against"
) -> tuple[Any, dict[str, Any]]:
    """The command line of a before/after study (``--against REV``, ``--rounds``, ``--out``) parsed, and each
    file of ``modules`` (``{name: path}``) as it is at ``--against``, loaded under ``name`` by :func:`module_at`."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--against", required=True, help=against_help)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    return a, {name: module_at(a.against, path, name, tmp) for name, path in modules.items()}


def before_after(wall: dict[str, list[float]], meta: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per key of ``meta``, from the rounds of :func:`interleaved_rounds` named ``"<key> old"`` and ``"<key> new"``:
    the two medians, the quartiles of the per-round ratios new/old, and ``meta[key]``."""
    out = {}
    for key in meta:
        o, w = np.asarray(wall[f"{key} old"]), np.asarray(wall[f"{key} new"])
        q1, q2, q3 = np.percentile(w / o, [25, 50, 75])
        out[key] = {
            "old_median_s": float(np.median(o)),
            "new_median_s": float(np.median(w)),
            "ratio_new_over_old_per_round": {"median": float(q2), "q1": float(q1), "q3": float(q3)},
            **meta[key],
        }
    return out


def before_after_study(
    calls: Mapping[str, Callable[..., Any]],
    meta: dict[str, dict[str, Any]],
    *,
    rounds: int,
    against: str,
    out: str | None,
) -> dict[str, dict[str, Any]]:
    """A same-process comparison with another revision, end to end: ``calls`` (``"<key> old"`` / ``"<key> new"``)
    timed in :func:`interleaved_rounds`, summarised by :func:`before_after`, each key's record printed, and with
    ``out`` written by :func:`write_results` (with ``against``, ``rounds`` and how to read the figures)."""
    wall, _ = interleaved_rounds(dict(calls), rounds)
    res = before_after(wall, meta)
    for key, rec in res.items():
        print(key, rec, flush=True)
    if out:
        doc = {
            "against": against,
            "rounds": rounds,
            "note": "shared 2-core host, other jobs running: per-round ratios (interleaved) are the comparable figure",
            "results": res,
        }
        write_results(out, doc)
    return res


MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "generated_code_size_in_bytes")


def memory_bytes(compiled: Any) -> dict[str, int]:
    """XLA's memory analysis of a compiled program: ``{field: bytes}`` for the fields of :data:`MEMORY_FIELDS`
    the backend reports; empty where it reports none (``memory_analysis()`` is backend-dependent and may
    return None)."""
    mem = compiled.memory_analysis()
    if mem is None:
        return {}
    return {k: int(getattr(mem, k)) for k in MEMORY_FIELDS if getattr(mem, k, None) is not None}


def _peer_calls(case: BenchCase, rec: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Each peer's call, built and called once (compile/trace for torch.compile); ``rec["peers"]`` records its
    setup time, or why it was skipped or failed (a failing peer must not hide our own numbers)."""
    calls: dict[str, Callable[[], Any]] = {}
    for name, build in case.peers.items():
        try:
            t0 = time.perf_counter()
            call = build()
            call()
            rec["peers"][name] = {"setup_s": time.perf_counter() - t0}
            calls[name] = call
        except ImportError as e:
            rec["peers"][name] = {"skipped": f"peer not installed ({e.name}); pip install '.[peers]'"}
        except Exception as e:  # noqa: BLE001
            rec["peers"][name] = {"error": repr(e)}
    return calls


def _peer_ratios(rec: dict[str, Any], samples: dict[str, list[float]]) -> None:
    """Each peer's summary next to the jitted call's: ratio of medians, per-round median ratio, best over best
    (> 1 means ivhl_jax (jit) is faster than the peer)."""
    med = rec["jit"]["median_s"]
    jit_samples = np.asarray(rec["jit"]["samples_s"])
    for name, s in samples.items():
        res = summarize(s)
        res["peer_over_jit"] = res["median_s"] / med
        res["peer_over_jit_per_round_median"] = float(np.median(np.asarray(s) / jit_samples))
        res["peer_over_jit_best"] = res["min_s"] / rec["jit"]["min_s"]
        rec["peers"][name].update(res)
    if not rec["peers"]:
        del rec["peers"]


def _xla_flops(compiled: Any) -> float | None:
    """XLA's own flop count of the compiled program (SVD/eigh included as XLA reports them), or None where the
    backend's cost analysis gives none."""
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return (float(cost.get("flops", 0.0)) or None) if cost is not None else None
    except Exception:  # noqa: BLE001 - cost analysis is backend-dependent; GFLOP/s is then omitted
        return None


def _rates(case: BenchCase, compiled: Any, rec: dict[str, Any]) -> None:
    """Flop, byte and item rates of the jitted call's median, XLA's cost record and its memory analysis."""
    from ivhl_jax.run.measure import cost_record

    med = rec["jit"]["median_s"]
    flops = case.flops
    if not flops:
        flops = _xla_flops(compiled)  # no analytic count given: XLA's count of the compile timed above
        if flops:
            rec["flops_source"] = "xla_cost_analysis"
    if flops:
        rec["flops_per_call"] = flops
        rec["gflops_per_s"] = flops / med / 1e9
    rec["cost"] = cost_record(compiled, med)  # XLA's flop and byte counts: a roofline against measured limits
    if case.bytes_moved:
        rec["gbytes_per_s"] = case.bytes_moved / med / 1e9
    if case.items_per_call:
        rec["throughput"] = {"items": case.items_name, "per_s": case.items_per_call / med}
    try:
        mem = memory_bytes(compiled)
        if mem:
            rec["memory"] = mem
    except Exception as e:  # noqa: BLE001 - memory analysis is backend-dependent; record why it is missing
        rec["memory"] = {"unavailable": repr(e)}


def run_case(
    case: BenchCase,
    *,
    repeats: int = 5,
    warmup: int = 1,
    max_eager_s: float = 20.0,
    peers: bool = True,
    pause_s: float = 0.005,
) -> dict[str, Any]:
    """Benchmark one case; returns a JSON-ready record.

    The jitted function and every peer are timed in interleaved rounds (one call of each per
    round, with a short pause between calls so the previous call's worker threads go idle): on a
    shared or drifting host, load changes then hit all contestants alike, and the per-round ratio
    peer/jit is reported next to the ratio of medians.
    """
    rec: dict[str, Any] = {"op": case.op, "size": case.size, "params": case.params, "notes": case.notes}
    jitted = jax.jit(case.fn)
    t0 = time.perf_counter()
    compiled = jitted.lower(*case.args).compile()
    rec["compile_s"] = time.perf_counter() - t0
    calls: dict[str, Callable[[], Any]] = {"jit": lambda: jax.block_until_ready(compiled(*case.args))}
    rec["peers"] = {}
    if peers:
        calls.update(_peer_calls(case, rec))
    for call in calls.values():
        for _ in range(warmup):
            call()
    rec["loadavg_start"] = os.getloadavg()
    samples, _ = interleaved_rounds(calls, repeats, pause_s=pause_s)
    rec["loadavg_end"] = os.getloadavg()
    rec["jit"] = summarize(samples.pop("jit"))
    _peer_ratios(rec, samples)
    _rates(case, compiled, rec)
    if case.op_by_op:

        def eager():
            with jax.disable_jit():
                jax.block_until_ready(case.fn(*case.args))

        rec["op_by_op"] = time_callable(eager, repeats=repeats, warmup=1, budget_s=max_eager_s)
        rec["speedup_jit_vs_op_by_op"] = rec["op_by_op"]["median_s"] / rec["jit"]["median_s"]
    else:
        rec["op_by_op"] = {"skipped": "op-by-op dispatch of this op is impractically slow at this size"}
    return rec


def registry() -> dict[str, Callable[[str], BenchCase]]:
    """All ops from modules ``ivhl_jax.bench.ops_*`` (name -> factory(size))."""
    import ivhl_jax.bench as pkg

    ops: dict[str, Callable[[str], BenchCase]] = {}
    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not mod.name.startswith("ops_"):
            continue
        module = importlib.import_module(f"ivhl_jax.bench.{mod.name}")
        for name, factory in getattr(module, "OPS", {}).items():
            if name in ops:
                raise RuntimeError(f"bench op {name!r} is registered twice (second in {mod.name})")
            ops[name] = factory
    return ops


def run(
    ops: Sequence[str] | None = None,
    sizes: Sequence[str] = ("small",),
    *,
    repeats: int = 5,
    warmup: int = 1,
    peers: bool = True,
    max_eager_s: float = 20.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the selected ops at the selected sizes; returns the full JSON document."""
    from ivhl_jax.run.device import device_report

    available = registry()
    names = list(available) if not ops else list(ops)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"unknown bench op(s) {unknown}; available: {sorted(available)}")
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        raise ValueError(f"size must be one of {list(SIZES)}, got {bad}")
    doc: dict[str, Any] = {
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": device_report(),
        "method": {
            "repeats": repeats,
            "warmup": warmup,
            "statistic": "median and IQR of wall time per call, block_until_ready",
        },
        "results": [],
    }
    said: set[str] = set()  # why peers were skipped, said once per run (the JSON records it per op)
    for size in sizes:
        for name in names:
            log(f"[bench] {name} ({size}) ...")
            try:
                case = available[name](size)
                rec = run_case(case, repeats=repeats, warmup=warmup, peers=peers, max_eager_s=max_eager_s)
            except Exception as e:
                rec = {"op": name, "size": size, "error": repr(e)}
                log(f"[bench]   FAILED: {e!r}")
            else:
                line = f"[bench]   jit {rec['jit']['median_s'] * 1e3:.3f} ms (compile {rec['compile_s']:.2f} s)"
                if "speedup_jit_vs_op_by_op" in rec:
                    line += f", op-by-op {rec['op_by_op']['median_s'] * 1e3:.3f} ms"
                for pname, p in rec.get("peers", {}).items():
                    if "median_s" in p:
                        line += f", {pname} {p['median_s'] * 1e3:.3f} ms (x{p['peer_over_jit']:.2f})"
                log(line)
                for pname, p in rec.get("peers", {}).items():
                    if "skipped" in p and p["skipped"] not in said:
                        said.add(p["skipped"])
                        log(f"[bench]   {pname} and every peer that needs the same package skipped: {p['skipped']}")
            doc["results"].append(rec)
    return doc
