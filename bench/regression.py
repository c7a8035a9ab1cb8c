"""This tree against the pre-redesign code (git c1a5c90): the same workloads, timed interleaved, new/old ratios.

The old package is also called ``ivhl_jax``, so each tree runs in its own long-lived worker subprocess
(``python bench/regression.py --worker ROOT``: an import hook maps ``ivhl_jax``, ``ivhl_jax.models`` and
``ivhl_jax.bench`` to ROOT's ``ivhl_jax/``, ``models/`` and ``bench/``, ahead of the editable install's
finder). The parent never imports JAX; it asks the two workers for timings alternately (old/new, then
new/old, ...), one round = one sample per tree, so a load change on the shared host hits both alike.

Per workload:

* ``first_call_s``: ``jax.clear_caches()``, then build, trace, compile and run once (what a fresh process
  pays; for ``*_api`` workloads the public function is called as a user would, without a user ``jit``);
* ``compile_s``: ``jax.jit(fn).lower(*args).compile()`` alone (jitted workloads only);
* steady state: per round, one untimed call (none for calls over 1 s), then ``reps`` timed calls
  (``block_until_ready``); the round's sample is their median (and, less sensitive to preemption on a
  busy host, their minimum). ``ratio`` = median over rounds of new/old, with its IQR (25-75 %);
  ``ratio_of_round_minima`` the same from the per-round minima.
* ``check``: the two trees' outputs from the identical inputs (max abs / relative difference), so the
  comparison is of the same work.

Workloads (each tree's own code; the bench ``OPS`` factories are line-for-line the same in both trees
apart from import paths): GP split-step 256² x 100 steps and 64³ x 10 steps through ``condensate.evolve``
under ``jit`` (plus the 2-D one called directly, ``gp_2d_api``), GFT ``gft_evolve`` 32³ x 10 steps
(``gft_step`` medium), ``fields.superpose`` medium (2048 points, 20 sources), ``tn.contract`` and one MERA
sweep at χ = 8 (``tn_contract``/``mera_sweep`` medium), the adaptive train chunk of the seed configuration
(``adaptive_train`` small: 20 fused steps, batch 32), the transformer train step (``small`` preset,
B = 4, T = 256). CDT is left out (the engine was rebuilt, not ported).

    .venv/bin/python -m ivhl_jax.bench.regression --rounds 21 --export bench/results/regression_vs_c1a5c90.json
    .venv/bin/python -m ivhl_jax.bench.regression --workloads gft_evolve --append --export ...  # redo one

Noise floor: ``--old-root .`` runs both workers on this tree (A/A; on the loaded 2-core host medians of
identical code differed by up to 1.3x at default threads); ``XLA_FLAGS="--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1"`` (inherited by the workers) removes the thread hand-offs that make
multi-threaded kernels sensitive to oversubscription and tightens the ratios several-fold.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.abc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

OLD_REV = "c1a5c90"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DT, G = 1e-3, 100.0
# Files other work is changing while this runs: their git status goes into the record.
WATCHED = ("models/transformer.py", "ivhl_jax/nn/attention.py", "ivhl_jax/physics/fields.py",
           "ivhl_jax/physics/condensate.py", "ivhl_jax/physics/gft.py", "ivhl_jax/physics/mera.py",
           "ivhl_jax/numerics/rollout.py", "ivhl_jax/numerics/fastmath.py", "ivhl_jax/train/training.py",
           "bench/ops_fields.py", "bench/ops_transformer.py", "bench/ops_condensate.py", "bench/ops_tn.py",
           "bench/ops_adaptive.py")

# name -> (kind, spec). kind "gp": (shape, steps, api); "op": (bench module, op, size).
WORKLOADS: dict[str, tuple[str, tuple]] = {
    "gp_2d": ("gp", ((256, 256), 100, False)),
    "gp_2d_api": ("gp", ((256, 256), 100, True)),
    "gp_3d": ("gp", ((64, 64, 64), 10, False)),
    "gft_evolve": ("op", ("ops_condensate", "gft_step", "medium")),
    "superpose": ("op", ("ops_fields", "superpose", "medium")),
    "tn_contract": ("op", ("ops_tn", "tn_contract", "medium")),
    "mera_sweep": ("op", ("ops_tn", "mera_sweep", "medium")),
    "adaptive_train": ("op", ("ops_adaptive", "adaptive_train", "small")),
    "transformer_train_step": ("op", ("ops_transformer", "transformer_train_step", "small")),
}
# --quick: the same code paths at small sizes (smoke test).
QUICK: dict[str, tuple[str, tuple]] = {
    "gp_2d": ("gp", ((32, 32), 5, False)),
    "gp_2d_api": ("gp", ((32, 32), 5, True)),
    "gp_3d": ("gp", ((8, 8, 8), 2, False)),
    "gft_evolve": ("op", ("ops_condensate", "gft_step", "small")),
    "superpose": ("op", ("ops_fields", "superpose", "small")),
    "tn_contract": ("op", ("ops_tn", "tn_contract", "small")),
    "mera_sweep": ("op", ("ops_tn", "mera_sweep", "small")),
}


# ------------------------------------------------------------------------------------------ worker side


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Resolves the top-level ``ivhl_jax`` packages to one source tree (old or new)."""

    def __init__(self, root: str):
        self.map = {"ivhl_jax": os.path.join(root, "ivhl_jax"), "ivhl_jax.models": os.path.join(root, "models"),
                    "ivhl_jax.bench": os.path.join(root, "bench"), "ivhl_jax.sims": os.path.join(root, "sims")}

    def find_spec(self, fullname, path=None, target=None):
        d = self.map.get(fullname)
        if d is None:
            return None
        return importlib.util.spec_from_file_location(fullname, os.path.join(d, "__init__.py"),
                                                      submodule_search_locations=[d])


def _zero_obs(state, params):  # module level: the new compile-once driver keys its cache on it
    del state, params
    import jax.numpy as jnp
    return jnp.zeros(())


def _build(kind: str, spec: tuple) -> dict[str, Any]:
    """Returns {"call": zero-arg blocking callable returning the output, "compiled": bool, "compile_s"}."""
    import jax

    if kind == "gp":
        try:
            from ivhl_jax.physics import condensate as C
        except ImportError:
            C = importlib.import_module("ivhl_jax.condensate")  # the old flat layout
        shape, steps, api = spec
        grid = C.Grid.uniform(shape, [0.1 * n for n in shape])  # dx = 0.1 as in bench/ops_condensate.py
        system = C.GPSystem(grid, C.harmonic(grid), G)
        psi = C.gaussian(grid)

        def fn(p):
            return C.evolve(p, system, DT, steps, steps, observe=_zero_obs)[0]

        args: tuple = (psi,)
        if api:
            return {"call": lambda: jax.block_until_ready(fn(psi)), "compile_s": None}
    else:
        mod, op, size = spec
        case = importlib.import_module(f"ivhl_jax.bench.{mod}").OPS[op](size)
        fn, args = case.fn, case.args
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    return {"call": lambda: jax.block_until_ready(compiled(*args)), "compile_s": compile_s}


def _save_output(out: Any, path: str) -> None:
    import jax

    leaves = jax.tree_util.tree_leaves(out)
    arrays: dict[str, Any] = {}
    for i, x in enumerate(leaves):
        try:
            arrays[f"a{i:04d}"] = np.asarray(x)
        except TypeError:  # typed PRNG keys
            arrays[f"a{i:04d}"] = np.asarray(jax.random.key_data(x))
    np.savez(path, *[arrays[k] for k in sorted(arrays)])  # saved as arr_0, arr_1, ... in leaf order


def _loaded_sources(root: str) -> dict[str, str]:
    """sha1 (12 hex) of the watched files this worker has imported (the version that ran, even mid-edit)."""
    import hashlib

    out = {}
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None) or ""
        rel = os.path.relpath(f, root) if f.startswith(root) else ""
        if rel in WATCHED:
            with open(f, "rb") as fh:
                out[rel] = hashlib.sha1(fh.read()).hexdigest()[:12]
    return out


def worker(root: str) -> None:
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout = sys.stderr  # library prints must not corrupt the protocol
    if sys.path and os.path.abspath(sys.path[0] or ".") == HERE:
        sys.path.pop(0)
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in str(getattr(f, "__module__", ""))]
    sys.meta_path.insert(0, _TreeFinder(root))
    import jax

    import ivhl_jax

    built: dict[str, dict[str, Any]] = {}
    reply.write(json.dumps({"ivhl_jax": ivhl_jax.__file__, "jax": jax.__version__}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req["cmd"]
        try:
            if cmd == "build":
                jax.clear_caches()
                t0 = time.perf_counter()
                b = _build(req["kind"], tuple(req["spec"]))
                out = b["call"]()
                first = time.perf_counter() - t0
                built[req["name"]] = b
                if req.get("out"):
                    _save_output(out, req["out"])
                res: dict[str, Any] = {"first_call_s": first, "compile_s": b["compile_s"],
                                       "sources": _loaded_sources(root)}
            elif cmd == "time":
                call = built[req["name"]]["call"]
                for _ in range(req.get("warmup", 1)):
                    call()
                samples = []
                for _ in range(req["reps"]):
                    t0 = time.perf_counter()
                    call()
                    samples.append(time.perf_counter() - t0)
                res = {"samples": samples}
            elif cmd == "drop":
                built.pop(req["name"], None)
                res = {}
            else:
                break
        except Exception as e:  # noqa: BLE001 - reported to the parent
            res = {"error": f"{type(e).__name__}: {e}"}
        reply.write(json.dumps(res) + "\n")


# ------------------------------------------------------------------------------------------ parent side


class Worker:
    def __init__(self, root: str, log):
        self.root = root
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", root],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     cwd=tempfile.gettempdir(), env={**os.environ, "PYTHONPATH": root})
        self.hello = self._read()
        if not self.hello["ivhl_jax"].startswith(os.path.join(root, "ivhl_jax")):
            raise RuntimeError(f"worker for {root} imported {self.hello['ivhl_jax']}")

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.root} died (see its stderr)")
        return json.loads(line)

    def ask(self, **req) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        res = self._read()
        if "error" in res:
            raise RuntimeError(f"{self.root}: {req}: {res['error']}")
        return res

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001
            self.proc.kill()


def compare(path_old: str, path_new: str) -> dict[str, Any]:
    a, b = np.load(path_old), np.load(path_new)
    ka, kb = sorted(a.files), sorted(b.files)
    if len(ka) != len(kb) or any(a[x].shape != b[y].shape for x, y in zip(ka, kb)):
        return {"same_structure": False, "old_leaves": len(ka), "new_leaves": len(kb)}
    max_abs, max_rel = 0.0, 0.0
    for x, y in zip(ka, kb):
        u, v = a[x].astype(np.complex128 if np.iscomplexobj(a[x]) else np.float64), b[y]
        d = float(np.max(np.abs(u - v))) if u.size else 0.0
        scale = float(np.max(np.abs(u))) if u.size else 0.0
        max_abs = max(max_abs, d)
        max_rel = max(max_rel, d / scale if scale > 0 else d)
    return {"same_structure": True, "leaves": len(ka), "max_abs_diff": max_abs, "max_rel_diff": max_rel,
            "allclose": bool(max_rel < 1e-3)}


def _q(v, p):
    return float(np.percentile(np.asarray(v, float), p))


def _git_status(paths) -> dict[str, Any]:
    """Status of the watched files, and every modified/untracked path of the tree (uncommitted work runs too)."""
    r = subprocess.run(["git", "-C", REPO, "status", "--porcelain"], capture_output=True, text=True)
    changed = {line[3:]: line[:2].strip() for line in r.stdout.splitlines()}
    return {"watched": {p: changed.get(p, "clean") for p in paths}, "all_changed": changed}


def _ensure_old_tree(path: str) -> str:
    if os.path.isdir(os.path.join(path, "ivhl_jax")):
        return path
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", path, OLD_REV], check=True,
                   capture_output=True)
    return path


def run(workloads: dict[str, tuple[str, tuple]], rounds: int, old_root: str, new_root: str,
        target_s: float, first_rounds: int, log: Callable[[str], None],
        on_result: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="ivhl_regression_")
    errlog = open(os.path.join(tmp, "workers.log"), "w")
    workers = {"old": Worker(old_root, errlog), "new": Worker(new_root, errlog)}
    results: dict[str, Any] = {}
    try:
        for name, (kind, spec) in workloads.items():
            rec: dict[str, Any] = {"kind": kind, "spec": spec, "first_call_s": {"old": [], "new": []},
                                   "compile_s": {"old": [], "new": []}}
            for r in range(max(1, first_rounds)):  # builds, interleaved; the last build is the one timed
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for t in order:
                    res = workers[t].ask(cmd="build", name=name, kind=kind, spec=spec,
                                         out=os.path.join(tmp, f"{name}_{t}.npz") if r == 0 else None)
                    rec["first_call_s"][t].append(res["first_call_s"])
                    rec.setdefault("sources_sha1", {})[t] = res["sources"]
                    if res["compile_s"] is not None:
                        rec["compile_s"][t].append(res["compile_s"])
            rec["check"] = compare(os.path.join(tmp, f"{name}_old.npz"), os.path.join(tmp, f"{name}_new.npz"))
            probe = workers["old"].ask(cmd="time", name=name, reps=1)["samples"][0]
            reps = int(max(1, min(50, np.ceil(target_s / max(probe, 1e-6)))))
            warmup = 1 if probe < 1.0 else 0  # a multi-second call needs no warm cache
            samples: dict[str, list[float]] = {"old": [], "new": []}
            best: dict[str, list[float]] = {"old": [], "new": []}
            for r in range(rounds):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for t in order:
                    s = workers[t].ask(cmd="time", name=name, reps=reps, warmup=warmup)["samples"]
                    samples[t].append(float(np.median(s)))
                    best[t].append(float(np.min(s)))
            for t in workers:
                workers[t].ask(cmd="drop", name=name)
            ratios = [n / o for n, o in zip(samples["new"], samples["old"])]
            ratios_min = [n / o for n, o in zip(best["new"], best["old"])]
            rec.update({
                "ratio_of_round_minima_median": float(np.median(ratios_min)),
                "ratio_of_round_minima_iqr": [_q(ratios_min, 25), _q(ratios_min, 75)],
                "old_min_s": float(np.min(best["old"])), "new_min_s": float(np.min(best["new"])),
                "reps_per_round": reps, "warmup_calls_per_round": warmup,
                "old_median_s": float(np.median(samples["old"])), "new_median_s": float(np.median(samples["new"])),
                "ratio_median": float(np.median(ratios)), "ratio_q25": _q(ratios, 25), "ratio_q75": _q(ratios, 75),
                "ratio_min": float(min(ratios)), "ratio_max": float(max(ratios)),
                "first_call_ratio": float(np.median(rec["first_call_s"]["new"])
                                          / np.median(rec["first_call_s"]["old"])),
                "samples_s": {t: [round(x, 7) for x in v] for t, v in samples.items()}, "ratios": ratios,
            })
            if rec["compile_s"]["old"]:
                rec["compile_ratio"] = float(np.median(rec["compile_s"]["new"]) / np.median(rec["compile_s"]["old"]))
            results[name] = rec
            if on_result is not None:
                on_result(name, rec)
            log(f"{name:24s} old {1e3 * rec['old_median_s']:9.3f} ms  new {1e3 * rec['new_median_s']:9.3f} ms  "
                f"new/old {rec['ratio_median']:.3f} [IQR {rec['ratio_q25']:.3f}-{rec['ratio_q75']:.3f}]  "
                f"of minima {rec['ratio_of_round_minima_median']:.3f}  "
                f"first call new/old {rec['first_call_ratio']:.2f}  check {rec['check']}")
    finally:
        for w in workers.values():
            w.close()
        errlog.close()
    return {"workloads": results, "workers": {t: w.hello for t, w in workers.items()}, "tmp": tmp}


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    return {"old_ms": 1e3 * r["old_median_s"], "new_ms": 1e3 * r["new_median_s"],
            "ratio": r["ratio_median"], "ratio_iqr": [r["ratio_q25"], r["ratio_q75"]],
            "ratio_of_round_minima": r.get("ratio_of_round_minima_median"),
            "ratio_of_round_minima_iqr": r.get("ratio_of_round_minima_iqr"),
            "first_call_ratio": r["first_call_ratio"], "compile_ratio": r.get("compile_ratio"),
            "outputs_match": r["check"].get("allclose"), "rounds": len(r["ratios"])}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per workload")
    ap.add_argument("--first-rounds", type=int, default=2, help="fresh builds (clear_caches + compile) per tree")
    ap.add_argument("--target-s", type=float, default=0.3, help="timed seconds per round and tree (sets reps)")
    ap.add_argument("--workloads", default=None, help="comma-separated subset of: " + ",".join(WORKLOADS))
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--old-root", default="/tmp/ivhl_old", help=f"worktree of {OLD_REV} (created if missing)")
    ap.add_argument("--new-root", default=REPO)
    ap.add_argument("--export", default=None, help="JSON file to write (rewritten after every workload)")
    ap.add_argument("--append", action="store_true",
                    help="keep the export file's records of workloads this run does not time (each record "
                         "names the run that made it)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return {}
    table = QUICK if args.quick else WORKLOADS
    names = args.workloads.split(",") if args.workloads else list(table)
    chosen = {n: table[n] for n in names}
    old_root = _ensure_old_tree(os.path.abspath(args.old_root))
    new_root = os.path.abspath(args.new_root)
    rev = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    old_rev = subprocess.run(["git", "-C", old_root, "rev-parse", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    command = "python -m ivhl_jax.bench.regression " + " ".join(sys.argv[1:] if argv is None else argv)
    this_run = {"command": command, "head": rev, "old_rev": old_rev, "old_root": old_root, "new_root": new_root,
                "timestamp_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "rounds": args.rounds, "first_rounds": args.first_rounds, "target_s": args.target_s,
                "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(),
                "git_status_start": _git_status(WATCHED)}
    doc: dict[str, Any] = {"workloads": {}, "runs": []}
    if args.append and args.export and os.path.exists(args.export):
        with open(args.export) as f:
            doc = json.load(f)
    doc["runs"] = doc.get("runs", []) + [this_run]
    t0 = time.time()

    def on_result(name: str, rec: dict[str, Any]) -> None:
        rec["run"] = {"command": command, "timestamp_utc": this_run["timestamp_utc"],
                      "loadavg_after": os.getloadavg()}
        doc["workloads"][name] = rec
        this_run.update({"loadavg_end": os.getloadavg(), "wall_s": time.time() - t0,
                         "git_status_end": _git_status(WATCHED)})
        doc.update({
            "what": "this tree (working tree, uncommitted changes included) against the pre-redesign code "
                    f"{OLD_REV}: the same workloads on identical inputs, steady-state time per call, interleaved "
                    "rounds in two long-lived worker processes; ratio = median over rounds of new/old, IQR over "
                    "rounds; first_call = clear_caches + build + compile + one call",
            "command": command,
            "host_note": "shared 2-core host with other jobs running (see loadavg): absolute times are inflated "
                         "and drift; read the interleaved per-round ratios",
            "summary": {n: _summary(r) for n, r in doc["workloads"].items()},
        })
        if args.export:
            from ivhl_jax.run.io import write_json

            write_json(args.export, doc)

    res = run(chosen, args.rounds, old_root, new_root, args.target_s, args.first_rounds,
              lambda s: print(s, file=sys.stderr, flush=True), on_result)
    doc["workers"] = res["workers"]
    if args.export:
        from ivhl_jax.run.io import write_json

        write_json(args.export, doc)
    print(json.dumps(doc["summary"], indent=1))
    return doc


if __name__ == "__main__":
    main()
