"""Benchmark peer for 1+1D CDT: the reference C++ code of Brunekreef & Görlich (JorenB/2d-cdt).

The peer's sources are **not** vendored in this repository. To use it, fetch a copy of
https://github.com/JorenB/2d-cdt (MIT licence) into a folder outside the repo and point the
environment variable ``IVHL_2DCDT_SRC`` at it (or pass ``src_dir``). The folder must hold the peer's
``universe.cpp``, ``simulation.cpp``, ``vertex.cpp``, ``triangle.cpp``, ``link.cpp``,
``observable.cpp`` and their headers; the CUDA and Rust parts are not needed.

:func:`build_peer` compiles the peer together with our throughput driver
(``bench/peer_cdt_driver.cpp``, which only includes the peer's headers) into one binary;
:func:`run_peer` runs it and returns its JSON record; :func:`run_peer_parallel` runs several copies at
once and adds up their throughput.

Command line::

    IVHL_2DCDT_SRC=/tmp/peer-2dcdt python -m bench.peer_cdt --n2 512 2048 8192 32768 --procs 1 2

The driver's record (one JSON line) holds ``n2_target``, ``attempts``, ``accepted``, ``seconds``,
``attempts_per_s``, ``accepted_per_s``, ``accept_by_move`` (``add``/``delete``/``flip`` with
``attempted``, ``accepted``, ``rate``), the mean volume during the timed loop, and a reference timing of
the peer's own ``Simulation::attemptMove()`` loop over the same number of attempts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ENV_VAR = "IVHL_2DCDT_SRC"
PEER_URL = "https://github.com/JorenB/2d-cdt"
DRIVER = Path(__file__).with_name("peer_cdt_driver.cpp")
PEER_SOURCES = ("universe.cpp", "simulation.cpp", "vertex.cpp", "triangle.cpp", "link.cpp", "observable.cpp")
PEER_HEADERS = (
    "universe.hpp",
    "simulation.hpp",
    "vertex.hpp",
    "triangle.hpp",
    "link.hpp",
    "observable.hpp",
    "pool.hpp",
    "bag.hpp",
)
# -include algorithm: the peer's observable.cpp calls std::find without including <algorithm>, which newer
# libstdc++ no longer pulls in transitively. A compiler flag, so the peer's files stay untouched.
CXXFLAGS = ("-std=c++14", "-O3", "-march=native", "-Wno-format", "-include", "algorithm")
LN2 = math.log(2.0)


class PeerNotVendoredError(RuntimeError):
    """The 2d-cdt sources are not available (they are deliberately not part of this repository)."""


def _not_vendored(reason: str) -> PeerNotVendoredError:
    return PeerNotVendoredError(
        f"2d-cdt peer not available: {reason}. The reference code of Brunekreef & Görlich is not vendored in "
        f"this repository; clone {PEER_URL} (MIT) into a folder outside the repo and set {ENV_VAR}=/that/folder "
        "(or pass src_dir=...). Needed files: " + ", ".join(PEER_SOURCES + PEER_HEADERS) + "."
    )


def peer_src_dir(src_dir: str | os.PathLike | None = None) -> Path:
    """The peer's source folder: ``src_dir`` if given, else ``$IVHL_2DCDT_SRC``; checked for the needed files."""
    return checked_source_dir(src_dir, ENV_VAR, PEER_SOURCES + PEER_HEADERS, _not_vendored)


def checked_source_dir(
    src_dir: str | os.PathLike | None, env_var: str, needed: tuple[str, ...], error: Callable[[str], Exception]
) -> Path:
    """``src_dir`` (else ``$env_var``) resolved, checked to hold every file of ``needed``; otherwise raises
    ``error(reason)``. Shared by the peers' ``peer_src_dir``."""
    if src_dir is None:
        src_dir = os.environ.get(env_var)
        if not src_dir:
            raise error(f"${env_var} is not set")
    path = Path(src_dir).expanduser().resolve()
    if not path.is_dir():
        raise error(f"{path} is not a directory")
    missing = [f for f in needed if not (path / f).is_file()]
    if missing:
        raise error(f"{path} lacks {', '.join(missing)}")
    return path


def build_peer(
    src_dir: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    driver: str | os.PathLike | None = None,
    cxx: str | None = None,
    force: bool = False,
) -> str:
    """Compile the peer plus our driver with ``g++ -O3 -march=native``; return the binary's path.

    Args:
      src_dir: the peer's sources (default ``$IVHL_2DCDT_SRC``).
      out: binary path (default ``<src_dir>/build-ivhl/peer_cdt_bench``).
      driver: driver source (default ``bench/peer_cdt_driver.cpp`` beside this file).
      cxx: compiler (default ``$CXX`` or ``g++``).
      force: rebuild even when the binary is newer than all inputs.

    Raises:
      PeerNotVendoredError: the peer's sources are missing.
      RuntimeError: no compiler, or compilation failed (message holds the compiler's output).
    """
    src = peer_src_dir(src_dir)
    drv = Path(driver) if driver is not None else DRIVER
    if not drv.is_file():
        raise FileNotFoundError(f"driver source {drv} not found")
    binary = Path(out) if out is not None else src / "build-ivhl" / "peer_cdt_bench"
    return compile_driver(src, drv, PEER_SOURCES, PEER_HEADERS, binary, CXXFLAGS, cxx, force, "the 2d-cdt peer")


def compile_driver(
    src: Path,
    driver: Path,
    sources: tuple[str, ...],
    headers: tuple[str, ...],
    binary: Path,
    flags: tuple[str, ...],
    cxx: str | None,
    force: bool,
    what: str,
) -> str:
    """``CXX FLAGS -I src driver src/sources... -o binary`` unless ``binary`` is newer than every input (or
    ``force``); returns the binary's path. Shared by the peers' ``build_peer``. RuntimeError when the compiler
    (``cxx``, else ``$CXX``, else ``g++``) is missing or fails (the message holds its output)."""
    inputs = [driver] + [src / f for f in sources + headers]
    if not force and binary.is_file():
        built = binary.stat().st_mtime
        if all(p.stat().st_mtime <= built for p in inputs):
            return str(binary)
    compiler = cxx or os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        raise RuntimeError(f"C++ compiler {compiler!r} not found (set CXX or pass cxx=...)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    cmd = [compiler, *flags, "-I", str(src), str(driver), *(str(src / f) for f in sources), "-o", str(binary)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building {what} failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    return str(binary)


def _peer_cmd(binary, n2, n_slices, seconds, attempts, lam, epsilon, therm_sweeps, seed, ref_loop) -> list[str]:
    if n2 <= 0 or n2 % 2:
        raise ValueError(f"n2 must be positive and even (triangles come in pairs), got {n2}")
    options = {
        "--n2": str(int(n2)),
        "--slices": str(int(n_slices)),
        "--lambda": repr(float(lam)),
        "--epsilon": repr(float(epsilon)),
        "--therm-sweeps": repr(float(therm_sweeps)),
        "--seed": str(int(seed)),
    }
    cmd = [str(binary), *(word for option in options.items() for word in option)]
    cmd += ["--attempts", str(int(attempts))] if attempts else ["--seconds", repr(float(seconds))]
    if not ref_loop:
        cmd.append("--no-ref-loop")
    return cmd


def _parse(stdout: str, cmd: list[str]) -> dict:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON record in the output of {' '.join(cmd)}:\n{stdout[-2000:]}")


def run_peer(
    binary: str,
    n2: int,
    n_slices: int = 16,
    seconds: float = 2.0,
    attempts: int | None = None,
    lam: float = LN2,
    epsilon: float = 0.02,
    therm_sweeps: float = 20.0,
    seed: int = 1,
    ref_loop: bool = True,
    timeout: float | None = None,
) -> dict:
    """Run the peer driver once and return its JSON record (a dict).

    The driver builds a torus of ``n_slices`` slices, grows it to ``n2`` triangles, thermalises for
    ``therm_sweeps * n2`` move attempts, then times moves for ``seconds`` (or exactly ``attempts``
    attempts), with the peer's volume fixing (``epsilon``) around ``n2`` and cosmological constant ``lam``.
    """
    cmd = _peer_cmd(binary, n2, n_slices, seconds, attempts, lam, epsilon, therm_sweeps, seed, ref_loop)
    if timeout is None:
        timeout = 120.0 + 4.0 * (seconds or 0.0)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    return _parse(proc.stdout, cmd)


def run_all(cmds: list[list[str]], timeout: float) -> list[str]:
    """Start every command at once, wait for all (``timeout`` seconds in total: then all are killed and
    TimeoutExpired raised); return their stdouts. RuntimeError (with its stderr) when one exits non-zero."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    outs = []
    deadline = time.monotonic() + timeout
    for c, p in zip(cmds, procs):
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(c)} exited with {p.returncode}:\n{err[-2000:]}")
        outs.append(out)
    return outs


def run_peer_parallel(binary: str, n2: int, n_procs: int = 2, seed: int = 1, **kw) -> dict:
    """Run ``n_procs`` copies of the driver at once (seeds ``seed .. seed+n_procs-1``); aggregate throughput.

    Returns ``{"n_procs", "n2_target", "attempts_per_s", "accepted_per_s", "accept_by_move",
    "attempts_per_cpu_s_mean", "cores_used", "runs"}``, where the rates are sums over processes of each one's
    own wall-clock rate, ``accept_by_move`` pools the counts, ``attempts_per_cpu_s_mean`` averages each
    process's attempts per CPU-second, and ``cores_used`` sums CPU-seconds / wall-seconds of the timed loops.
    """
    seconds = kw.pop("seconds", 2.0)
    timeout = kw.pop("timeout", None) or 120.0 + 4.0 * (seconds or 0.0)
    defaults = dict(n_slices=16, attempts=None, lam=LN2, epsilon=0.02, therm_sweeps=20.0, ref_loop=True)
    defaults.update(kw)
    cmds = [
        _peer_cmd(
            binary,
            n2,
            defaults["n_slices"],
            seconds,
            defaults["attempts"],
            defaults["lam"],
            defaults["epsilon"],
            defaults["therm_sweeps"],
            seed + i,
            defaults["ref_loop"],
        )
        for i in range(n_procs)
    ]
    runs = [_parse(out, c) for c, out in zip(cmds, run_all(cmds, timeout))]
    pooled = {}
    for move in ("add", "delete", "flip"):
        tried = sum(r["accept_by_move"][move]["attempted"] for r in runs)
        taken = sum(r["accept_by_move"][move]["accepted"] for r in runs)
        pooled[move] = {"attempted": tried, "accepted": taken, "rate": taken / tried if tried else 0.0}
    return {
        "n_procs": n_procs,
        "n2_target": n2,
        "attempts_per_s": sum(r["attempts_per_s"] for r in runs),
        "accepted_per_s": sum(r["accepted_per_s"] for r in runs),
        "accept_by_move": pooled,
        # Throughput per CPU-second of each process (insensitive to other jobs on the host), averaged.
        "attempts_per_cpu_s_mean": sum(r["attempts_per_cpu_s"] for r in runs) / len(runs),
        # Cores the timed loops actually got, summed over processes (n_procs on an idle host).
        "cores_used": sum(r["cpu_seconds"] / r["seconds"] for r in runs),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=None, help=f"peer sources (default ${ENV_VAR})")
    ap.add_argument("--binary", default=None, help="use this driver binary instead of building one")
    ap.add_argument("--n2", type=int, nargs="+", default=[512, 2048, 8192, 32768])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    binary = args.binary or build_peer(args.src)
    for n2 in args.n2:
        for n_procs in args.procs:
            for rep in range(args.repeats):
                load = os.getloadavg()[0]
                res = run_peer_parallel(binary, n2, n_procs=n_procs, seconds=args.seconds, n_slices=args.slices)
                acc = {m: round(v["rate"], 4) for m, v in res["accept_by_move"].items()}
                print(
                    json.dumps(
                        {
                            "n2": n2,
                            "procs": n_procs,
                            "rep": rep,
                            "load1": round(load, 2),
                            "attempts_per_s": round(res["attempts_per_s"]),
                            "accepted_per_s": round(res["accepted_per_s"]),
                            "attempts_per_cpu_s": round(res["attempts_per_cpu_s_mean"]),
                            "cores_used": round(res["cores_used"], 2),
                            "n2_mean": [round(r["n2_mean"], 1) for r in res["runs"]],
                            "ref_attemptMove_per_cpu_s": [
                                round(r["ref_attemptMove"]["attempts_per_cpu_s"]) for r in res["runs"]
                            ],
                            "accept_by_move": acc,
                        }
                    ),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
