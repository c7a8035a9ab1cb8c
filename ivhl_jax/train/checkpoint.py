"""Atomic, resumable checkpoints of state pytrees (a thin layer over Orbax ``CheckpointManager``).

Orbax writes each step into a temporary directory and renames it when complete, so a crash never
leaves a half-written checkpoint that ``latest_step`` would pick. Arrays (f32, bf16, complex64,
typed PRNG keys, sharded or not) round-trip bit-exactly; a restore may target a different mesh by
passing the shardings wanted.

Typical loop (``state`` is any pytree of arrays)::

    with Checkpointer(run_dir / "ckpt", save_every=100, keep=3) as ckpt:
        start = 0
        if ckpt.latest_step() is not None:
            start, state, meta = ckpt.restore(state)
        for step in range(start, total, chunk):
            state = advance(state)
            ckpt.save(step + chunk, state, metadata={"cursor": ...})

Integrity: ``save`` records the SHA-256 of every array's bytes (from the host copy of the state being saved)
and the size of every file of the committed step in ``<step>/ivhl_checksums.json``, written atomically once
Orbax has committed the step. ``restore`` first checks the step's files (every recorded file present with its
recorded size, Orbax's JSON metadata readable), so a truncated or damaged step is refused before Orbax starts
reading it; then it compares the restored arrays with their checksums and rejects non-finite floating values.
When no step is named it falls back from a bad checkpoint (checksum mismatch, truncated or missing files, a
stray empty step folder) to the newest good one with a one-line warning on stderr, and raises
:class:`CheckpointCorruptError` naming the folder and the way out (``--no-resume``) if none is good.
"""

from __future__ import annotations

import gc
import hashlib
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ivhl_jax.core.folder_lock import check_not_link, lock_run_dir, release_run_dir
from ivhl_jax.core.validation import check_scalar

__all__ = ["abstract_like", "key_names", "Checkpointer", "CheckpointCorruptError", "StepUnfitError"]

CHECKSUM_FILE = "ivhl_checksums.json"
#: key of the checksum file's ``{path relative to the step folder: size in bytes}`` of every file Orbax wrote
FILES_KEY = "__files__"
#: Orbax's metadata files that are JSON (a step whose copy of one does not parse is damaged)
_JSON_FILES = ("_CHECKPOINT_METADATA", "_METADATA", "_sharding", "metadata", "process_")


#: the checkpoint folder's name in a run folder (``<out>/ckpt``): a checkpointer there takes the run's lock
RUN_CKPT = "ckpt"

#: the item of every step that records the configuration, library version and array checksums that wrote it
#: (committed by Orbax with the step)
RUN_ITEM = "ivhl_run"


class StepUnfitError(ValueError):
    """Raised by a template function (``restore(like=f)``) for a step the run's schedule cannot reach (e.g. not a
    multiple of its chunk): the step is skipped with a warning and the next older one tried."""


class CheckpointCorruptError(RuntimeError):
    """A checkpoint failed to restore or verify (and, for a latest-step restore, no older one was good)."""


def _ocp() -> Any:
    """``orbax.checkpoint``, imported on first use: ``import ivhl_jax`` does not pay for Orbax (and its
    asyncio/tensorstore stack) until a checkpoint is opened."""
    import orbax.checkpoint as ocp

    return ocp


def _host_array(x: Any) -> np.ndarray | None:
    """The host copy of a leaf (PRNG keys as their key data), or None where this process cannot see all of it."""
    if isinstance(x, jax.Array):
        if not x.is_fully_addressable:
            return None
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
    elif not isinstance(x, (np.ndarray, np.generic)):
        return None  # Python scalars etc.: their restored dtype may differ; not checksummed
    return np.ascontiguousarray(np.asarray(x))


def _leaf_sums(tree: Any) -> dict[str, dict[str, Any]] | None:
    """``{keypath: {"sha256", "dtype", "shape"}}`` of every array leaf; None in a multi-process run."""
    if jax.process_count() > 1:
        return None
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        a = _host_array(leaf)
        if a is not None:
            out[jax.tree_util.keystr(path)] = {
                "sha256": hashlib.sha256(a.tobytes()).hexdigest(),
                "dtype": str(a.dtype),
                "shape": list(a.shape),
            }
    return out


def abstract_like(tree: Any, sharding: Any = None) -> Any:
    """ShapeDtypeStruct tree of ``tree`` carrying ``sharding`` (a single sharding, a tree of them) or,
    when ``sharding`` is None, each leaf's own sharding."""

    def leaf_sharding(x, s):
        return s if s is not None else getattr(x, "sharding", None)

    if sharding is None or isinstance(sharding, jax.sharding.Sharding):
        shardings = jax.tree_util.tree_map(lambda x: sharding, tree)
    else:
        shardings = sharding
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=leaf_sharding(x, s)), tree, shardings
    )


class Checkpointer:
    """Save a state pytree every ``save_every`` steps, keep the newest ``keep``, restore the latest.

    Args:
      directory: where step folders are written (created if missing; made absolute).
      save_every: ``save`` writes only when ``step % save_every == 0`` (unless ``force``).
      keep: number of newest checkpoints kept on disk (older ones are deleted).
      async_save: let Orbax write in a background thread; ``wait`` / ``close`` flush it.
      config: the run's configuration (JSON-ready): recorded in every step with the library version, and a
        step of another configuration is refused by :meth:`restore`, naming the keys that differ.
      extendable: the ``config`` keys a resumed run may change (a larger step count).
      lock: hold a folder lock (:func:`ivhl_jax.core.folder_lock.run_dir_lock`) until :meth:`close`, so a second
        writer is refused at once: for ``<out>/ckpt`` the run folder's (``<out>/.lock``, the lock ``ivhl sim`` and
        ``ivhl train`` take), for any other folder its own (``<directory>/.lock``).

    A ``directory`` that is a symbolic link, or that holds one (a step folder elsewhere), is refused in one line
    naming it (its steps would be another run's).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        save_every: int = 1,
        keep: int = 3,
        async_save: bool = False,
        lock: bool = True,
        config: Mapping[str, Any] | None = None,
        extendable: tuple[str, ...] | list[str] = (),
    ):
        check_scalar(save_every, "save_every", integer=True, minimum=1)
        check_scalar(keep, "keep", integer=True, minimum=1)
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise TypeError(f"directory must be a folder path, got {directory!r}")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"config must be a JSON-ready mapping of the run's configuration or None, got {config!r}")
        self.config = None if config is None else json.loads(json.dumps(dict(config)))
        self.extendable = tuple(extendable)
        self.directory = os.path.abspath(os.fspath(directory))
        _check_folder(self.directory)
        check_not_link(self.directory, "checkpoint folder")
        if os.path.isdir(self.directory):  # a step that is a link would be read, or deleted, in another folder
            for name in sorted(os.listdir(self.directory)):
                check_not_link(os.path.join(self.directory, name), "checkpoint folder entry")
        self._locked: str | None = None
        if lock:
            # <out>/ckpt is a run folder's: the run's lock; any other folder is locked by itself
            folder = os.path.dirname(self.directory) if os.path.basename(self.directory) == RUN_CKPT else self.directory
            lock_run_dir(folder)
            self._locked = folder
        try:
            self._open(save_every, keep, async_save)
        except BaseException:
            self._release_lock()
            raise

    def _release_lock(self) -> None:
        locked, self._locked = self._locked, None
        if locked is not None:
            release_run_dir(locked)

    def _open(self, save_every: int, keep: int, async_save: bool) -> None:
        ocp = _ocp()
        self.save_every = int(save_every)
        self._pending_sums: dict[int, dict[str, Any]] = {}  # async saves whose checksum file is not yet written
        self._bad_steps: set[int] = set()  # steps found corrupt by restore (moved aside before re-saving them)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=int(keep),
            enable_async_checkpointing=bool(async_save),
            create=True,
        )
        # Registering the handlers up front lets a fresh manager read an existing directory's items
        # (metadata lookup on resume) without Orbax guessing them.
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "metadata": ocp.JsonCheckpointHandler(),
                RUN_ITEM: ocp.JsonCheckpointHandler(),
            },
        )

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (not one ``restore`` found bad), or None if there is none."""
        steps = [s for s in self._manager.all_steps() if s not in self._bad_steps]
        return max(steps) if steps else None

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(int(step)))

    def _write_sums(self, step: int, sums: dict[str, Any]) -> None:
        folder = self._step_dir(step)
        if not os.path.isdir(folder):
            return  # already garbage-collected (keep) or never committed
        # Orbax renames a step's folder into place once every file in it is written: the sizes are final.
        sums = {**sums, FILES_KEY: _file_sizes(folder)}
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{CHECKSUM_FILE}.", suffix=".tmp")  # never a planted link
        with os.fdopen(fd, "w") as f:
            json.dump(sums, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(folder, CHECKSUM_FILE))

    def _flush_sums(self, *, finished: bool) -> None:
        """Write the checksum files of committed async saves (all pending ones once ``finished``)."""
        for step in list(self._pending_sums):
            # Orbax renames the step's temporary folder into place only once it is complete.
            if finished or os.path.exists(os.path.join(self._step_dir(step), "_CHECKPOINT_METADATA")):
                self._write_sums(step, self._pending_sums.pop(step))

    def _quarantine(self, step: int) -> None:
        """Move a corrupt step folder aside (``<directory>.bad/``) so the step can be written again."""
        src = self._step_dir(step)
        if os.path.exists(src):
            dst_root = self.directory.rstrip(os.sep) + ".bad"
            os.makedirs(dst_root, exist_ok=True)
            dst = os.path.join(dst_root, f"{step}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
            shutil.move(src, dst)
            print(f"ivhl checkpoint: moved corrupt step {step} of {self.directory} to {dst}", file=sys.stderr)
        self._bad_steps.discard(step)
        self._manager.reload()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, *, metadata: Mapping[str, Any] | None = None, force: bool = False) -> bool:
        """Write ``state`` (and JSON-serialisable ``metadata``) as checkpoint ``step``.

        Returns True if a checkpoint was written. Steps not divisible by ``save_every`` are skipped
        unless ``force``.
        """
        check_scalar(step, "step", integer=True, nonnegative=True)
        step = int(step)
        if not force and step % self.save_every != 0:
            return False
        if step in self._bad_steps:
            self._quarantine(step)
        if step in self._manager.all_steps():
            return False
        self._flush_sums(finished=False)
        ocp = _ocp()
        sums = _leaf_sums(state)  # from the host copy of exactly what is saved (arrays are immutable)
        args = {"state": ocp.args.StandardSave(state)}
        if metadata is not None:
            args["metadata"] = ocp.args.JsonSave(dict(metadata))
        # committed by Orbax with the step itself: a step is never on disk without its configuration and sums
        run = {"config": self.config, "library": _library_version(), "sums": sums}
        args[RUN_ITEM] = ocp.args.JsonSave(run)
        self._manager.save(step, args=ocp.args.Composite(**args), force=True)
        if sums is not None:
            self._pending_sums[step] = sums
            self._flush_sums(finished=False)  # a synchronous save is committed already
        return True

    def restore(
        self, like: Any, step: int | None = None, *, sharding: Any = None, saved_layout: bool = False
    ) -> tuple[int, Any, dict[str, Any] | None]:
        """Restore checkpoint ``step`` (default: the newest good one) into the structure of ``like``.

        Args:
          like: a pytree with the target structure, shapes and dtypes (concrete arrays or
            ``jax.ShapeDtypeStruct``); leaf shardings are used unless ``sharding`` is given. May also be a
            function of the step returning that pytree (when shapes depend on the step restored); errors it
            raises propagate unchanged.
          sharding: a ``jax.sharding.Sharding`` for every leaf, or a matching tree of them, to
            restore onto a different mesh or device count.
          saved_layout: a leaf the template leaves unplaced (no sharding, or one device's) comes back on the
            sharding it was saved with, when that spans several devices these processes hold (a run resumes on
            the mesh it ran on; :func:`ivhl_jax.run.runner.run_chunked` asks for it). A template leaf laid out
            over several devices, and ``sharding``, always win.

        The restored arrays are checked against the checksums written at save and must be finite. Without
        ``step``, a checkpoint that fails to restore or verify is skipped with a one-line warning on stderr
        naming it, and the next older one is tried; :class:`CheckpointCorruptError` names the folder if none
        is good. A named ``step`` that fails raises :class:`CheckpointCorruptError` at once.

        Returns:
          (step, state, metadata) with metadata None if none was saved.
        """
        self._flush_sums(finished=False)
        if step is not None:
            return self._restore_step(step, like, sharding, saved_layout)
        return self._restore_newest(like, sharding, saved_layout)

    def _restore_step(
        self, step: int, like: Any, sharding: Any, saved_layout: bool
    ) -> tuple[int, Any, dict[str, Any] | None]:
        """:meth:`restore` of a named ``step``: any failure of the checkpoint itself raises at once."""
        if step not in self._manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; available: {self.all_steps()}")
        try:
            self._check_complete(step)
        except Exception as e:
            raise CheckpointCorruptError(
                f"checkpoint step {step} in {self.directory} is unusable: {_one_line(e, self.directory)}"
            ) from e
        target = like(step) if callable(like) else like
        self._check_run(step)
        self._check_template(step, target)
        try:
            return self._restore_checked(step, target, sharding, saved_layout)
        except Exception as e:
            raise CheckpointCorruptError(
                f"checkpoint step {step} in {self.directory} is unusable: {_one_line(e, self.directory)}"
            ) from e

    def _restore_newest(self, like: Any, sharding: Any, saved_layout: bool) -> tuple[int, Any, dict[str, Any] | None]:
        """:meth:`restore` of the newest good step: a bad one is marked and the next older tried, a step off the
        run's schedule skipped with a warning; a template or configuration that does not fit raises."""
        steps = sorted((s for s in self._manager.all_steps() if s not in self._bad_steps), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        failures: list[str] = []
        for s in steps:
            try:
                self._check_complete(s)
                target = None
            except Exception as e:
                target = e
            if target is None:
                try:
                    target = like(s) if callable(like) else like
                except StepUnfitError as e:  # a step the run's schedule cannot reach: skipped, not bad
                    print(
                        f"ivhl checkpoint: WARNING: skipped step {s} in {self.directory}: {e}",
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                self._check_run(s)  # another configuration's step: the caller's error, raised, nothing marked
                self._check_template(s, target)  # a wrong template is the caller's error: raised, nothing marked
                try:
                    restored = self._restore_checked(s, target, sharding, saved_layout)
                except Exception as e:
                    target = e
                else:
                    # Said only once a good one is found: when none is, the one error below lists them all.
                    for failure in failures:
                        print(
                            f"ivhl checkpoint: WARNING: skipped bad checkpoint {failure} in {self.directory}; "
                            f"restored step {s}",
                            file=sys.stderr,
                            flush=True,
                        )
                    return restored
            self._bad_steps.add(s)
            failures.append(f"step {s} ({_one_line(target, self.directory)})")
        if not failures:
            raise ValueError(
                f"no checkpoint in {self.directory} fits this run's schedule (each skipped above); use --no-resume "
                "to start over"
            )
        raise CheckpointCorruptError(
            f"no usable checkpoint in {self.directory}: "
            + "; ".join(failures)
            + f"; use --no-resume (or delete {self.directory}) to start over"
        )

    def _check_complete(self, step: int) -> None:
        """Checks of the step's files before Orbax is asked to read them: a stray or half-deleted step folder, a
        file missing or of another size than when it was saved (truncated), Orbax's JSON metadata unreadable.

        Orbax reads the arrays of a step concurrently; when one read fails it abandons the others mid-flight
        (their coroutines are never finished, and the event loop they report to is closed), which prints
        screens of "Exception ignored" and "Event loop is closed" tracebacks. A step refused here is never
        handed to Orbax."""
        folder = self._step_dir(step)
        for name in ("_CHECKPOINT_METADATA", "state"):
            if not os.path.exists(os.path.join(folder, name)):
                raise FileNotFoundError(f"{os.path.join(folder, name)} is missing")
        try:
            with open(os.path.join(folder, CHECKSUM_FILE)) as f:
                recorded = json.load(f).get(FILES_KEY)
        except (OSError, ValueError, AttributeError):
            recorded = None  # a checkpoint saved without the record (multi-process, or older): Orbax checks
        if isinstance(recorded, dict):
            for rel, size in recorded.items():
                path = os.path.join(folder, rel)
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"{path} is missing")
                held = os.path.getsize(path)
                if held != size:
                    raise ValueError(
                        f"{path} is {'truncated' if held < size else 'damaged'}: {held} bytes, {size} when saved"
                    )
        for root, _, names in os.walk(folder):
            for name in names:
                if name.startswith(_JSON_FILES) and not name.endswith(".tmp"):
                    path = os.path.join(root, name)
                    try:
                        with open(path, "rb") as f:
                            json.loads(f.read())
                    except (OSError, ValueError) as e:
                        raise ValueError(f"{path} is damaged (not readable JSON: {e})") from e

    def _run_record(self, step: int) -> dict[str, Any] | None:
        """The step's record of the run that wrote it (configuration, library version, checksums); None for a
        step written without one or whose record does not parse (Orbax's own checks then judge the step)."""
        item = os.path.join(self._step_dir(step), RUN_ITEM)
        names = os.listdir(item) if os.path.isdir(item) else []
        for name in names:
            if name.startswith(".") or name.endswith(".txt"):
                continue
            try:
                with open(os.path.join(item, name), "rb") as f:
                    doc = json.loads(f.read())
            except (OSError, ValueError, RecursionError):
                return None
            return doc if isinstance(doc, dict) else None
        return None

    def leaf_paths(self, step: int) -> list[str] | None:
        """The key paths (``jax.tree_util.keystr``) of the arrays checkpoint ``step`` holds, sorted, read from its
        recorded checksums; None where none were recorded (a multi-process save). A caller that restores only what
        a run saved (e.g. the train state without the history a streamed run keeps in its store) builds its
        template from these."""
        if step not in self._manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; available: {self.all_steps()}")
        saved = self._recorded_sums(step)
        return None if saved is None else sorted(saved)

    def _recorded_sums(self, step: int) -> dict[str, Any] | None:
        """``{keypath: {"sha256", "dtype", "shape"}}`` recorded for the step: committed with it, else (a step
        written before the record was committed with it) the checksum file; None where neither holds them."""
        record = self._run_record(step)
        if record is not None and isinstance(record.get("sums"), dict):
            return record["sums"]
        try:
            with open(os.path.join(self._step_dir(step), CHECKSUM_FILE)) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(saved, dict):
            return None
        sums = {k: v for k, v in saved.items() if k != FILES_KEY and isinstance(v, dict)}
        return sums or None

    def _check_run(self, step: int) -> None:
        """ValueError naming the keys when the step was written by another configuration than this
        checkpointer's ``config`` (the caller's folder holds another run's step; nothing is marked bad)."""
        record = self._run_record(step) or {}
        old = record.get("config")
        if self.config is None or not isinstance(old, dict):
            return
        skip = set(self.extendable)
        diff = sorted(k for k in set(old) & set(self.config) - skip if old[k] != self.config[k])
        if diff:
            raise ValueError(
                f"checkpoint step {step} in {self.directory} was written by a different configuration (differs in "
                f"{diff}, library {record.get('library')}); use --no-resume to start over or another --out"
            )

    def _check_template(self, step: int, like: Any) -> None:
        """ValueError when ``like`` does not fit what the step saved: a leaf of another shape or dtype, a leaf the
        step lacks or one it holds that the template lacks. The caller's template is wrong, the checkpoint is
        fine: nothing is marked bad. Read from the step's recorded checksums, which name every saved array by its
        key path with its shape and dtype; without them (a multi-process save) Orbax checks."""
        saved = self._recorded_sums(step)
        if saved is None:
            return
        fix = "restore into a template of the saved structure, shapes and dtypes (the checkpoint itself is fine)"
        seen = set()
        for keypath, leaf in jax.tree_util.tree_flatten_with_path(like)[0]:
            key = jax.tree_util.keystr(keypath)
            shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
            if shape is None or dtype is None:
                continue  # a Python scalar: not recorded
            seen.add(key)
            rec = saved.get(key)
            if not isinstance(rec, dict) or not isinstance(rec.get("shape"), list):
                raise ValueError(
                    f"the template's leaf {key} is not in checkpoint step {step} in {self.directory} (it holds "
                    f"{sorted(saved)}); {fix}"
                )
            held = tuple(rec["shape"])
            key_leaf = jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
            if key_leaf:
                held = held[: len(shape)]  # saved as key data: the key array's shape plus the key's own
            if tuple(shape) != held and not (tuple(shape) == () and held == (1,)):  # scalars are hashed as 1-d
                raise ValueError(
                    f"the template's leaf {key} has shape {tuple(shape)} but checkpoint step {step} in "
                    f"{self.directory} holds shape {held} there; {fix}"
                )
            if not key_leaf and str(np.dtype(dtype)) != rec.get("dtype"):
                raise ValueError(
                    f"the template's leaf {key} has dtype {np.dtype(dtype)} but checkpoint step {step} in "
                    f"{self.directory} holds {rec.get('dtype')} there (a restore never casts); {fix}"
                )
        extra = sorted(set(saved) - seen)
        if extra:
            raise ValueError(
                f"checkpoint step {step} in {self.directory} holds leaves the template lacks ({extra}); {fix}"
            )

    def _on_saved_layout(self, step: int, target: Any) -> Any:
        """``target`` with each leaf that has no sharding, or one device's, while the step saved it over several
        devices, on the sharding it was saved with (when this process's devices hold that layout)."""
        try:
            saved_tree = self._manager.item_metadata(step)["state"]
            saved_tree = getattr(saved_tree, "tree", saved_tree)
        except Exception:  # noqa: BLE001 - no sharding record (an older step): the template's placement stands
            return target
        saved = {
            key_names(p): leaf
            for p, leaf in jax.tree_util.tree_flatten_with_path(
                saved_tree, is_leaf=lambda x: hasattr(x, "sharding") and hasattr(x, "shape")
            )[0]
        }
        devices = {d.id for d in jax.devices()}

        def place(path: Any, leaf: Any) -> Any:
            current = leaf.sharding
            if current is not None and len(current.device_set) > 1:
                return leaf  # the template's own layout
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                return leaf
            meta = getattr(saved.get(key_names(path)), "sharding", None)
            try:
                want = meta.to_jax_sharding() if meta is not None else None
            except Exception:  # noqa: BLE001 - a layout these devices cannot hold: the template's stands
                return leaf
            if want is None or len(want.device_set) < 2 or not {d.id for d in want.device_set} <= devices:
                return leaf
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=want)

        return jax.tree_util.tree_map_with_path(place, target)

    def _restore_checked(
        self, step: int, like: Any, sharding: Any, saved_layout: bool = False
    ) -> tuple[int, Any, dict[str, Any] | None]:
        ocp = _ocp()
        target = abstract_like(like, sharding)
        if saved_layout and sharding is None:
            target = self._on_saved_layout(step, target)
        items = self._manager.item_metadata(step)
        args = {"state": ocp.args.StandardRestore(target)}
        # The JSON item reports no metadata of its own; its presence as a key is what tells.
        has_meta = items is not None and "metadata" in items.keys()
        if has_meta:
            args["metadata"] = ocp.args.JsonRestore()
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(**args))
        except Exception as e:
            failure: Exception | None = e
        else:
            failure = None
        if failure is not None:
            # Raised again without Orbax's tracebacks, whose frames hold the abandoned reads: they are
            # unreachable, and collected quietly, before the caller sees the failure.
            cause: BaseException | None = failure
            seen: set[int] = set()
            while cause is not None and id(cause) not in seen:
                seen.add(id(cause))
                cause.__traceback__ = None
                cause = cause.__cause__ or cause.__context__
            _collect_abandoned_reads()
            raise failure
        state = out["state"]
        self._verify(step, state)
        return int(step), state, (dict(out["metadata"]) if has_meta else None)

    def _verify(self, step: int, state: Any) -> None:
        """Compare with the step's recorded checksums and require finite floating values. A step with none
        recorded (saved before its record was committed with it) is summed now, once its values are found
        finite, so that a later change of its bytes is caught."""
        sums = self._recorded_sums(step)
        for keypath, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
            key = jax.tree_util.keystr(keypath)
            a = _host_array(leaf)
            if a is not None and sums is not None and key in sums:
                rec = sums[key]
                if (
                    str(a.dtype) == rec["dtype"]
                    and list(a.shape) == rec["shape"]
                    and hashlib.sha256(a.tobytes()).hexdigest() != rec["sha256"]
                ):
                    raise ValueError(f"checksum mismatch in leaf {key} (the data on disk changed after it was saved)")
            dtype = getattr(leaf, "dtype", None)
            if dtype is None or not jax.dtypes.issubdtype(dtype, np.inexact):
                continue
            parts = [a] if a is not None else [np.asarray(sh.data) for sh in leaf.addressable_shards]
            if not all(np.isfinite(p).all() for p in parts):
                raise ValueError(f"restored leaf {key} holds non-finite values (NaN or inf)")
        if sums is None:
            fresh = _leaf_sums(state)
            if fresh:
                self._write_sums(step, fresh)

    def wait(self) -> None:
        """Block until any asynchronous save has been committed to disk (checksum files included)."""
        self._manager.wait_until_finished()
        self._flush_sums(finished=True)

    def close(self) -> None:
        """Finish any save, close Orbax's manager and release the folder's lock."""
        try:
            self.wait()
            self._manager.close()
        finally:
            self._release_lock()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _is_abandoned_orbax_read(unraisable: Any) -> bool:
    """Whether an unraisable exception is Orbax's: a read coroutine closed unfinished, or its event loop gone."""
    obj = unraisable.object
    code = getattr(obj, "cr_code", None) or getattr(obj, "__code__", None)
    where = getattr(code, "co_filename", "") or getattr(obj, "__module__", "") or ""
    return "orbax" in where or "asyncio" in where


def _collect_abandoned_reads() -> None:
    """Collect, without a word, the read coroutines Orbax abandons when one read of a step fails.

    Orbax reads a step's arrays concurrently and, when one fails, drops the others unfinished; each one
    closed later by the garbage collector prints an "Exception ignored in: <coroutine ...>" traceback at a
    random later moment (under pytest, a warning raised in an unrelated test). Collecting them here, with the
    unraisable hook narrowed to those, keeps the restore's failure to the one line the caller gets."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not _is_abandoned_orbax_read(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        gc.collect()
        # The failure the caller receives (and may keep, e.g. pytest.raises) still references the event loop's
        # frames, so some abandoned reads outlive the collection above: close every suspended Orbax read
        # coroutine now. Only reads are closed (an asynchronous save may be suspended in another thread).
        for obj in gc.get_objects():
            if (
                inspect.iscoroutine(obj)
                and "orbax" in obj.cr_code.co_filename
                and "read" in obj.cr_code.co_name
                and obj.cr_frame is not None
                and not obj.cr_running
            ):
                try:
                    obj.close()
                except Exception:  # noqa: BLE001 - a read abandoned mid-way may refuse to close cleanly
                    pass
    finally:
        sys.unraisablehook = previous


def _check_folder(directory: str) -> None:
    """ValueError when ``directory``, or the nearest part of its path that exists, is not a folder."""
    probe = directory
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return
        probe = parent
    if not os.path.isdir(probe):
        what = "is a file" if probe == directory else f"lies under {probe}, which is a file"
        raise ValueError(
            f"checkpoint directory {directory} {what}, not a folder; pass a folder path (it is created if missing)"
        )


def _file_sizes(folder: str) -> dict[str, int]:
    """``{path relative to folder: size in bytes}`` of every file of the items under step folder ``folder``
    (``state/...``, ``metadata/...``). The step's own top-level files are left out: Orbax may still update its
    step metadata once the step is in place (and the checksum file is this record)."""
    out = {}
    for root, _, names in os.walk(folder):
        if os.path.samefile(root, folder):
            continue
        for name in names:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = os.path.getsize(path)
    return out


def _library_version() -> str:
    """The installed ivhl_jax version ("unknown" when it is not installed as a distribution)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("ivhl_jax")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def key_names(path: Any) -> tuple[str, ...]:
    """A pytree key path as plain names: a dict key, an attribute name and a sequence index alike (Orbax's
    metadata tree holds a dataclass's fields as dict keys); any other entry as its text less punctuation."""
    names = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                names.append(str(getattr(k, attr)))
                break
        else:
            names.append(re.sub(r"\W", "", str(k)))
    return tuple(names)


def _one_line(e: BaseException, directory: str | None = None) -> str:
    """A short cause for a one-line message: TensorStore's spec dumps dropped, a file named by its path under
    ``directory``, at most 200 characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    text = re.split(r" ?\[tensorstore_spec=| ?See full TensorStore details", text)[0]
    files = re.findall(r'file "([^"]+)"', text)
    if files:  # TensorStore nests "Error reading X in ... of local file F: reason": keep the file and the reason
        text = f"{files[-1]}: {text.rsplit(': ', 1)[-1]}"
    if directory:
        text = text.replace(directory.rstrip(os.sep) + os.sep, "")
    if len(text) > 200:
        text = text[:197] + "..."
    return text if isinstance(e, (ValueError, FileNotFoundError)) else f"{type(e).__name__}: {text}"
