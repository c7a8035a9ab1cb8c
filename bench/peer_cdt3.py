"""Reference runner for 2+1D CDT: the C++ code of Brunekreef, Görlich & Loll (JorenB/3d-cdt, arXiv:2310.16744).

The reference's sources are **not** vendored in this repository. Fetch a copy of https://github.com/JorenB/3d-cdt
(MIT licence) into a folder outside the repo and pass it as ``src_dir`` (``--peer-src``) or set
``IVHL_3DCDT_SRC``. The folder must hold the files of :data:`PEER_SOURCES` / :data:`PEER_HEADERS` and the
reference's initial-geometry generator ``3dcdt_gen_init.py`` (run with this Python; it needs NumPy and
Matplotlib).

:func:`build_peer` compiles the reference (all its sources but ``main.cpp``) with our measurement driver
``bench/peer_cdt3_driver.cpp``, which does what the reference's ``main.cpp`` does and adds a counts
observable (N0, N(3,1), N(1,3), N(2,2), N3: the reference prints none of them) and a timed loop of the
reference's ``Simulation::attemptMove()``. :func:`initial_geometry` runs the reference's generator for
``T`` slices (spherical slices, genus 0); :func:`run_peer` writes the reference's config file, runs it and
parses its outputs; :func:`run_peer_parallel` runs several copies at once (one per core) and adds up the
throughput.

Conventions of the reference (read from its ``simulation.cpp``), which our engine matches:

* action ``S = −k0 N0 + k3 N3`` plus the volume term ``ε (N(3,1) − target)²`` on the number of (3,1)
  tetrahedra only (``volfixswitch 0``): the (2,6) acceptance carries ``exp(4ε(target − N(3,1) − 1))``;
  ``target`` counts (3,1) tetrahedra = spatial triangles, so N31 = N(3,1) + N(1,3) = 2 target;
* ``k3`` is retuned after every thermal sweep towards the target volume and then held fixed; the value the
  measurements ran at is the record's ``k3_tuned``: compare against it, not the starting ``k3``;
* a sweep is ``ksteps * 1000`` move attempts; measurements follow a sweep once N(3,1) equals ``target``
  exactly (the reference keeps attempting moves until it does);
* ``ε`` is a constant (4e-5) in the reference, not a config entry; the driver sets it from ``epsilon``.
  The default here, 0.005, holds N(3,1) within about ±10 of the target so that short runs neither drift
  nor wait long for the exact hit; pass ``epsilon=4e-5`` for the reference's own value.

Command line (writes ``bench/results/cdt3_reference_*.json`` with the analysis of
:mod:`ivhl_jax.physics.cdt.d3_profile`)::

    python -m ivhl_jax.bench.peer_cdt3 --peer-src /tmp/3dcdt-src --k0 5.0 --targets 1000 2000 --slices 16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ivhl_jax.bench.peer_cdt import checked_source_dir, compile_driver, run_all

ENV_VAR = "IVHL_3DCDT_SRC"
PEER_URL = "https://github.com/JorenB/3d-cdt"
DRIVER = Path(__file__).with_name("peer_cdt3_driver.cpp")
PEER_SOURCES = (
    "universe.cpp",
    "simulation.cpp",
    "vertex.cpp",
    "tetra.cpp",
    "triangle.cpp",
    "halfedge.cpp",
    "observable.cpp",
    "observables/volume_profile.cpp",
)
PEER_HEADERS = (
    "config.hpp",
    "universe.hpp",
    "simulation.hpp",
    "vertex.hpp",
    "tetra.hpp",
    "triangle.hpp",
    "halfedge.hpp",
    "observable.hpp",
    "pool.hpp",
    "bag.hpp",
    "observables/volume_profile.hpp",
)
GENERATOR = "3dcdt_gen_init.py"
NEEDED = PEER_SOURCES + PEER_HEADERS + (GENERATOR,)
CXXFLAGS = ("-std=c++14", "-O3", "-march=native", "-Wno-format", "-Wno-return-type")
# The reference's example config (example/config.dat): its couplings, strictness and move frequencies.
EXAMPLE = {"k0": 5.0, "k3": 1.703}
EXAMPLE_STRICTNESS = 3
EXAMPLE_MOVE_FREQUENCIES = (1, 1, 1)  # v1, v2, v3: (2,6)/(6,2), (4,4), (2,3)/(3,2)
EPSILON = 0.005
COUNT_NAMES = ("n0", "n31_only", "n13", "n22", "n3")


class PeerNotVendoredError(RuntimeError):
    """The 3d-cdt sources are not available (they are deliberately not part of this repository)."""


def _not_vendored(reason: str) -> PeerNotVendoredError:
    return PeerNotVendoredError(
        f"3d-cdt reference not available: {reason}. The reference code of Brunekreef, Görlich & Loll is not "
        f"vendored in this repository; put a copy of {PEER_URL} (MIT) in a folder outside the repo and pass it as "
        f"src_dir / --peer-src (or set {ENV_VAR}). Needed files: " + ", ".join(NEEDED) + "."
    )


def peer_src_dir(src_dir: str | os.PathLike | None = None) -> Path:
    """The reference's source folder: ``src_dir`` if given, else ``$IVHL_3DCDT_SRC``; checked for the needed files."""
    return checked_source_dir(src_dir, ENV_VAR, NEEDED, _not_vendored)


def build_peer(
    src_dir: str | os.PathLike | None = None,
    *,
    out: str | os.PathLike | None = None,
    cxx: str | None = None,
    force: bool = False,
) -> str:
    """Compile the reference plus our driver with ``g++ -O3 -march=native``; return the binary's path.

    ``out`` defaults to ``<src_dir>/build-ivhl/peer_cdt3_bench``; an up-to-date binary is reused unless
    ``force``. Raises :class:`PeerNotVendoredError` (sources missing) or RuntimeError (no compiler, build
    failed; the message holds the compiler's output).
    """
    src = peer_src_dir(src_dir)
    binary = Path(out) if out is not None else src / "build-ivhl" / "peer_cdt3_bench"
    return compile_driver(src, DRIVER, PEER_SOURCES, PEER_HEADERS, binary, CXXFLAGS, cxx, force, "the 3d-cdt reference")


def initial_geometry(src_dir: str | os.PathLike | None, n_slices: int, out_dir: str | os.PathLike) -> str:
    """The reference's initial triangulation of S² × S¹ with ``n_slices`` slices (its generator, genus 0):
    every slice the boundary of a 4-simplex's facet-sphere (5 vertices, 6 triangles). Cached in ``out_dir``."""
    if int(n_slices) != n_slices or n_slices < 3:
        raise ValueError(f"n_slices must be an integer >= 3 (the reference's generator needs 3 slices), got {n_slices}")
    src = peer_src_dir(src_dir)
    path = Path(out_dir) / f"initial-g0-T{int(n_slices)}.cdt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(src / GENERATOR), "0", str(int(n_slices)), str(path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(path.parent), timeout=600)
        if proc.returncode != 0 or not path.is_file():
            raise RuntimeError(f"the reference's generator failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    return str(path)


def starting_k3(k0: float) -> float:
    """A starting ``k3`` for the reference's tuning: the example's ``(5.0, 1.703)`` moved along ``dk3/dk0 = 1/4``
    (a (2,6) move changes N0 by 1 and N3 by 4, so the critical line has about that slope)."""
    return EXAMPLE["k3"] + (k0 - EXAMPLE["k0"]) / 4.0


def write_config(path: str | os.PathLike, **entries: Any) -> str:
    """Write the reference's key-value config file (``key value`` per line, as ``example/config.dat``)."""
    lines = [f"{k} {v}" for k, v in entries.items()]
    Path(path).write_text("\n".join(lines) + "\n")
    return str(path)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run's couplings and schedule, in the reference's terms (the same for our engine in ``ops_cdt3``).

    ``k0``, ``k3`` (the starting value; the reference retunes it during thermalisation), ``target``: N(3,1)
    (spatial triangles), ``n_slices`` T, ``thermal`` and ``sweeps`` (sweeps; >= 10 each, the reference divides
    them by 10), ``ksteps`` (a sweep is ``ksteps * 1000`` attempts), ``epsilon`` (volume term), ``seed``.
    """

    k0: float = EXAMPLE["k0"]
    k3: float = EXAMPLE["k3"]
    target: int = 1000
    n_slices: int = 8
    thermal: int = 100
    sweeps: int = 200
    ksteps: int = 10
    epsilon: float = EPSILON
    seed: int = 1

    def check(self) -> RunSpec:
        """Raise ValueError naming the first bad field; return self."""
        if self.target <= 0:
            raise ValueError(f"target (number of (3,1) tetrahedra) must be positive, got {self.target}")
        for name in ("thermal", "sweeps"):
            # The reference exports its geometry every thermal/10 resp. sweeps/10 sweeps (a modulo by that number).
            if getattr(self, name) < 10:
                raise ValueError(f"{name} must be >= 10 (the reference divides it by 10), got {getattr(self, name)}")
        if self.ksteps < 1 or self.epsilon < 0 or self.n_slices < 3:
            raise ValueError(f"need ksteps >= 1, epsilon >= 0, n_slices >= 3; got {self}")
        return self


def _prepare(
    binary: str, src_dir: str | os.PathLike | None, workdir: Path, spec: RunSpec, timed_attempts: int
) -> list[str]:
    spec.check()
    if timed_attempts < 0:
        raise ValueError(f"timed_attempts must be >= 0, got {timed_attempts}")
    geometry = initial_geometry(src_dir, spec.n_slices, workdir)
    (workdir / "out").mkdir(parents=True, exist_ok=True)
    cfg = write_config(
        workdir / "config.dat",
        k0=repr(float(spec.k0)),
        k3=repr(float(spec.k3)),
        genus=0,
        targetvolume=int(spec.target),
        target2volume=0,
        volfixswitch=0,
        seed=int(spec.seed),
        outputdir=str(workdir / "out"),
        fileid=f"s{int(spec.seed)}",
        thermalsweeps=int(spec.thermal),
        measuresweeps=int(spec.sweeps),
        ksteps=int(spec.ksteps),
        strictness=EXAMPLE_STRICTNESS,
        v1=EXAMPLE_MOVE_FREQUENCIES[0],
        v2=EXAMPLE_MOVE_FREQUENCIES[1],
        v3=EXAMPLE_MOVE_FREQUENCIES[2],
        infile=geometry,
        outfile=str(workdir / "final.cdt"),
        epsilon=repr(float(spec.epsilon)),
    )
    return [binary, cfg, str(int(timed_attempts))]


def _collect(stdout: str, workdir: Path, seed: int, thermal: int, cmd: list[str]) -> dict[str, Any]:
    rec = None
    for line in reversed(stdout.splitlines()):
        if line.strip().startswith("{"):
            rec = json.loads(line)
            break
    if rec is None:
        raise RuntimeError(f"no JSON record in the output of {' '.join(cmd)}:\n{stdout[-2000:]}")
    counts = np.loadtxt(workdir / "out" / f"counts-s{seed}.dat", dtype=np.int64, ndmin=2)
    profiles = np.loadtxt(workdir / "out" / f"volume_profile-s{seed}.dat", dtype=np.int64, ndmin=2)
    # The reference measures its 3D observables after every thermal sweep too: drop those.
    counts, profiles = counts[thermal:], profiles[thermal:]
    rec["counts"] = {name: counts[:, i] for i, name in enumerate(COUNT_NAMES)}
    rec["counts"]["n31"] = counts[:, 1] + counts[:, 2]
    rec["profiles"] = profiles
    rec["command"] = cmd
    return rec


def run_peer(
    binary: str,
    src_dir: str | os.PathLike | None,
    spec: RunSpec,
    *,
    timed_attempts: int = 1_000_000,
    workdir: str | os.PathLike | None = None,
    timeout: float = 3600.0,
) -> dict[str, Any]:
    """Run the reference once as ``spec`` says; return its record with the measurement series.

    The record holds the driver's JSON (``k3_tuned``, ``run_seconds``, ``attempts_per_s`` and
    ``attempts_per_cpu_s`` of the timed ``attemptMove()`` loop of ``timed_attempts`` attempts,
    ``accept_by_move``) plus ``counts``: dict of (n,) int series ``n0``, ``n31_only`` (N(3,1)), ``n13``,
    ``n22``, ``n3`` and ``n31`` = N(3,1) + N(1,3), and ``profiles`` (n, T) spatial triangles per slice, one row
    per measurement sweep.
    """
    with tempfile.TemporaryDirectory(prefix="cdt3ref-") as tmp:
        wd = Path(workdir) if workdir is not None else Path(tmp)
        cmd = _prepare(binary, src_dir, wd, spec, timed_attempts)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
        return _collect(proc.stdout, wd, spec.seed, spec.thermal, cmd)


def run_peer_parallel(
    binary: str,
    src_dir: str | os.PathLike | None,
    spec: RunSpec,
    n_procs: int = 2,
    *,
    timed_attempts: int = 1_000_000,
    timeout: float = 3600.0,
) -> dict[str, Any]:
    """Run ``n_procs`` copies of :func:`run_peer` at once (seeds ``spec.seed .. spec.seed + n_procs − 1``).

    Returns ``{"n_procs", "attempts_per_s" (sum of each copy's wall-clock rate of the timed loop),
    "attempts_per_cpu_s_mean", "cores_used" (sum of CPU-seconds / wall-seconds of the timed loops), "runs"}``.
    """
    specs = [dataclasses.replace(spec, seed=spec.seed + i) for i in range(n_procs)]
    with tempfile.TemporaryDirectory(prefix="cdt3ref-par-") as tmp:
        dirs = [Path(tmp) / f"p{i}" for i in range(n_procs)]
        cmds = [_prepare(binary, src_dir, d, sp, timed_attempts) for d, sp in zip(dirs, specs, strict=True)]
        outs = run_all(cmds, timeout)
        parts = zip(outs, dirs, specs, cmds, strict=True)
        runs = [_collect(out, d, sp.seed, spec.thermal, c) for out, d, sp, c in parts]
    return {
        "n_procs": n_procs,
        "attempts_per_s": sum(r["attempts_per_s"] for r in runs),
        "attempts_per_cpu_s_mean": sum(r["attempts_per_cpu_s"] for r in runs) / n_procs,
        "cores_used": sum(r["cpu_seconds"] / r["seconds"] for r in runs),
        "runs": runs,
    }


def analyse(counts: dict[str, np.ndarray], profiles: np.ndarray, *, centring: str = "phase") -> dict[str, Any]:
    """The observables of one run (ours or the reference's), as plain JSON-able numbers.

    ``n22_over_n31`` (⟨N22⟩/⟨N31⟩ with N31 = N(3,1) + N(1,3)) with its autocorrelation-corrected error and
    τ_int (measurements); means of N0, N31, N22, N3; the slice-area histogram (all slices of all
    measurements); the centred averaged profile with errors; the de Sitter fit with ``volume = ⟨N3⟩`` on top of
    the stalk (the mean of the quarter of smallest slices), over the slices above twice the stalk.
    """
    from ivhl_jax.numerics.statistics import mean_with_error
    from ivhl_jax.physics.cdt import d3_profile

    out: dict[str, Any] = {"n_measurements": int(profiles.shape[0]), "n_slices": int(profiles.shape[1])}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r, e, tau = d3_profile.ratio_with_error(counts["n22"], counts["n31"])
        out["n22_over_n31"] = {"value": r, "error": e, "tau_int": tau}
        for name in ("n0", "n31", "n22", "n3"):
            m, m_err, t = mean_with_error(counts[name])
            out[f"mean_{name}"] = {"value": m, "error": m_err, "tau_int": t}
        mean, err = d3_profile.mean_profile(profiles, centring)
        out["profile"] = {"centring": centring, "mean": mean.tolist(), "error": err.tolist()}
        areas = profiles.ravel()
        hist = np.bincount(areas)
        out["slice_area_histogram"] = {"areas": np.nonzero(hist)[0].tolist(), "counts": hist[hist > 0].tolist()}
        try:
            # the fit takes the slices above twice the stalk (the blob), normalised to the area above the stalk
            stalk = d3_profile.stalk_level(mean)
            fit = d3_profile.fit_de_sitter(mean, err, float(np.mean(counts["n3"])), min_area=2 * stalk, stalk=stalk)
            out["de_sitter"] = {
                "volume": "mean N3",
                "stalk": fit.stalk,
                "s": fit.s,
                "s_err": fit.s_err,
                "t0": fit.t0,
                "width_slices": fit.width,
                "amplitude": fit.amplitude,
                "chi2": fit.chi2,
                "dof": fit.dof,
                "fitted_slices": fit.slices.tolist(),
            }
        except (ValueError, RuntimeError) as exc:  # no blob (past the transition): say so, keep the rest
            out["de_sitter"] = {"error": str(exc)}
    out["warnings"] = sorted({str(w.message) for w in caught})
    return out


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """The scalar part of a :func:`run_peer` record (no series), for a results file."""
    keep = ("k0", "epsilon", "k3_tuned", "target", "thermal_sweeps", "measure_sweeps", "ksteps", "run_seconds",
            "run_cpu_seconds", "attempts", "accepted", "seconds", "cpu_seconds", "attempts_per_s",
            "attempts_per_cpu_s", "accept_by_move")  # fmt: skip
    return {k: run[k] for k in keep}


def reference_commit(src_dir: str | os.PathLike | None) -> str | None:
    """``git rev-parse HEAD`` of the reference's folder when it is a git checkout, else None."""
    src = peer_src_dir(src_dir)
    git = shutil.which("git")
    if git is None or not (src / ".git").exists():
        return None
    return subprocess.run([git, "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def command_line(module: str, argv: list[str] | None) -> str:
    """``python -m MODULE ARGS`` with the value of ``--peer-src`` written as ``DIR`` (a folder of this machine)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--peer-src" in args:
        i = args.index("--peer-src")
        args[i + 1 : i + 2] = ["DIR"]
    return " ".join([f"python -m {module}", *args])


def main(argv: list[str] | None = None) -> int:
    from ivhl_jax.bench.harness import write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-src", default=None, help=f"reference sources (default ${ENV_VAR})")
    ap.add_argument("--k0", type=float, default=EXAMPLE["k0"])
    ap.add_argument("--k3", type=float, default=None, help="starting k3 (default starting_k3(k0); retuned)")
    ap.add_argument("--targets", type=int, nargs="+", default=[1000])
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--thermal", type=int, default=200)
    ap.add_argument("--sweeps", type=int, default=1000)
    ap.add_argument("--ksteps", type=int, default=10)
    ap.add_argument("--epsilon", type=float, default=EPSILON)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timed-attempts", type=int, default=2_000_000)
    ap.add_argument("--peer-commit", default=None, help="the reference's commit, when --peer-src is no git checkout")
    ap.add_argument("--export", default=None, help="results file (default bench/results/cdt3_reference_k0<k0>.json)")
    a = ap.parse_args(argv)
    k3 = a.k3 if a.k3 is not None else starting_k3(a.k0)
    binary = build_peer(a.peer_src)
    commit = None
    git = shutil.which("git")
    src = peer_src_dir(a.peer_src)
    if git and (src / ".git").exists():
        commit = subprocess.run(
            [git, "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    runs = []
    for target in a.targets:
        spec = RunSpec(a.k0, k3, target, a.slices, a.thermal, a.sweeps, a.ksteps, a.epsilon, a.seed)
        run = run_peer(binary, a.peer_src, spec, timed_attempts=a.timed_attempts)
        entry = {"run": summary(run), "k3_start": k3, "n_slices": a.slices, **analyse(run["counts"], run["profiles"])}
        print(json.dumps({k: entry[k] for k in ("n22_over_n31", "run")}, default=float), flush=True)
        runs.append(entry)
    doc = {
        "op": "cdt3_reference",
        "reference": {
            "url": PEER_URL,
            "commit": commit,
            "paper": "arXiv:2310.16744",
            "driver": "bench/peer_cdt3_driver.cpp",
        },
        "conventions": "N31 = N(3,1) + N(1,3); target counts N(3,1) (volfixswitch 0); sweep = ksteps*1000 "
        "attempts; measured after each sweep once N(3,1) == target; k3 retuned during thermalisation only",
        "runs": runs,
    }  # fmt: skip
    export = a.export or f"bench/results/cdt3_reference_k0{a.k0:g}.json"
    print("wrote", write_results(export, doc, command=command_line("ivhl_jax.bench.peer_cdt3", argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
