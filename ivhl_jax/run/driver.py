"""One ``main`` for every runnable simulation: a simulation declares what is its own, the driver does the rest.

A simulation module (``sims/NAME.py``) builds a :class:`Simulation` — its config dataclass, how to run it
against a checkpointer, how to write its outputs — and its ``main`` is ``return run_main(SIM, argv)``. The
driver then does, identically for every simulation:

* the command line: ``--config FILE``, ``--set KEY=VALUE``, ``--out``, ``--resume/--no-resume``,
  ``--no-progress``; ``--help`` lists every config key with its type, default and meaning (the comment
  beside the field in the dataclass);
* a run shorter than one chunk (``--set steps=1``) runs with the chunk and the warm-up clipped to it
  (:func:`ivhl_jax.run.config.clip_short_run`), said in one line;
* configuration errors (unknown key, wrong type, failed ``validate()``, a checkpoint of a different
  configuration in ``--out``, a ValueError or TypeError the simulation raises while it sets up, before its
  first chunk runs, and a ``--resume`` whose checkpoints are all unusable) are one line naming the key and the
  fix, exit status 2 — no traceback (``IVHL_TRACEBACK=1`` shows it);
* the run folder (:func:`ivhl_jax.run.config.prepare_run_dir`) and its Orbax checkpointer;
* Ctrl-C: the completed steps are checkpointed (:class:`ivhl_jax.run.runner.RunInterrupted`); one line
  says where the run stopped and how to resume, exit status 130;
* after the run: where each output lies.

The layer rule holds: the driver knows nothing of physics; ``Simulation.run`` is the simulation's own code.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import os
import sys
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ivhl_jax.run import runner
from ivhl_jax.run.config import (
    OneLineArgumentParser,
    add_run_arguments,
    clip_short_run,
    load_config,
    plain_text,
    prepare_run_dir,
)
from ivhl_jax.run.runner import RunInterrupted
from ivhl_jax.run.store import STORE_NAME, RunStore
from ivhl_jax.train.checkpoint import CheckpointCorruptError, Checkpointer

__all__ = ["Simulation", "RunContext", "run_main", "run_checkpointer", "describe_config", "field_comments"]


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What the driver hands to :attr:`Simulation.run`."""

    out: str
    checkpointer: Checkpointer | None
    progress: bool
    resuming: bool
    args: argparse.Namespace
    sink: RunStore | None = None  # the run store <out>/run.zarr (``streams``): pass it to run_chunked(..., sink=)


@dataclasses.dataclass(frozen=True)
class Simulation:
    """The parts of a runnable simulation that are its own.

    Attributes:
      prog: the command (``"ivhl sim cdt"``), used in messages.
      config_type: frozen dataclass with the embedded defaults (and optionally ``validate()``).
      run: ``run(cfg, ctx) -> dict[str, str]`` runs (resuming from ``ctx.checkpointer`` when it holds a
        checkpoint), writes the outputs into ``ctx.out`` and returns ``{label: path}`` of what it wrote.
      default_out: ``default_out(cfg, args) -> folder`` when ``--out`` is not given.
      extendable: config keys a resumed run may change (a larger step count extends a finished run).
      checkpoint_every: ``checkpoint_every(cfg) -> steps`` between checkpoints.
      description: first line of ``--help``.
      add_arguments: adds simulation-specific options to the parser (optional).
      overrides: ``overrides(args) -> list["key=value"]`` derived from those options (optional).
      default_resume: whether ``--resume`` is on by default.
      keep: ``keep(cfg) -> n`` checkpoints kept.
      own_checkpoints: the simulation opens its checkpointers itself under ``<out>/ckpt`` (e.g. one per
        stage when the state's shapes change between stages, as in the MERA bond-dimension ladder);
        ``ctx.checkpointer`` is then None.
      streams: the simulation passes ``ctx.sink`` to :func:`ivhl_jax.run.runner.run_chunked`: the driver opens
        the run store ``<out>/run.zarr`` (:class:`ivhl_jax.run.store.RunStore`, with the configuration, ``dt``
        when the config has one, the seeds, version and device), the records go there and none stay in memory;
        the simulation describes its units and snapshots (``ctx.sink.describe``) and reads the records back
        (``ctx.sink.read``).
    """

    prog: str
    config_type: type
    run: Callable[[Any, RunContext], Mapping[str, str]]
    default_out: Callable[[Any, argparse.Namespace], str]
    extendable: tuple[str, ...] = ()
    checkpoint_every: Callable[[Any], int] = lambda cfg: 1
    description: str = ""
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    overrides: Callable[[argparse.Namespace], list[str]] | None = None
    default_resume: Callable[[argparse.Namespace], bool] = lambda args: True
    keep: Callable[[Any], int] = lambda cfg: 3
    own_checkpoints: bool = False
    streams: bool = False


@contextlib.contextmanager
def run_checkpointer(out: str, cfg: Any, *, checkpointer: Checkpointer | None = None, resume: bool = True,
                     save_every: int = 1, keep: int = 3, extendable: Sequence[str] = ()) -> Iterator[Checkpointer]:
    """The checkpointer of a run: ``checkpointer`` when the driver passed one, otherwise the run folder ``out``
    is prepared for ``cfg`` (:func:`ivhl_jax.run.config.prepare_run_dir`: a checkpoint of another
    configuration is refused by name) and an Orbax checkpointer is opened on ``out/ckpt`` and closed after."""
    if checkpointer is not None:
        yield checkpointer
        return
    for value, name in ((save_every, "save_every"), (keep, "keep")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    ckpt_dir = prepare_run_dir(out, cfg, resume=resume, extendable=extendable)
    with Checkpointer(ckpt_dir, save_every=save_every, keep=keep) as ck:
        yield ck


def _docstring_attributes(cls: type) -> dict[str, str]:
    """``{field: text}`` from an ``Attributes:`` section of the class docstring (``a, b: x, y`` pairs up)."""
    out: dict[str, str] = {}
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    if "Attributes:" not in lines:
        return out
    for line in lines[lines.index("Attributes:") + 1:]:
        if not line.startswith(" ") or ":" not in line:
            if line.strip() and not line.startswith(" "):
                break
            continue
        names, text = (part.strip() for part in line.split(":", 1))
        keys = [n.strip() for n in names.split(",")]
        values = [v.strip() for v in text.rstrip(".").split(",")]
        for i, key in enumerate(keys):
            out[key] = values[i] if len(keys) > 1 and len(values) == len(keys) else text
    return out


def _check_config_class(cls: Any) -> None:
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"cls must be a config dataclass type, got {cls!r}")


def field_comments(cls: type) -> dict[str, str]:
    """``{field: meaning}``: the ``# ...`` comment on the field's line (or, without one, the block of comment
    lines right above it, joined), else the field's entry in the docstring's ``Attributes:`` section."""
    _check_config_class(cls)
    documented = _docstring_attributes(cls)
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return documented
    src = inspect.cleandoc("\n" + "".join(lines)) if lines and lines[0].startswith(" ") else "".join(lines)
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return documented
    text = src.splitlines()
    out = dict(documented)
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = text[node.lineno - 1]
            comment = line.split("#", 1)[1].strip() if "#" in line else ""
            if not comment:
                block: list[str] = []
                i = node.lineno - 2
                while i >= 0 and text[i].strip().startswith("#"):
                    block.insert(0, text[i].strip().lstrip("#").strip())
                    i -= 1
                comment = " ".join(b for b in block if b)
            if comment or node.target.id not in out:
                out[node.target.id] = comment
    return out


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _config_rows(cls: type, prefix: str = "", instance: Any = None) -> list[tuple[str, str, str, str]]:
    """``(key, type, default, meaning)`` of every key of ``cls`` (nested dataclasses as ``section.key``)."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    rows: list[tuple[str, str, str, str]] = []
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name, f.type)
        if instance is not None:
            default: Any = getattr(instance, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "(required)"
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            rows += _config_rows(tp, prefix=f"{prefix}{f.name}.",
                                 instance=default if dataclasses.is_dataclass(default) else None)
            continue
        rows.append((prefix + f.name, _type_name(tp), repr(default), comments.get(f.name, "")))
    return rows


def describe_config(cls: type, prefix: str = "", instance: Any = None) -> list[str]:
    """One line per config key: ``key  type  default  meaning`` (nested dataclasses as ``section.key``, with
    the defaults the enclosing config embeds, not the nested class's own). The columns are as wide as their
    widest entry, so a long type or default never shifts the columns after it; a meaning is kept whole."""
    _check_config_class(cls)
    rows = _config_rows(cls, prefix, instance)
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    return [f"  {k:{widths[0]}s}  {t:{widths[1]}s}  {d:{widths[2]}s}  {m}".rstrip() for k, t, d, m in rows]


def _parser(sim: Simulation) -> argparse.ArgumentParser:
    epilog = "config keys (--set KEY=VALUE, or in the --config file):\n" + "\n".join(describe_config(sim.config_type))
    # the description and the key meanings are docstring text: shown without their reStructuredText markup
    p = OneLineArgumentParser(prog=sim.prog, description=plain_text(sim.description), epilog=plain_text(epilog),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p, out=None, resume=None, config_help=f"TOML or JSON file with {sim.config_type.__name__} keys",
                      out_help="output folder")
    if sim.add_arguments is not None:
        sim.add_arguments(p)
    out_default = _default_out_text(sim, p)
    for action in p._actions:
        if "--out" in action.option_strings:
            action.help = f"output folder (default: {out_default})"
    return p


def _default_out_text(sim: Simulation, parser: argparse.ArgumentParser) -> str:
    """``default_out`` of the default configuration and options, for ``--help``."""
    defaults = argparse.Namespace(**{a.dest: a.default for a in parser._actions if a.dest != "help"})
    try:
        return str(sim.default_out(sim.config_type(), defaults))
    except Exception:  # a simulation whose default folder needs a given option or key: say where it comes from
        return "see the description above"


def _fail(sim: Simulation, message: str) -> int:
    print(f"{sim.prog}: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def _show_traceback() -> bool:
    return os.environ.get("IVHL_TRACEBACK", "0") == "1"


def run_main(sim: Simulation, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, prepare the run folder, run ``sim`` with checkpoints, report the outputs; the exit status."""
    args = _parser(sim).parse_args(list(sys.argv[1:] if argv is None else argv))
    overrides = list(args.set) + (sim.overrides(args) if sim.overrides is not None else [])
    try:
        cfg: Any = load_config(sim.config_type, args.config, overrides, validate=False)
        cfg, clipped = clip_short_run(cfg)
        if hasattr(cfg, "validate"):
            cfg.validate()
    except FileNotFoundError as e:
        return _fail(sim, f"config file not found: {e.filename or e}")
    except (ValueError, TypeError) as e:
        if _show_traceback():
            raise
        return _fail(sim, f"{e} (see `{sim.prog} --help` for every key)")
    if clipped:
        what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in clipped.items())
        print(f"{sim.prog}: a run shorter than one chunk (steps={cfg.steps}): {what}", file=sys.stderr)
    out = args.out or sim.default_out(cfg, args)
    resume = args.resume if args.resume is not None else sim.default_resume(args)
    try:
        ckpt_dir = prepare_run_dir(out, cfg, resume=resume, extendable=sim.extendable)
    except (ValueError, OSError) as e:  # a checkpoint of another configuration, or a bad run folder
        if _show_traceback():
            raise
        return _fail(sim, str(e))
    chunks_before = runner.chunks_started()
    try:
        dt = getattr(cfg, "dt", None)
        sink = (RunStore(os.path.join(out, STORE_NAME), config=cfg, resume=resume, extendable=sim.extendable,
                         dt=dt if isinstance(dt, float) and dt > 0 else None) if sim.streams else None)
        if sim.own_checkpoints:
            ctx = RunContext(out=out, checkpointer=None, progress=not args.no_progress, resuming=resume, args=args,
                             sink=sink)
            paths = sim.run(cfg, ctx)
        else:
            with Checkpointer(ckpt_dir, save_every=sim.checkpoint_every(cfg), keep=sim.keep(cfg)) as ck:
                resuming = resume and ck.latest_step() is not None
                if resuming:  # said before the run, whose own lines and summary then follow
                    print(f"{sim.prog}: resuming from step {ck.latest_step()} ({os.path.abspath(ckpt_dir)})",
                          flush=True)
                ctx = RunContext(out=out, checkpointer=ck, progress=not args.no_progress, resuming=resuming,
                                 args=args, sink=sink)
                paths = sim.run(cfg, ctx)
    except KeyboardInterrupt as e:
        where = ""
        if isinstance(e, RunInterrupted):
            where = f" at step {e.step}" + (f"; checkpoint at step {e.checkpoint_step} written"
                                             if e.checkpoint_step is not None else "")
        print(f"\n{sim.prog}: interrupted{where} ({os.path.abspath(ckpt_dir)}); rerun the same command to resume",
              file=sys.stderr)
        return 130
    except CheckpointCorruptError as e:  # --resume and no checkpoint in the folder is usable
        if _show_traceback():
            raise
        return _fail(sim, str(e))
    except (ValueError, TypeError) as e:
        # Raised while the simulation sets up (its builders validate the physics against the configuration),
        # before any work of a chunk: a configuration error. Once chunks ran, it is a failure with a traceback.
        if runner.chunks_started() != chunks_before or _show_traceback():
            raise
        return _fail(sim, f"{e} (see `{sim.prog} --help` for every key)")
    if sink is not None:
        sink.close()
        paths = {**paths, "run_store": sink.path}
    print(f"done; outputs in {os.path.abspath(out)}:")
    for name, path in paths.items():
        print(f"  {name:17s} {os.path.abspath(path)}")
    return 0
