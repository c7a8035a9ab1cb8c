"""The ``ivhl`` command line.

  ivhl demo                         the embedded default holography run (no arguments, no downloads)
  ivhl info                         platform, devices, memory, versions
  ivhl --version                    the installed version of ivhl_jax
  ivhl sim NAME [options]           a simulation from ivhl_jax.sims.NAME   (``ivhl sim --help``: the names)
  ivhl train NAME [options]         a training script ivhl_jax.sims.train_NAME   (``ivhl train --help``)
  ivhl bench [--op NAME] [--size S] [--export FILE.json]   (``ivhl bench --list``: the ops)
  ivhl tune [--quick] [--only AREA,...] [--export FILE.json]
                                    measure this machine's best settings into the tuning cache
                                    ($IVHL_CACHE_DIR, default ~/.cache/ivhl_jax); ``ivhl info`` lists them
  ivhl launch --nproc N [--devices-per-process K] -- CMD ...
                                    N local processes wired with jax.distributed (127.0.0.1)

demo/sim/train reuse compiled programs across runs through XLA's persistent compilation cache
(~/.cache/ivhl_jax/xla, or $IVHL_COMPILATION_CACHE_DIR; IVHL_COMPILATION_CACHE=0 turns it off).
IVHL_KEEP_HOST_MEMORY=1 makes glibc's malloc keep freed memory for reuse, so XLA:CPU stops faulting its
temporary buffers in on every call (faster CPU training steps, for a larger resident heap; see
ivhl_jax.run.device.keep_host_memory). A configuration error (an unknown option too) is one line and exit
status 2; IVHL_TRACEBACK=1 shows its traceback instead. IVHL_TUNING=frozen ignores the tuning cache (the backend
table alone); IVHL_TUNING=auto tunes an op the first time it meets a problem size not measured on this machine.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import os
import pkgutil
import sys
import warnings
from collections.abc import Sequence

from ivhl_jax.run.config import OneLineArgumentParser, plain_text


def _sim_modules(prefix: str = "") -> list[str]:
    import ivhl_jax.sims as sims

    names = []
    for m in pkgutil.iter_modules(sims.__path__):
        if m.name.startswith("_"):
            continue
        if prefix:
            if m.name.startswith(prefix):
                names.append(m.name[len(prefix) :])
        elif not m.name.startswith("train_"):
            names.append(m.name)
    return sorted(names)


def _summary_line(module: str) -> str:
    """The first line of ``module``'s docstring, read from its source (importing it would start JAX)."""
    try:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            return ""
        with open(spec.origin, encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read())) or ""
    except (OSError, SyntaxError, ImportError):
        return ""
    return plain_text(doc.strip().split("\n\n")[0]).replace("\n", " ") if doc.strip() else ""


def _usage(kind: str, available: list[str]) -> str:
    prefix = "train_" if kind == "train" else ""
    width = max((len(n) for n in available), default=0)
    rows = "\n".join(f"  {n:{width}s}  {_summary_line(f'ivhl_jax.sims.{prefix}{n}')}".rstrip() for n in available)
    return (
        f"usage: ivhl {kind} NAME [--config FILE] [--set KEY=VALUE ...] [--out DIR] [--resume | --no-resume] "
        f"[--no-progress]\n\navailable names:\n{rows or '  (none)'}\n\n"
        f"`ivhl {kind} NAME --help` lists NAME's options and every config key with its type, default and meaning."
    )


def _dispatch(kind: str, name: str | None, argv: list[str]) -> int:
    prefix = "train_" if kind == "train" else ""
    available = _sim_modules(prefix)
    if name in ("-h", "--help", "help"):
        print(_usage(kind, available))
        return 0
    if name is None:
        print(_usage(kind, available), file=sys.stderr)
        return 2
    if name in ("--list", "-l"):
        print(f"available for `ivhl {kind}`: {', '.join(available) or '(none)'}")
        return 0
    if name not in available:
        print(f"ivhl {kind}: unknown name {name!r}; available: {', '.join(available)}", file=sys.stderr)
        return 2
    from ivhl_jax.sims import run

    return run(importlib.import_module(f"ivhl_jax.sims.{prefix}{name}").SIMULATION, argv)


def _persistent_cache() -> None:
    """Runs from the command line reuse compiled programs across processes (a resumed or repeated run, the
    next stage of a ladder compiles nothing it compiled before): XLA's persistent cache in
    ``$IVHL_COMPILATION_CACHE_DIR`` (default ``~/.cache/ivhl_jax/xla``); ``IVHL_COMPILATION_CACHE=0`` turns it off."""
    if os.environ.get("IVHL_COMPILATION_CACHE", "1") == "0":
        return
    from ivhl_jax.run.device import enable_compilation_cache

    enable_compilation_cache(os.environ.get("IVHL_COMPILATION_CACHE_DIR") or None)


def _apply_tuning() -> None:
    """The measured XLA flags in force (and ``IVHL_TUNING=auto`` armed) before anything starts JAX's backend."""
    from ivhl_jax.run.tune import apply

    apply()


def _keep_host_memory() -> None:
    if os.environ.get("IVHL_KEEP_HOST_MEMORY", "0") != "1":
        return
    from ivhl_jax.run.device import keep_host_memory

    keep_host_memory()  # before anything starts JAX's backend; elsewhere (macOS, musl) it says why not and does nothing


def version() -> str:
    """The installed distribution's version (the package metadata), else ``ivhl_jax.__version__`` (a source tree
    that is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("ivhl_jax")
    except PackageNotFoundError:
        import ivhl_jax

        return ivhl_jax.__version__


def bench_parser() -> argparse.ArgumentParser:
    """The parser of ``ivhl bench`` (an unknown option or a bad value is one line and exit status 2)."""
    from ivhl_jax.bench import harness

    p = OneLineArgumentParser(prog="ivhl bench", description="Benchmark ops: jit vs op-by-op (+ peers).")
    p.add_argument("--op", action="append", help="op name (repeatable); default: all")
    p.add_argument("--size", action="append", choices=harness.SIZES, help="problem size (repeatable); default small")
    p.add_argument("--repeats", type=int, default=5, help="timed runs after warm-up (>= 5 recommended)")
    p.add_argument("--no-peers", action="store_true", help="skip NumPy/PyTorch peers")
    p.add_argument("--max-eager-s", type=float, default=20.0, help="time budget per op for op-by-op samples")
    p.add_argument("--export", help="write the JSON document here")
    p.add_argument("--list", action="store_true", help="list the registered ops and exit")
    return p


def _bench(argv: list[str]) -> int:
    from ivhl_jax.bench import harness

    p = bench_parser()
    a = p.parse_args(argv)
    if a.list:
        for name in sorted(harness.registry()):
            print(name)
        return 0
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    unknown = [op for op in a.op or [] if op not in harness.registry()]
    if unknown:
        p.error(f"unknown op(s) {', '.join(map(repr, unknown))}; valid ops: {', '.join(sorted(harness.registry()))}")
    doc = harness.run(a.op, a.size or ["small"], repeats=a.repeats, peers=not a.no_peers, max_eager_s=a.max_eager_s)
    if a.export:
        print(f"wrote {harness.write_results(a.export, doc)}")
    return 1 if any("error" in r for r in doc["results"]) else 0


def _one_line_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    """A warning as the command line shows it: its class and message on one line (no source file, no code line)."""
    return f"{category.__name__}: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    saved = warnings.formatwarning
    warnings.formatwarning = _one_line_warning
    try:
        return _main(argv)
    except SystemExit as e:  # argparse's --help (0) and its one-line usage errors (2): the status, as a return
        if e.code is None or isinstance(e.code, int):
            return int(e.code or 0)
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # outside a run (imports, compilation before the first chunk): nothing to save
        print("\nivhl: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = saved


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(plain_text(__doc__ or ""))
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd in ("--version", "-V"):
        print(f"ivhl_jax {version()}")
        return 0
    if cmd in ("demo", "sim", "train", "bench"):
        _keep_host_memory()
    if cmd in ("demo", "info", "sim", "train", "bench", "tune"):
        _apply_tuning()
    if cmd in ("demo", "sim", "train"):
        _persistent_cache()
    if cmd == "info":
        OneLineArgumentParser(
            prog="ivhl info",
            description="Platform, devices, memory, library versions and the per-backend defaults in force.",
        ).parse_args(rest)
        from ivhl_jax.run.device import format_report

        print(format_report())
        return 0
    if cmd == "demo":
        return _dispatch("sim", "holography", ["--demo", *rest])
    if cmd in ("sim", "train"):
        return _dispatch(cmd, rest[0] if rest else None, rest[1:])
    if cmd == "bench":
        return _bench(rest)
    if cmd == "tune":
        from ivhl_jax.run.tune import main as tune_main

        with contextlib.suppress(ImportError):  # the transformer area needs Flax (ivhl_jax.models)
            importlib.import_module("ivhl_jax.models.tunables")
        return int(tune_main(rest) or 0)
    if cmd == "launch":
        from ivhl_jax.run.launch import main as launch_main

        return int(launch_main(rest) or 0)
    print(
        f"ivhl: unknown command {cmd!r}; commands: demo, info, sim, train, bench, tune, launch, "
        "--version (`ivhl --help` describes them)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
