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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from ivhl_jax.core.validation import check_scalar

__all__ = ["abstract_like", "Checkpointer"]


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
    """

    def __init__(self, directory: str | os.PathLike, *, save_every: int = 1, keep: int = 3,
                 async_save: bool = False):
        check_scalar(save_every, "save_every", integer=True, minimum=1)
        check_scalar(keep, "keep", integer=True, minimum=1)
        self.directory = os.path.abspath(os.fspath(directory))
        self.save_every = int(save_every)
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
            item_handlers={"state": ocp.StandardCheckpointHandler(), "metadata": ocp.JsonCheckpointHandler()},
        )

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None if there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, *, metadata: Mapping[str, Any] | None = None,
             force: bool = False) -> bool:
        """Write ``state`` (and JSON-serialisable ``metadata``) as checkpoint ``step``.

        Returns True if a checkpoint was written. Steps not divisible by ``save_every`` are skipped
        unless ``force``.
        """
        check_scalar(step, "step", integer=True, nonnegative=True)
        step = int(step)
        if not force and step % self.save_every != 0:
            return False
        if step in self._manager.all_steps():
            return False
        args = {"state": ocp.args.StandardSave(state)}
        if metadata is not None:
            args["metadata"] = ocp.args.JsonSave(dict(metadata))
        self._manager.save(step, args=ocp.args.Composite(**args), force=True)
        return True

    def restore(self, like: Any, step: int | None = None, *, sharding: Any = None
                ) -> tuple[int, Any, dict[str, Any] | None]:
        """Restore checkpoint ``step`` (default: latest) into the structure of ``like``.

        Args:
          like: a pytree with the target structure, shapes and dtypes (concrete arrays or
            ``jax.ShapeDtypeStruct``); leaf shardings are used unless ``sharding`` is given.
          sharding: a ``jax.sharding.Sharding`` for every leaf, or a matching tree of them, to
            restore onto a different mesh or device count.

        Returns:
          (step, state, metadata) with metadata None if none was saved.
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        elif step not in self._manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; "
                                    f"available: {self.all_steps()}")
        target = abstract_like(like, sharding)
        items = self._manager.item_metadata(step)
        args = {"state": ocp.args.StandardRestore(target)}
        # The JSON item reports no metadata of its own; its presence as a key is what tells.
        has_meta = items is not None and "metadata" in items.keys()
        if has_meta:
            args["metadata"] = ocp.args.JsonRestore()
        out = self._manager.restore(step, args=ocp.args.Composite(**args))
        return int(step), out["state"], (dict(out["metadata"]) if has_meta else None)

    def wait(self) -> None:
        """Block until any asynchronous save has been committed to disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
