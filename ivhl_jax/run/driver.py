"""One ``main`` for every runnable simulation: a simulation declares what is its own, the driver does the rest.

A simulation module (``sims/NAME.py``) subclasses :class:`Simulation` — its config dataclass, how to run it
against a checkpointer, how to write its outputs — and names one instance ``SIMULATION``, which ``ivhl sim NAME``
hands to :func:`run_main`.
The driver then does, identically for every simulation:

* joining the other processes under ``ivhl launch`` (or SLURM, Open MPI, a TPU pod) before any JAX work
  (:func:`ivhl_jax.run.launch.initialize`; alone it does nothing); a simulation that runs as one process
  (``multiprocess = False``) refuses a job of several, in one line, rather than run N copies of itself into
  one folder;
* the command line: ``--config FILE``, ``--set KEY=VALUE``, ``--out``, ``--resume/--no-resume``,
  ``--no-progress``; ``--help`` lists every config key with its type, default and meaning (the ``"help"``
  entry of the field's metadata, :func:`ivhl_jax.run.config.option`);
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

The layer rule holds: the driver knows nothing of physics; :meth:`Simulation.run` is the simulation's own code.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import dataclasses
import inspect
import os
import sys
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from ivhl_jax.run import launch, runner
from ivhl_jax.run.config import (
    OneLineArgumentParser,
    add_run_arguments,
    clip_short_run,
    config_dict,
    load_config,
    plain_text,
    prepare_run_dir,
)
from ivhl_jax.run.io import disk_full_message
from ivhl_jax.run.lock import check_out_dir, run_dir_lock
from ivhl_jax.run.runner import RunInterrupted
from ivhl_jax.run.store import STORE_NAME, RunStore, StoreError
from ivhl_jax.train.checkpoint import CheckpointCorruptError, Checkpointer

__all__ = ["Simulation", "RunContext", "run_main", "run_checkpointer", "describe_config", "field_help"]


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What the driver hands to :attr:`Simulation.run`."""

    out: str
    checkpointer: Checkpointer | None
    progress: bool
    resuming: bool
    args: argparse.Namespace
    sink: RunStore | None = None  # the run store <out>/run.zarr (``streams``): pass it to run_chunked(..., sink=)


class Simulation(abc.ABC):
    """A runnable simulation: the parts that are its own. A module subclasses it once and hands an instance to
    :func:`run_main`, which does the rest the same way for every simulation.

    A subclass sets the class attributes ``prog`` and ``config_type`` and implements :meth:`run` and
    :meth:`default_out`; the other attributes and methods have defaults it may override.

    Attributes:
      prog: the command (``"ivhl sim cdt"``), used in messages.
      config_type: frozen dataclass with the embedded defaults (and optionally ``validate()``); every field
        carries its ``--help`` text (:func:`ivhl_jax.run.config.option`).
      description: first paragraph of ``--help`` (empty: the first paragraph of the docstring of the module that
        defines the subclass).
      extendable: config keys a resumed run may change (a larger step count extends a finished run).
      own_checkpoints: the simulation opens its checkpointers itself under ``<out>/ckpt`` (e.g. one per
        stage when the state's shapes change between stages, as in the MERA bond-dimension ladder);
        ``ctx.checkpointer`` is then None.
      multiprocess: the simulation runs as one job across the processes of a launched job (its arrays are
        sharded over the devices of every process, and each process writes only what it holds). False: it is
        a one-process program, refused under a job of several processes.
      streams: the simulation passes ``ctx.sink`` to :func:`ivhl_jax.run.runner.run_chunked`: the driver opens
        the run store ``<out>/run.zarr`` (:class:`ivhl_jax.run.store.RunStore`, with the configuration, ``dt``
        when the config has one, the seeds, version and device), the records go there and none stay in memory;
        the simulation describes its units and snapshots (``ctx.sink.describe``) and reads the records back
        (``ctx.sink.read``).
    """

    prog: ClassVar[str]
    config_type: ClassVar[type]
    description: ClassVar[str] = ""
    extendable: ClassVar[tuple[str, ...]] = ()
    own_checkpoints: ClassVar[bool] = False
    multiprocess: ClassVar[bool] = False
    streams: ClassVar[bool] = False

    def __init__(self) -> None:
        name = type(self).__name__
        if not isinstance(getattr(self, "prog", None), str) or not self.prog:
            raise TypeError(f"{name}.prog must be the command as a non-empty string (e.g. 'ivhl sim cdt')")
        cls = getattr(self, "config_type", None)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"{name}.config_type must be a config dataclass type, got {cls!r}")

    def prepare_process(self, cfg: Any) -> None:
        """Process settings that must be made before JAX starts its backend (e.g. the CPU cores XLA may use, which
        it reads when it starts): called once, right after the configuration is validated and before the run
        folder is prepared (its ``settings.json`` starts the backend). Default: nothing."""
        del cfg

    @abc.abstractmethod
    def run(self, cfg: Any, ctx: RunContext) -> Mapping[str, str]:
        """Run ``cfg`` (resuming from ``ctx.checkpointer`` when it holds a checkpoint), write the outputs into
        ``ctx.out``; return ``{label: path}`` of what was written."""

    @abc.abstractmethod
    def default_out(self, cfg: Any, args: argparse.Namespace) -> str:
        """The output folder when ``--out`` is not given."""

    def checkpoint_every(self, cfg: Any) -> int:
        """Steps between checkpoints."""
        return 1

    def keep(self, cfg: Any) -> int:
        """How many checkpoints are kept."""
        return 3

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the simulation's own command-line options to ``parser`` (none by default)."""
        return None

    def overrides(self, args: argparse.Namespace) -> list[str]:
        """``["key=value", ...]`` derived from the simulation's own options, applied after ``--set``."""
        return []

    def default_resume(self, args: argparse.Namespace) -> bool:
        """Whether ``--resume`` is on when neither ``--resume`` nor ``--no-resume`` is given."""
        return True


@contextlib.contextmanager
def run_checkpointer(
    out: str,
    cfg: Any,
    *,
    checkpointer: Checkpointer | None = None,
    resume: bool = True,
    save_every: int = 1,
    keep: int = 3,
    extendable: Sequence[str] = (),
) -> Iterator[Checkpointer]:
    """The checkpointer of a run: ``checkpointer`` when the driver passed one, otherwise the run folder ``out``
    is prepared for ``cfg`` (:func:`ivhl_jax.run.config.prepare_run_dir`: a checkpoint of another
    configuration is refused by name) and an Orbax checkpointer is opened on ``out/ckpt`` and closed after."""
    if checkpointer is not None:
        yield checkpointer
        return
    for value, name in ((save_every, "save_every"), (keep, "keep")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    with run_dir_lock(check_out_dir(out)):  # prepared and checkpointed by this run alone
        ckpt_dir = prepare_run_dir(out, cfg, resume=resume, extendable=extendable)
        with Checkpointer(
            ckpt_dir, save_every=save_every, keep=keep, config=config_dict(cfg), extendable=tuple(extendable)
        ) as ck:
            yield ck


def _docstring_attributes(cls: type) -> dict[str, str]:
    """``{field: text}`` from an ``Attributes:`` section of the class docstring (``a, b: x, y`` pairs up)."""
    out: dict[str, str] = {}
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    if "Attributes:" not in lines:
        return out
    for line in lines[lines.index("Attributes:") + 1 :]:
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


def field_help(cls: type) -> dict[str, str]:
    """``{field: meaning}`` of config dataclass ``cls``: the ``"help"`` entry of each field's metadata
    (:func:`ivhl_jax.run.config.option`), else the field's entry in the docstring's ``Attributes:`` section (a
    config class of a library layer, nested in a simulation's config), else ``""``."""
    _check_config_class(cls)
    documented = _docstring_attributes(cls)
    return {f.name: str(f.metadata.get("help", documented.get(f.name, ""))) for f in dataclasses.fields(cls)}


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _config_rows(cls: type, prefix: str = "", instance: Any = None) -> list[tuple[str, str, str, str]]:
    """``(key, type, default, meaning)`` of every key of ``cls`` (nested dataclasses as ``section.key``)."""
    hints = typing.get_type_hints(cls)
    comments = field_help(cls)
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
            rows += _config_rows(
                tp, prefix=f"{prefix}{f.name}.", instance=default if dataclasses.is_dataclass(default) else None
            )
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
    p = OneLineArgumentParser(
        prog=sim.prog,
        description=plain_text(_description(sim)),
        epilog=plain_text(epilog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(
        p,
        out=None,
        resume=None,
        config_help=f"TOML or JSON file with {sim.config_type.__name__} keys",
        out_help="output folder",
    )
    sim.add_arguments(p)
    out_default = _default_out_text(sim, p)
    for action in p._actions:
        if "--out" in action.option_strings:
            action.help = f"output folder (default: {out_default})"
    return p


def _description(sim: Simulation) -> str:
    """``sim.description``, else the first paragraph of the docstring of the module that defines its class."""
    if sim.description:
        return sim.description
    doc = getattr(sys.modules.get(type(sim).__module__), "__doc__", None) or ""
    return doc.strip().split("\n\n")[0]


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
    """Parse ``argv``, join the other processes of a launched job, prepare the run folder, run ``sim`` with
    checkpoints, report the outputs; the exit status."""
    args = _parser(sim).parse_args(list(sys.argv[1:] if argv is None else argv))
    joined = launch.initialize()  # alone: nothing; under `ivhl launch` (SLURM, MPI) join the other processes first
    if int(joined["num_processes"]) > 1 and not sim.multiprocess:
        return _fail(
            sim,
            f"runs as one process, but this job has {joined['num_processes']} ({joined['environment']}): run it "
            "alone (not under `ivhl launch`, an MPI or a multi-task SLURM job) — N copies would write one folder",
        )
    overrides = list(args.set) + sim.overrides(args)
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
    sim.prepare_process(cfg)
    out = args.out or sim.default_out(cfg, args)
    resume = args.resume if args.resume is not None else sim.default_resume(args)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(run_dir_lock(out))  # the folder is this run's until it ends (released below)
            ckpt_dir = prepare_run_dir(out, cfg, resume=resume, extendable=sim.extendable)
        except ValueError as e:  # a checkpoint of another configuration, or a bad run folder
            if _show_traceback():
                raise
            return _fail(sim, str(e))
        except OSError as e:  # a full disk, or a folder that cannot be created or written (read-only, no permission)
            if _show_traceback():
                raise
            return _fail(sim, _disk_full(e, out) or _unwritable(e, out))
        try:
            return _run_in_folder(sim, cfg, args, out, resume, ckpt_dir)
        except OSError as e:  # a full disk: one line naming the path, and that rerunning resumes
            line = _disk_full(e, out)
            if line is None or _show_traceback():
                raise
            print(f"{sim.prog}: {line}", file=sys.stderr)
            return 1


def _disk_full(e: BaseException, out: str) -> str | None:
    return disk_full_message(e, out) if isinstance(e, OSError) else None


def _unwritable(e: OSError, out: str) -> str:
    """One line for an output folder that cannot be created or written, naming it (and the entry, if another)."""
    where = f" ({e.filename})" if e.filename and os.path.abspath(str(e.filename)) != os.path.abspath(out) else ""
    why = e.strerror or type(e).__name__
    return f"cannot write the output folder {out}{where}: {why}; pass --out a folder you can write"


def _run_in_folder(sim: Simulation, cfg: Any, args: argparse.Namespace, out: str, resume: bool, ckpt_dir: str) -> int:
    """Run ``sim`` in the prepared, locked run folder ``out``; the exit status."""
    chunks_before = runner.chunks_started()
    sink: RunStore | None = None
    try:
        dt = getattr(cfg, "dt", None)
        sink = (
            RunStore(
                os.path.join(out, STORE_NAME),
                config=cfg,
                resume=resume,
                extendable=sim.extendable,
                dt=dt if isinstance(dt, float) and dt > 0 else None,
                attrs={"title": f"{sim.prog} run", "summary": " ".join(plain_text(_description(sim)).split())},
            )
            if sim.streams
            else None
        )
        if sim.own_checkpoints:
            ctx = RunContext(
                out=out, checkpointer=None, progress=not args.no_progress, resuming=resume, args=args, sink=sink
            )
            paths = sim.run(cfg, ctx)
        else:
            with Checkpointer(
                ckpt_dir,
                save_every=sim.checkpoint_every(cfg),
                keep=sim.keep(cfg),
                config=config_dict(cfg),
                extendable=sim.extendable,
            ) as ck:
                resuming = resume and ck.latest_step() is not None
                if resuming:  # said before the run, whose own lines and summary then follow
                    print(
                        f"{sim.prog}: resuming from step {ck.latest_step()} ({os.path.abspath(ckpt_dir)})", flush=True
                    )
                ctx = RunContext(
                    out=out, checkpointer=ck, progress=not args.no_progress, resuming=resuming, args=args, sink=sink
                )
                paths = sim.run(cfg, ctx)
    except KeyboardInterrupt as e:
        where = ""
        if isinstance(e, RunInterrupted):
            where = f" at step {e.step}" + (
                f"; checkpoint at step {e.checkpoint_step} written" if e.checkpoint_step is not None else ""
            )
        print(
            f"\n{sim.prog}: interrupted{where} ({os.path.abspath(ckpt_dir)}); rerun the same command to resume",
            file=sys.stderr,
        )
        return 130
    except CheckpointCorruptError as e:  # --resume and no checkpoint in the folder is usable
        if _show_traceback():
            raise
        return _fail(sim, str(e))
    except StoreError as e:  # a damaged or foreign store, found before or after chunks ran: its own words
        if _show_traceback():
            raise
        return _fail(sim, str(e))
    except (ValueError, TypeError) as e:
        # Raised while the simulation sets up (its builders validate the physics against the configuration),
        # before any work of a chunk: a configuration error. Once chunks ran, it is a failure with a traceback.
        if runner.chunks_started() != chunks_before or _show_traceback():
            raise
        return _fail(sim, f"{e} (see `{sim.prog} --help` for every key)")
    else:
        if sink is not None:
            sink.close()
            paths = {**paths, "run_store": sink.path}
    finally:
        if sink is not None:
            sink.release()  # its writer stopped and its hold of the folder's lock let go, however the run ended
    print(f"done; outputs in {os.path.abspath(out)}:")
    for name, path in paths.items():
        print(f"  {name:17s} {os.path.abspath(path)}")
    return 0
