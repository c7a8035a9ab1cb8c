"""The provenance header of a results file: the command that reproduces it, the commit, the machine, the versions.

Every results file (``bench/results/*.json``, ``ivhl tune --export``) is written by :func:`write_results`, which
puts :func:`provenance` first (``tests/contracts/test_results.py`` checks it); ``ivhl_jax.bench.harness``
re-exports both.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from typing import Any

import jax

from ivhl_jax.core import backend, host

__all__ = ["invocation", "provenance", "write_results"]

# The header's versions: the library and JAX always, every other package only when installed (the peers
# a benchmark may have timed: PyTorch, the host FFT and CDT kernels' ducc0 and numba, SciPy).
_HEADER_LIBS = ("jax", "jaxlib", "numpy", "flax", "optax", "scipy", "torch", "ducc0", "numba")
# Environment variables that change what a command measures; the header records those that were set.
_HEADER_ENV = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_ENABLE_X64", "CUDA_VISIBLE_DEVICES")


def invocation() -> str:
    """This process's command line as a command to run from the repository root.

    ``python -m MODULE ARGS`` when started with ``-m``, ``ivhl ARGS`` from the console script, else
    ``python SCRIPT ARGS`` (the script path relative to the working directory).
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    argv0 = sys.argv[0] if sys.argv else ""
    if spec is not None and spec.name:
        prog = f"python -m {spec.name.removesuffix('.__main__')}"
    elif os.path.basename(argv0) == "ivhl":
        prog = "ivhl"
    else:
        prog = f"python {shlex.quote(os.path.relpath(argv0)) if argv0 else '-c ...'}"
    return " ".join(x for x in (prog, shlex.join(sys.argv[1:])) if x)


def _git(root: str, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):  # no git on this machine
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def provenance(command: str | None = None) -> dict[str, Any]:
    """The header of a results file: how to reproduce it and what it ran on.

    Keys: ``command`` (default :func:`invocation`), ``commit`` (``git rev-parse HEAD`` of the checkout this
    module was loaded from; None from an installed wheel), ``dirty`` (uncommitted changes to tracked files;
    None without a checkout), ``date_utc``, ``machine`` (platform, CPU model and core count, accelerator kind
    and count), ``versions`` (ivhl_jax, jax, jaxlib and every installed peer of :data:`_HEADER_LIBS`) and, when
    any is set, ``env``: the environment variables of :data:`_HEADER_ENV` the command ran with.
    """
    import ivhl_jax

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
    top = _git(root, "rev-parse", "--show-toplevel")
    in_checkout = top is not None and os.path.realpath(top) == os.path.realpath(root)
    commit = _git(root, "rev-parse", "HEAD") if in_checkout else None
    status = _git(root, "status", "--porcelain", "--untracked-files=no") if in_checkout else None
    devices = jax.devices()
    machine: dict[str, Any] = {
        "platform": backend.platform(),
        "cpu": host.facts().cpu_model,
        "cpu_cores": backend.machine_cores(),
        "system": f"{platform.system()} {platform.machine()}",
    }
    if backend.platform() != "cpu":
        machine["accelerator"] = devices[0].device_kind
        machine["accelerator_count"] = len(devices)
    else:
        machine["device_count"] = len(devices)  # emulated CPU devices (XLA_FLAGS) show here
    versions: dict[str, str] = {"python": platform.python_version(), "ivhl_jax": ivhl_jax.__version__}
    for lib in _HEADER_LIBS:
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:  # a peer that is not installed
            continue
    header = {
        "command": command or invocation(),
        "commit": commit,
        "dirty": None if status is None else bool(status),
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine,
        "versions": versions,
    }
    env = {k: os.environ[k] for k in _HEADER_ENV if os.environ.get(k)}
    if env:
        header["env"] = env
    return header


def write_results(path: str | os.PathLike, doc: dict[str, Any], *, command: str | None = None) -> str:
    """Write a results document (JSON) with its :func:`provenance` header first; returns the path.

    ``command``: the command that reproduces the file, when it is not this process's own command line
    (:func:`invocation`), e.g. a study that records only its pooling step. Any ``provenance`` key already in
    ``doc`` is replaced. Written atomically (:func:`ivhl_jax.run.io.write_json`).
    """
    from ivhl_jax.run.io import write_json

    if not isinstance(doc, dict):
        raise TypeError(f"doc must be a dict (a JSON object) to carry the provenance header, got {type(doc).__name__}")
    body = {k: v for k, v in doc.items() if k != "provenance"}
    return write_json(path, {"provenance": provenance(command), **body})
