"""This tree against another git revision: the same bench ops, timed interleaved, new/old ratios.

Both trees are packages called ``ivhl_jax``, so each runs in its own long-lived worker subprocess
(``python bench/studies/compare_revisions.py --worker ROOT``: an import hook maps ``ivhl_jax``, ``ivhl_jax.models`` and
``ivhl_jax.bench`` to ROOT's ``ivhl_jax/``, ``models/`` and ``bench/``, ahead of the editable install's
finder). Each worker builds every workload from its own tree's ``bench/ops_*.py`` ``OPS`` table (same op name,
same size, identical inputs), so an API that changed between the revisions is compared through the op that
wraps it. The parent never imports JAX; it asks the two workers for timings alternately (old/new, then
new/old, ...), one round = one sample per tree, so a load change on a shared host hits both alike.

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

Workloads (:data:`WORKLOADS`, each ``(bench module, op, size)``): the GP split-step (``gp_step``), the GFT
step (``gft_step``), ``fields.superpose``, ``tn.contract`` and one MERA sweep, CDT sweeps, the adaptive train
chunk and the transformer train step.

    .venv/bin/python -m bench.studies.compare_revisions --against d695879 --rounds 9 \
        --export bench/results/compare_revisions.json
    .venv/bin/python -m bench.studies.compare_revisions --against d695879 --workloads gft_step --append \
        --export bench/results/compare_revisions.json        # redo one

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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))  # bench/studies/ -> the repository root

# (bench module, size) -> its ops timed; --quick: the same code paths at small sizes (smoke test).
_OPS_BY_MODULE: dict[tuple[str, str], tuple[str, ...]] = {
    ("ops_condensate", "medium"): ("gp_step", "gft_step"),
    ("ops_condensate_systems", "medium"): ("mixture_step", "mixture_ground_step", "spin1_step", "dipolar_step"),
    ("ops_fields", "medium"): ("superpose",),
    ("ops_tn", "medium"): ("tn_contract", "mera_sweep"),
    ("ops_cdt", "small"): ("cdt_sweeps",),
    ("ops_adaptive", "small"): ("adaptive_train",),
    ("ops_transformer", "small"): ("transformer_train_step",),
}
# name -> (bench module, op, size)
WORKLOADS: dict[str, tuple[str, str, str]] = {
    op: (mod, op, size) for (mod, size), ops in _OPS_BY_MODULE.items() for op in ops
}
QUICK: dict[str, tuple[str, str, str]] = {name: (mod, op, "small") for name, (mod, op, _) in WORKLOADS.items()}


# ------------------------------------------------------------------------------------------ worker side


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Resolves the top-level ``ivhl_jax`` packages to one source tree (old or new)."""

    def __init__(self, root: str):
        self.map = {
            "ivhl_jax": os.path.join(root, "ivhl_jax"),
            "ivhl_jax.models": os.path.join(root, "models"),
            "ivhl_jax.bench": os.path.join(root, "bench"),
            "ivhl_jax.sims": os.path.join(root, "sims"),
        }

    def find_spec(self, fullname, path=None, target=None):
        d = self.map.get(fullname)
        if d is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(d, "__init__.py"), submodule_search_locations=[d]
        )


def _build(spec: tuple) -> dict[str, Any]:
    """Returns {"call": zero-arg blocking callable returning the output, "compile_s"}."""
    import jax

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
                b = _build(tuple(req["spec"]))
                out = b["call"]()
                first = time.perf_counter() - t0
                built[req["name"]] = b
                if req.get("out"):
                    _save_output(out, req["out"])
                res: dict[str, Any] = {"first_call_s": first, "compile_s": b["compile_s"]}
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
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", root],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=tempfile.gettempdir(),
            env={**os.environ, "PYTHONPATH": root},
        )
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
    return {
        "same_structure": True,
        "leaves": len(ka),
        "max_abs_diff": max_abs,
        "max_rel_diff": max_rel,
        "allclose": bool(max_rel < 1e-3),
    }


def _q(v, p):
    return float(np.percentile(np.asarray(v, float), p))


def _git_status() -> dict[str, str]:
    """Every modified/untracked path of this tree (uncommitted work runs too, so the record says what it was)."""
    r = subprocess.run(["git", "-C", REPO, "status", "--porcelain"], capture_output=True, text=True)
    return {line[3:]: line[:2].strip() for line in r.stdout.splitlines()}


def _ensure_old_tree(path: str, rev: str | None) -> str:
    """``path`` if it already holds a tree; else a detached git worktree of ``rev`` there."""
    if os.path.isdir(os.path.join(path, "ivhl_jax")):
        return path
    if not rev:
        raise ValueError(f"--old-root {path} holds no tree: give --against REV (a git revision) to create it there")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", path, rev], check=True, capture_output=True)
    return path


def _builds(name: str, spec, workers: dict, tmp: str, first_rounds: int) -> dict[str, Any]:
    """Fresh builds of one workload in each tree, interleaved (the first saves its outputs, the last is the one
    timed): first-call and compile seconds, and the outputs of the two trees compared."""
    rec: dict[str, Any] = {"spec": spec, "first_call_s": {"old": [], "new": []}, "compile_s": {"old": [], "new": []}}
    for r in range(max(1, first_rounds)):
        for t in ("old", "new") if r % 2 == 0 else ("new", "old"):
            out = os.path.join(tmp, f"{name}_{t}.npz") if r == 0 else None
            res = workers[t].ask(cmd="build", name=name, spec=spec, out=out)
            rec["first_call_s"][t].append(res["first_call_s"])
            if res["compile_s"] is not None:
                rec["compile_s"][t].append(res["compile_s"])
    rec["check"] = compare(os.path.join(tmp, f"{name}_old.npz"), os.path.join(tmp, f"{name}_new.npz"))
    return rec


def _timed_rounds(name: str, workers: dict, rounds: int, target_s: float) -> dict[str, Any]:
    """Interleaved timing rounds of one built workload, the order alternating: each round's median and minimum
    per tree over ``reps`` calls (``reps`` sized from one probe call to about ``target_s`` seconds a round)."""
    probe = workers["old"].ask(cmd="time", name=name, reps=1)["samples"][0]
    reps = int(max(1, min(50, np.ceil(target_s / max(probe, 1e-6)))))
    warmup = 1 if probe < 1.0 else 0  # a multi-second call needs no warm cache
    samples: dict[str, list[float]] = {"old": [], "new": []}
    best: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(rounds):
        for t in ("old", "new") if r % 2 == 0 else ("new", "old"):
            s = workers[t].ask(cmd="time", name=name, reps=reps, warmup=warmup)["samples"]
            samples[t].append(float(np.median(s)))
            best[t].append(float(np.min(s)))
    return {"samples": samples, "best": best, "reps": reps, "warmup": warmup}


def _ratios(rec: dict[str, Any], timed: dict[str, Any]) -> dict[str, Any]:
    """new/old per round (of the medians and of the minima), their medians and spreads, the first-call ratio."""
    samples, best = timed["samples"], timed["best"]
    ratios = [n / o for n, o in zip(samples["new"], samples["old"])]
    ratios_min = [n / o for n, o in zip(best["new"], best["old"])]
    return {
        "ratio_of_round_minima_median": float(np.median(ratios_min)),
        "ratio_of_round_minima_iqr": [_q(ratios_min, 25), _q(ratios_min, 75)],
        "old_min_s": float(np.min(best["old"])),
        "new_min_s": float(np.min(best["new"])),
        "reps_per_round": timed["reps"],
        "warmup_calls_per_round": timed["warmup"],
        "old_median_s": float(np.median(samples["old"])),
        "new_median_s": float(np.median(samples["new"])),
        "ratio_median": float(np.median(ratios)),
        "ratio_q25": _q(ratios, 25),
        "ratio_q75": _q(ratios, 75),
        "ratio_min": float(min(ratios)),
        "ratio_max": float(max(ratios)),
        "first_call_ratio": float(np.median(rec["first_call_s"]["new"]) / np.median(rec["first_call_s"]["old"])),
        "samples_s": {t: [round(x, 7) for x in v] for t, v in samples.items()},
        "ratios": ratios,
    }


def run(
    workloads: dict[str, tuple[str, str, str]],
    rounds: int,
    old_root: str,
    new_root: str,
    target_s: float,
    first_rounds: int,
    log: Callable[[str], None],
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="ivhl_compare_")
    errlog = open(os.path.join(tmp, "workers.log"), "w")
    workers = {"old": Worker(old_root, errlog), "new": Worker(new_root, errlog)}
    results: dict[str, Any] = {}
    try:
        for name, spec in workloads.items():
            rec = _builds(name, spec, workers, tmp, first_rounds)
            timed = _timed_rounds(name, workers, rounds, target_s)
            for t in workers:
                workers[t].ask(cmd="drop", name=name)
            rec.update(_ratios(rec, timed))
            if rec["compile_s"]["old"]:
                rec["compile_ratio"] = float(np.median(rec["compile_s"]["new"]) / np.median(rec["compile_s"]["old"]))
            results[name] = rec
            if on_result is not None:
                on_result(name, rec)
            log(
                f"{name:24s} old {1e3 * rec['old_median_s']:9.3f} ms  new {1e3 * rec['new_median_s']:9.3f} ms  "
                f"new/old {rec['ratio_median']:.3f} [IQR {rec['ratio_q25']:.3f}-{rec['ratio_q75']:.3f}]  "
                f"of minima {rec['ratio_of_round_minima_median']:.3f}  "
                f"first call new/old {rec['first_call_ratio']:.2f}  check {rec['check']}"
            )
    finally:
        for w in workers.values():
            w.close()
        errlog.close()
    return {"workloads": results, "workers": {t: w.hello for t, w in workers.items()}, "tmp": tmp}


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "old_ms": 1e3 * r["old_median_s"],
        "new_ms": 1e3 * r["new_median_s"],
        "ratio": r["ratio_median"],
        "ratio_iqr": [r["ratio_q25"], r["ratio_q75"]],
        "ratio_of_round_minima": r.get("ratio_of_round_minima_median"),
        "ratio_of_round_minima_iqr": r.get("ratio_of_round_minima_iqr"),
        "first_call_ratio": r["first_call_ratio"],
        "compile_ratio": r.get("compile_ratio"),
        "outputs_match": r["check"].get("allclose"),
        "rounds": len(r["ratios"]),
    }


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per workload")
    ap.add_argument("--first-rounds", type=int, default=2, help="fresh builds (clear_caches + compile) per tree")
    ap.add_argument("--target-s", type=float, default=0.3, help="timed seconds per round and tree (sets reps)")
    ap.add_argument("--workloads", default=None, help="comma-separated subset of: " + ",".join(WORKLOADS))
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument(
        "--sizes",
        default=None,
        help="comma-separated op sizes (small,medium,large,...): each chosen "
        "workload runs at every one of them (named op@size)",
    )
    ap.add_argument(
        "--against",
        default=None,
        help="git revision to compare with (a worktree of it is created at --old-root when that folder holds no tree)",
    )
    ap.add_argument("--old-root", default=None, help="the other tree (default: /tmp/ivhl_compare_<REV>)")
    ap.add_argument("--new-root", default=REPO)
    ap.add_argument("--export", default=None, help="JSON file to write (rewritten after every workload)")
    ap.add_argument(
        "--append",
        action="store_true",
        help="keep the export file's records of workloads this run does not time (each record "
        "names the run that made it)",
    )
    return ap


def _chosen(args: argparse.Namespace, ap: argparse.ArgumentParser) -> dict[str, tuple[str, str, str]]:
    """The workloads asked for (``--workloads``, ``--quick``), each at every ``--sizes`` (named op@size)."""
    table = QUICK if args.quick else WORKLOADS
    names = args.workloads.split(",") if args.workloads else list(table)
    unknown = sorted(set(names) - set(table))
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; choose from {sorted(table)}")
    chosen = {n: table[n] for n in names}
    if args.sizes:
        sizes = args.sizes.split(",")
        chosen = {f"{n}@{size}": (mod, op, size) for n, (mod, op, _) in chosen.items() for size in sizes}
    return chosen


def _this_run(args: argparse.Namespace, command: str, old_root: str, new_root: str) -> dict[str, Any]:
    """The record of this run: command, both revisions and roots, settings, machine cores, load, git status."""
    from ivhl_jax.core import backend

    rev = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    old_rev = subprocess.run(
        ["git", "-C", old_root, "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "command": command,
        "head": rev,
        "old_rev": old_rev,
        "old_root": old_root,
        "new_root": new_root,
        "timestamp_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "rounds": args.rounds,
        "first_rounds": args.first_rounds,
        "target_s": args.target_s,
        "cpu_count": backend.machine_cores(),
        "loadavg_start": os.getloadavg(),
        "uncommitted_start": _git_status(),
    }


def main(argv=None) -> dict:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return {}
    chosen = _chosen(args, ap)
    if args.old_root is None and not args.against:
        ap.error("say what to compare with: --against REV (a git revision) or --old-root DIR (a tree)")
    old_root = _ensure_old_tree(os.path.abspath(args.old_root or f"/tmp/ivhl_compare_{args.against}"), args.against)
    new_root = os.path.abspath(args.new_root)
    command = "python -m bench.studies.compare_revisions " + " ".join(sys.argv[1:] if argv is None else argv)
    this_run = _this_run(args, command, old_root, new_root)
    old_rev = this_run["old_rev"]
    from ivhl_jax.bench.harness import write_results

    doc: dict[str, Any] = {"workloads": {}, "runs": []}
    if args.append and args.export and os.path.exists(args.export):
        with open(args.export) as f:
            doc = json.load(f)
    doc["runs"] = doc.get("runs", []) + [this_run]
    t0 = time.time()

    def on_result(name: str, rec: dict[str, Any]) -> None:
        rec["run"] = {"command": command, "timestamp_utc": this_run["timestamp_utc"], "loadavg_after": os.getloadavg()}
        doc["workloads"][name] = rec
        this_run.update({"loadavg_end": os.getloadavg(), "wall_s": time.time() - t0, "uncommitted_end": _git_status()})
        doc.update(
            {
                "what": f"this tree (working tree, uncommitted changes included) against {old_rev[:12]}: the same "
                "bench ops on identical inputs, steady-state time per call, interleaved "
                "rounds in two long-lived worker processes; ratio = median over rounds of new/old, IQR over "
                "rounds; first_call = clear_caches + build + compile + one call",
                "command": command,
                "host_note": "shared 2-core host with other jobs running (see loadavg): absolute times are inflated "
                "and drift; read the interleaved per-round ratios",
                "summary": {n: _summary(r) for n, r in doc["workloads"].items()},
            }
        )
        if args.export:
            write_results(args.export, doc, command=command)

    res = run(
        chosen,
        args.rounds,
        old_root,
        new_root,
        args.target_s,
        args.first_rounds,
        lambda s: print(s, file=sys.stderr, flush=True),
        on_result,
    )
    doc["workers"] = res["workers"]
    if args.export:
        write_results(args.export, doc, command=command)
    print(json.dumps(doc["summary"], indent=1))
    return doc


if __name__ == "__main__":
    main()
