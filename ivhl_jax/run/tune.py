"""``ivhl tune``: measure this machine's best settings and store them in the tuning cache; :func:`apply` puts the
measured XLA flags in force.

For every registered tuning area (:mod:`ivhl_jax.core.tunables`: the families register their own kernels —
``fields``, ``gp`` and ``cdt`` in :mod:`ivhl_jax.physics.tunables`, ``attention`` in :mod:`ivhl_jax.nn.tunables`,
``transformer`` in ``ivhl_jax.models.tunables``) the candidates are compiled, their outputs checked against the
table default's output (a candidate whose output differs is dropped and recorded as such), then timed in
interleaved rounds (:func:`ivhl_jax.run.measure.interleaved_rounds`: one call of every candidate per round, so
load changes on a shared host hit all alike). The winner (smallest median per-round ratio) is stored with every
candidate's median, IQR and samples in the per-machine cache (:mod:`ivhl_jax.core.tuning_cache`), which
:func:`ivhl_jax.core.backend.defaults` reads before the table. A race with one runnable candidate measures nothing
and records nothing.

The ``xla`` area is this module's own: XLA compiler flags (:data:`~ivhl_jax.core.tuning_cache.XLA_FLAG_CANDIDATES`),
each configuration in its own worker process (flags are read when a backend starts), the workers driven in turn
round by round over the registered workloads (the field kernel and a GP run), outputs compared. A flag that pays
is put in force by :func:`apply` in later processes: the ``ivhl`` command calls it first; a script calls it
before its first JAX computation::

    import ivhl_jax.run.tune
    ivhl_jax.run.tune.apply()      # before anything starts JAX's backend

Every area also reports each kernel as a fraction of this machine's limits, measured on the spot
(:func:`ivhl_jax.run.measure.measure_limits`) against the bytes and flops of the compiled program.

``--quick`` uses one or two sizes per area (under 5 minutes on a 2-core CPU); ``IVHL_TUNE_TINY=1`` shrinks every
size to seconds (tests only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ivhl_jax.core import backend, host, tunables, tuning_cache
from ivhl_jax.core.tunables import Candidate
from ivhl_jax.run import measure

__all__ = ["apply", "Session", "area_names", "check_areas", "choose", "tune", "tune_op", "parser", "main"]

_VECTOR_FLAG = "--xla_cpu_prefer_vector_width=512"
assert _VECTOR_FLAG in tuning_cache.XLA_FLAG_CANDIDATES


# ------------------------------------------------------------------------------------------ applying
def apply() -> dict[str, Any]:
    """Put this machine's measured XLA flags in force (``XLA_FLAGS``) and, under ``IVHL_TUNING=auto``, arm tuning
    on the fly; returns what was done (:func:`ivhl_jax.core.tuning_cache.applied_xla_flags` reports it later).

    Call it before the first JAX computation (XLA reads its flags when a backend starts); the ``ivhl`` command
    calls it first. After a backend started the flags cannot act: a :class:`~ivhl_jax.core.tuning_cache.
    TuningCacheWarning` says so and nothing is set. A flag the user already set (any value) is left alone; only
    the tuner's own candidates are ever applied (:func:`ivhl_jax.core.tuning_cache.measured_xla_flags`); nothing
    happens under ``IVHL_TUNING=frozen``."""
    if tuning_cache.mode() == "auto":
        tuning_cache.set_auto_tuner(tune_op)
        print(
            "ivhl_jax: IVHL_TUNING=auto: an op meeting a problem size not measured on this machine is tuned first "
            "(seconds, once; IVHL_TUNING=frozen uses the backend table alone)",
            file=sys.stderr,
        )
    found = tuning_cache.measured_xla_flags()
    if not found or not found["flags"]:
        done = {**found, "applied": False, "why": "no candidate flag paid here: XLA's defaults"} if found else {}
        tuning_cache.record_applied(done)
        return done
    if backend.started():
        done = {**found, "applied": False, "why": "a JAX backend had started before ivhl_jax.run.tune.apply()"}
        tuning_cache.record_applied(done)
        warnings.warn(
            f"the measured XLA flags {' '.join(found['flags'])} ({found['file']}) are not applied: a JAX backend "
            "has started; call ivhl_jax.run.tune.apply() before the first JAX computation",
            tuning_cache.TuningCacheWarning,
            stacklevel=2,
        )
        return done
    current = os.environ.get("XLA_FLAGS", "")
    new = [f for f in found["flags"] if f.split("=")[0] not in current]
    if new:
        os.environ["XLA_FLAGS"] = (current + " " + " ".join(new)).strip()
    done = {**found, "applied": True}
    tuning_cache.record_applied(done)
    return done


# ------------------------------------------------------------------------------------------ choosing
def _equal(out: Any, ref: Any, rtol: float) -> tuple[bool, float]:
    import jax

    a = [np.asarray(x) for x in jax.tree.leaves(out)]
    b = [np.asarray(x) for x in jax.tree.leaves(ref)]
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return False, float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        diff = float(np.max(np.abs(x.astype(np.complex128) - y.astype(np.complex128)))) if y.size else 0.0
        worst = max(worst, diff / max(scale, 1e-30))
    return worst <= rtol, worst


def _build_and_check(
    candidates: Sequence[Candidate], rtol: float, check: Callable[[Any], str | None] | None
) -> tuple[dict[str, tuple[Any, tuple]], dict[str, dict[str, Any]]]:
    """Compile every candidate (the default first) and check its output; returns (the valid ones' compiled calls,
    the report of all)."""
    import jax

    built: dict[str, tuple[Any, tuple]] = {}
    report: dict[str, dict[str, Any]] = {}
    ref = None
    for cand in sorted(candidates, key=lambda c: not c.default):
        try:
            t0 = time.perf_counter()
            compiled, args = cand.build()
            out = jax.block_until_ready(compiled(*args))
            rec: dict[str, Any] = {"settings": cand.settings, "compile_and_first_call_s": time.perf_counter() - t0}
        except Exception as e:  # noqa: BLE001 - a candidate that cannot run here is recorded, not fatal
            report[cand.name] = {"settings": cand.settings, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        if check is not None:
            why = check(out)
            ok, err = why is None, None
            if why:
                rec["rejected"] = why
        elif ref is None:
            ref, ok, err = out, True, 0.0
        else:
            ok, err = _equal(out, ref, rtol)
            if not ok:
                rec["rejected"] = f"output differs from the default's by {err:.2e} (relative, > {rtol:g})"
        rec["max_rel_diff_vs_default"] = err
        report[cand.name] = rec
        if ok:
            built[cand.name] = (compiled, args)
    return built, report


def _block(compiled: Any, args: tuple) -> Any:
    import jax

    return jax.block_until_ready(compiled(*args))


def choose(
    op: str,
    size: int | None,
    candidates: Sequence[Candidate],
    *,
    rounds: int,
    limits: Mapping[str, Any],
    rtol: float = 1e-4,
    check: Callable[[Any], str | None] | None = None,
    dtype: str = "f32",
    params: Mapping[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Compile every candidate, check its output (against the default's with ``rtol``, or with ``check(out)``
    returning None if valid or why not), time the valid ones in ``rounds`` interleaved rounds, and return the
    cache entry: the winner (smallest median per-round time ratio to the default), its settings, every
    candidate's median/IQR/samples and per-round ratio to the winner, the spread and the roofline.

    Fewer than two valid candidates is a RuntimeError: a race of one measures nothing, and a cache entry of it
    would pin that candidate on a machine where the others may later run (numba or ducc0 installed later)."""

    built, report = _build_and_check(candidates, rtol, check)
    if len(built) < 2:
        raise RuntimeError(
            f"{op}: {len(built)} candidate(s) ran correctly here, a race needs two; nothing recorded: "
            f"{json.dumps(report, default=str)[:400]}"
        )
    calls: dict[str, Callable[[], Any]] = {name: functools.partial(_block, c, a) for name, (c, a) in built.items()}
    for call in calls.values():
        call()
    wall, _ = measure.interleaved_rounds(calls, rounds)
    for name, samples in wall.items():
        report[name].update(measure.summarize(samples))
    # The winner: the smallest median of per-round ratios to the reference candidate (the table default). Within a
    # round every candidate meets the same load, so the ratio is steadier than either time on a shared host.
    anchor = np.asarray(wall[next(iter(wall))])
    ratio = {n: float(np.median(np.asarray(s) / anchor)) for n, s in wall.items()}
    best = min(wall, key=lambda n: (ratio[n], report[n]["median_s"]))
    for name, samples in wall.items():
        report[name]["over_best_per_round_median"] = float(np.median(np.asarray(samples) / np.asarray(wall[best])))
    default = next((c.name for c in candidates if c.default and c.name in wall), None)
    entry: dict[str, Any] = {
        "op": op,
        "bucket": tuning_cache.bucket(size),
        "size": size,
        "params": dict(params or {}),
        "winner": best,
        "settings": next(c.settings for c in candidates if c.name == best),
        "median_s": report[best]["median_s"],
        "iqr_s": report[best]["iqr_s"],
        "spread": report[best]["iqr_s"] / report[best]["median_s"],
        "rounds": rounds,
        "candidates": report,
    }
    if default is not None:
        entry["default"] = default
        entry["table_default_over_best"] = report[default]["over_best_per_round_median"]
    entry["roofline"] = measure.roofline(built[best][0], report[best]["median_s"], limits, dtype=dtype)
    frac = entry["roofline"]["fraction"]
    log(
        f"  {op} [{entry['bucket']}]: {best} {1e3 * entry['median_s']:.3f} ms (IQR {100 * entry['spread']:.0f} %)"
        + (f"; table default {default} x{entry['table_default_over_best']:.2f}" if default else "")
        + (f"; {100 * frac:.1f} % of the {entry['roofline']['bound']} roofline" if frac is not None else "")
    )
    return entry


@contextlib.contextmanager
def _mode(value: str) -> Iterator[None]:
    saved = os.environ.get("IVHL_TUNING")
    os.environ["IVHL_TUNING"] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("IVHL_TUNING", None)
        else:
            os.environ["IVHL_TUNING"] = saved


_TABLE_FIELDS = frozenset(f.name for f in dataclasses.fields(backend.Defaults))


@dataclasses.dataclass
class Session:
    """One tuning run (:class:`ivhl_jax.core.tunables.Tuner`): what every area's function is handed."""

    quick: bool = True
    tiny: bool = False
    verify: bool = False
    limits: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    notes: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    area: str = ""

    def log(self, msg: str) -> None:
        print(f"[tune] {msg}", flush=True)

    def note(self, msg: str) -> None:
        """Something an area left out or could not measure here, and why: on the console and in ``notes``."""
        self.notes.setdefault(self.area, []).append(msg)
        self.log(f"{self.area}: {msg}")

    def aot(
        self, fn: Callable, *args: Any, settings: Mapping[str, Any] | None = None, cached: bool = False
    ) -> tuple[Any, tuple]:
        """Compile ``fn(*args)`` under the table row plus ``settings`` (table fields; other knobs are the
        candidate's own build arguments), or with ``cached`` under this machine's tuning cache (what a call with
        no settings gets)."""
        import jax

        table = {k: v for k, v in (settings or {}).items() if k in _TABLE_FIELDS}
        with _mode("cache" if cached else "frozen"), backend.override(**table):
            # a fresh function per candidate: jax.jit caches traces per function object, and the settings act at trace
            return jax.jit(lambda *a: fn(*a)).lower(*args).compile(), args

    def choose(self, op: str, size: int | None, candidates: Sequence[Candidate], **options: Any) -> dict[str, Any]:
        """:func:`choose` against this session's limits, logging to its console (options: ``rounds``, ``rtol``,
        ``check``, ``dtype``, ``params``)."""
        return choose(op, size, candidates, limits=self.limits, log=self.log, **options)


# ------------------------------------------------------------------------------------------ xla flags
_FLAG_WORKER = r"""
import json, sys, time
import numpy as np
import jax
from ivhl_jax.core import tunables
tiny = sys.argv[2] == "1"
calls = {}
for name, build in tunables.workloads().items():
    fn, args = build(tiny)
    calls[name] = (jax.jit(fn).lower(*args).compile(), args)
np.savez(sys.argv[1], **{k: np.asarray(f(*a)) for k, (f, a) in calls.items()})
print(json.dumps({"ready": list(calls)}), flush=True)
for line in sys.stdin:
    if line.strip() != "round":
        break
    times = {}
    for k, (f, a) in calls.items():
        t0 = time.perf_counter(); jax.block_until_ready(f(*a)); times[k] = time.perf_counter() - t0
    print(json.dumps(times), flush=True)
"""


def _flag_workers(s: Session, configs: Mapping[str, str], rounds: int) -> tuple[dict, dict]:
    """Run one worker per flag configuration, drive them in turn for ``rounds`` (+1 warm-up) rounds; returns
    (outputs per configuration, wall times per configuration and workload)."""
    arrays: dict[str, Any] = {}
    wall: dict[str, dict[str, list[float]]] = {name: {} for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}
        try:
            for name, flags in configs.items():
                s.log(f"xla: starting a worker with XLA_FLAGS={flags!r} ...")
                env = {**os.environ, "XLA_FLAGS": flags, "IVHL_TUNING": "frozen"}
                procs[name] = subprocess.Popen(
                    [sys.executable, "-c", _FLAG_WORKER, os.path.join(tmp, name + ".npz"), "1" if s.tiny else "0"],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            for name, proc in procs.items():
                line = proc.stdout.readline() if proc.stdout else ""
                if not line:
                    raise RuntimeError(f"xla worker {name} failed: {proc.communicate(timeout=60)[1].strip()[-400:]}")
                with np.load(os.path.join(tmp, name + ".npz")) as z:
                    arrays[name] = {k: z[k] for k in z.files}
            s.log(f"xla: {rounds} interleaved rounds ...")
            for _ in range(rounds + 1):  # the first round warms up
                for name, proc in procs.items():
                    time.sleep(0.005)
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write("round\n")
                    proc.stdin.flush()
                    for k, v in json.loads(proc.stdout.readline()).items():
                        wall[name].setdefault(k, []).append(v)
        finally:
            for proc in procs.values():
                with contextlib.suppress(Exception):
                    proc.communicate(input="quit\n", timeout=60)
    return arrays, wall


def tune_xla(s: Session) -> dict[str, dict[str, Any]]:
    """XLA:CPU flags: one worker process per configuration (flags are read at backend start), the two driven in
    turn round by round (one call of each registered workload per round), outputs compared to the default
    configuration's. A flag is kept when the workloads' per-round time ratios (flag / default, median per
    workload) have a geometric mean below 0.95 and none is above 1.05 (it pays and slows nothing down). Without
    AVX-512 there is no candidate flag: nothing is raced and nothing recorded."""
    if "avx512f" not in host.facts().cpu_flags:
        s.note("no AVX-512 on this CPU: XLA's default vector width is the only candidate, nothing to race")
        return {}
    base = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_cpu_prefer_vector"))
    configs = {"xla_default": base, "vector_width_512": (base + " " + _VECTOR_FLAG).strip()}
    rounds = 3 if s.tiny else 15
    arrays, wall = _flag_workers(s, configs, rounds)
    rejected = {}
    for name in configs:
        for k, ref in arrays["xla_default"].items():
            ok, err = _equal(arrays[name][k], ref, 1e-4)
            if not ok:
                rejected[name] = f"{k} differs from XLA's default by {err:.2e}"
    ratios = {
        k: float(np.median(np.asarray(wall["vector_width_512"][k][1:]) / np.asarray(wall["xla_default"][k][1:])))
        for k in wall["xla_default"]
    }
    geo = float(np.exp(np.mean(np.log(list(ratios.values())))))
    pays = "vector_width_512" not in rejected and geo < 0.95 and all(r < 1.05 for r in ratios.values())
    winner = "vector_width_512" if pays else "xla_default"
    shown = {k: round(v, 3) for k, v in ratios.items()}
    s.log(f"  xla flags: {_VECTOR_FLAG} per-round time ratio {shown} -> {winner}")
    candidates = {
        name: {
            "xla_flags": flags,
            **{k: measure.summarize(v[1:]) for k, v in wall[name].items()},
            **({"rejected": rejected[name]} if name in rejected else {}),
        }
        for name, flags in configs.items()
    }
    return {
        "xla.flags|all": {
            "op": "xla.flags",
            "bucket": "all",
            "winner": winner,
            "rounds": rounds,
            "settings": {"xla_flags": _VECTOR_FLAG if pays else ""},
            "candidates": candidates,
            "ratio_flag_over_default_per_round_median": ratios,
            "geometric_mean_ratio": geo,
            "rule": "kept when the per-round time ratios (flag / default; median per kernel) have a geometric mean "
            "below 0.95 and none is above 1.05",
        }
    }


# ------------------------------------------------------------------------------------------ driver
def area_names(quick: bool = False) -> list[str]:
    """The areas in running order: ``xla`` first, then the registered ones (``quick``: those ``--quick`` runs)."""
    return ["xla"] + [a.name for a in tunables.areas().values() if a.quick or not quick]


def check_areas(only: Sequence[str] | None, quick: bool) -> list[str]:
    """The areas to run, in order; an unknown name is a one-line ValueError naming it and the choices."""
    if not only:
        return area_names(quick)
    names = [a.strip() for item in only for a in str(item).split(",") if a.strip()]
    known = area_names()
    unknown = [a for a in names if a not in known]
    if unknown:
        raise ValueError(
            f"unknown tuning area(s) {unknown}; choose from {', '.join(known)} (the transformer area registers with "
            "`import ivhl_jax.models.tunables`, which the ivhl command does)"
        )
    return [a for a in known if a in names]


def _load_warning(s: Session) -> None:
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # not available on this system
        return
    cores = host.facts().machine_cores
    if load > cores:
        s.area = "load"
        s.note(
            f"the host is busy (load average {load:.1f} on {cores} cores): timings are noisy and may pick a "
            "winner that only wins under load; rerun `ivhl tune` on a quiet host"
        )


def tune(
    only: Sequence[str] | None = None,
    *,
    quick: bool = True,
    save: bool = True,
    verify: bool = False,
) -> dict[str, Any]:
    """Tune the ``only`` areas (default: the quick set, or all without ``quick``) on this machine in this
    process; returns ``{"platform", "fingerprint", "limits", "entries", "errors", "notes", "wall_s"}`` and, with
    ``save``, merges the entries into the tuning cache (``cache`` is its path). The ``xla`` area runs its
    candidates in subprocesses; its result applies to processes started after it (:func:`apply`)."""
    import jax

    areas = check_areas(only, quick)
    s = Session(quick=quick, tiny=os.environ.get("IVHL_TUNE_TINY", "") == "1", verify=verify)
    platform = backend.platform()
    t0 = time.perf_counter()
    _load_warning(s)
    s.log(f"measuring this machine's limits ({platform}: {jax.devices()[0].device_kind}) ...")
    s.limits = measure.measure_limits(quick)
    s.log(
        f"  copy {s.limits['copy_gbps']:.1f} GB/s, matmul f32 {s.limits['matmul_f32_tflops']:.3f} TFLOP/s, "
        f"bf16 {s.limits['matmul_bf16_tflops']:.3f} TFLOP/s"
    )
    entries: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    registered = tunables.areas()
    command = " ".join(["ivhl tune"] + sys.argv[2:]) if sys.argv[1:2] == ["tune"] else "ivhl_jax.run.tune.tune"
    for area in areas:
        a0 = time.perf_counter()
        s.area = area
        try:
            if area == "xla":
                if platform != "cpu":
                    s.note("compiler-flag candidates exist for XLA:CPU only; skipped on this platform")
                    continue
                found = tune_xla(s)
            else:
                found = registered[area].run(s)
        except Exception as e:  # noqa: BLE001 - one area failing must not lose the others
            errors[area] = f"{type(e).__name__}: {str(e)[:300]}"
            s.log(f"{area}: not tuned ({errors[area]})")
            continue
        for entry in found.values():
            entry["command"] = command
            entry["area_wall_s"] = time.perf_counter() - a0
        entries.update(found)
        took = f"{area} done in {time.perf_counter() - a0:.0f} s (total {time.perf_counter() - t0:.0f} s)"
        if save and found:  # after every area: an interrupted run keeps what it measured
            s.log(f"{took}; stored in {tuning_cache.record(platform, found, limits=s.limits)}")
        else:
            s.log(took + ("" if found else "; nothing to record"))
    result: dict[str, Any] = {
        "platform": platform,
        "fingerprint": tuning_cache.fingerprint(platform),
        "limits": dict(s.limits),
        "entries": entries,
        "errors": errors,
        "notes": {a: list(n) for a, n in s.notes.items()},
        "wall_s": time.perf_counter() - t0,
    }
    if save and entries:
        result["cache"] = tuning_cache.cache_path(platform)
    return result


def tune_op(op: str, size: int, platform: str) -> None:
    """``IVHL_TUNING=auto``: tune one op at one size and store it (the ops a registered area tunes per size)."""
    area = next((a for a in tunables.areas().values() if op in a.ops and a.at_size is not None), None)
    if area is None or area.at_size is None:
        return
    limits = (tuning_cache.load(platform) or {}).get("limits") or measure.measure_limits(True)
    s = Session(quick=True, tiny=os.environ.get("IVHL_TUNE_TINY", "") == "1", limits=limits, area=area.name)
    tuning_cache.record(platform, area.at_size(s, op, size), limits=limits)


def parser():
    """The parser of ``ivhl tune`` (an unknown option or a bad value is one line and exit status 2)."""
    import argparse

    from ivhl_jax.run.config import OneLineArgumentParser

    p = OneLineArgumentParser(
        prog="ivhl tune",
        description="Measure this machine's best settings and store them in "
        "the tuning cache (read by ivhl_jax.core.backend.defaults before the table).",
    )
    p.add_argument("--quick", action="store_true", help="one or two sizes per area (under 5 min on a 2-core CPU)")
    p.add_argument(
        "--only", action="append", help=f"areas, comma-separated or repeated; from {', '.join(area_names())}"
    )
    p.add_argument("--export", help="also write the full result (limits, every candidate) to this JSON file")
    p.add_argument("--no-save", action="store_true", help="measure and print, store nothing")
    p.add_argument(
        "--verify",
        action="store_true",
        help="after tuning: time the call with no settings (the tuning "
        "cache in force) against every candidate again, storing nothing (implies --no-save)",
    )
    p.add_argument("--handoff", help=argparse.SUPPRESS)  # the parent's file for a child run: no table, no "wrote"
    return p


def _writable_cache() -> str | None:
    """None if the tuning cache folder can be written, else the one-line reason."""
    folder = tuning_cache.cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        writable = os.access(folder, os.W_OK)
    except OSError:
        writable = False
    if writable:
        return None
    return (
        f"the tuning cache folder {folder} is not writable; set IVHL_CACHE_DIR to a writable folder (the backend "
        "table stays in force)"
    )


def _continue_in_child(result: dict[str, Any], rest: Sequence[str], quick: bool) -> None:
    """Tune ``rest`` in a fresh process that starts with the measured XLA flags applied; merge its result."""
    fd, handoff = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, "-m", "ivhl_jax.cli", "tune", "--only", ",".join(rest), "--handoff", handoff]
    cmd += ["--quick"] if quick else []
    print("[tune] continuing in a fresh process with the measured XLA flags", flush=True)
    proc = subprocess.run(cmd, env=dict(os.environ))
    try:
        with open(handoff, encoding="utf-8") as f:
            child = json.load(f)
        result["entries"].update(child.get("entries", {}))
        result["errors"].update(child.get("errors", {}))
        result.setdefault("notes", {}).update(child.get("notes", {}))
        result["limits_child"] = child.get("limits")
        result["xla_flags_child"] = child.get("xla_flags")
    except (OSError, ValueError):
        result["errors"]["child"] = f"the tuning process exited with {proc.returncode}"
    finally:
        with contextlib.suppress(OSError):
            os.remove(handoff)


def main(argv: Sequence[str] | None = None) -> int:
    """``ivhl tune [--quick] [--only AREA[,AREA]] [--export FILE] [--no-save] [--verify]``."""
    a = parser().parse_args(argv)
    save = not (a.no_save or a.verify)
    try:
        areas = check_areas(a.only, a.quick)
    except ValueError as e:
        print(f"ivhl tune: {e}", file=sys.stderr)
        return 2
    why = _writable_cache() if save else None
    if why:
        print(f"ivhl tune: {why}", file=sys.stderr)
        return 2
    rest = [x for x in areas if x != "xla"]
    if "xla" in areas and rest and save:
        # Flags act at backend start: measure them first (in subprocesses), then tune the rest in a fresh process
        # that starts with the winning flags applied (the ivhl command applies them from the cache).
        result = tune(["xla"], quick=a.quick, save=save, verify=a.verify)
        _continue_in_child(result, rest, a.quick)
    else:
        result = tune(areas, quick=a.quick, save=save, verify=a.verify)
    result["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    if a.handoff:
        with open(a.handoff, "w", encoding="utf-8") as f:
            json.dump(result, f, default=str)
        return 1 if result["errors"] else 0
    _summary(result)
    if a.export:
        from ivhl_jax.run.provenance import write_results

        command = "ivhl tune " + " ".join(sys.argv[2:] if argv is None else argv)
        doc = {"fingerprint_of_this_machine": tuning_cache.host_fingerprint(), "loadavg": os.getloadavg(), **result}
        os.makedirs(os.path.dirname(os.path.abspath(a.export)), exist_ok=True)
        print(f"wrote {write_results(a.export, json.loads(json.dumps(doc, default=str)), command=command)}")
    return 1 if result["errors"] else 0


def _summary(result: Mapping[str, Any]) -> None:
    print(f"\n{'op [bucket]':<34} {'winner':<28} {'ms':>9} {'IQR':>5} {'table/best':>10} {'roofline':>9}")
    above = False
    for key, e in sorted(result["entries"].items()):
        ms = f"{1e3 * e['median_s']:.3f}" if "median_s" in e else "-"
        iqr = f"{100 * e['spread']:.0f}%" if "spread" in e else "-"
        ratio = f"{e['table_default_over_best']:.2f}" if "table_default_over_best" in e else "-"
        roof = e.get("roofline", {}).get("fraction")
        above = above or (roof is not None and roof > 1.0)
        shown = "-" if roof is None else f"{100 * roof:.1f}%" + ("*" if roof > 1.0 else "")
        print(f"{key:<34} {str(e.get('winner')):<28} {ms:>9} {iqr:>5} {ratio:>10} {shown:>9}")
    if above:
        print(f"* {measure.ABOVE_ONE}")
    for area, err in result["errors"].items():
        print(f"{area}: not tuned: {err}")
    for area, notes in result.get("notes", {}).items():
        for note in notes:
            print(f"{area}: note: {note}")


if __name__ == "__main__":
    sys.exit(main())
