"""Drive a long jitted simulation in chunks: progress display, periodic checkpoints, exact resume.

The time loop itself is always a ``lax.scan`` inside a jitted ``advance`` function that runs
``steps_per_chunk`` steps (see :func:`ivhl_jax.numerics.rollout.rollout`). Between chunks control returns
to Python only to update the progress bar and write a checkpoint, so the host never touches
individual steps. Because ``advance`` is a pure function of the state, a run stopped after chunk
``k`` and resumed from its checkpoint computes bit-identical results to an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.run.store import RunStore, leaf_names
from ivhl_jax.run.store_format import record_rates
from ivhl_jax.train.checkpoint import Checkpointer, StepUnfitError

__all__ = [
    "Advance",
    "RunResult",
    "RunInterrupted",
    "run_chunked",
    "restore_chunked",
    "RestoredRun",
    "phase",
    "chunks_started",
]

Advance = Callable[[Any], tuple[Any, Any]]


@dataclasses.dataclass
class RunResult:
    """Outcome of :func:`run_chunked`.

    Attributes:
      state: final state.
      history: observations of every chunk concatenated along axis 0 (with a ``sink``: none, zero records;
        the records are in the store, ``sink.read(history)``).
      steps: total steps completed.
      resumed_from: the step a checkpoint was restored from (None for a fresh run).
      wall_time_s: wall time of this invocation (compile included).
      metadata: checkpoint metadata restored on resume (None otherwise).
      steps_run: steps run by this invocation (``steps`` less the resumed ones): divide by ``wall_time_s``
        for a rate.
    """

    state: Any
    history: Any
    steps: int
    resumed_from: int | None
    wall_time_s: float
    metadata: dict[str, Any] | None = None
    steps_run: int = 0

    def rate_line(self, unit: str = "steps") -> str:
        """``"N steps in X s (compile included)"`` for the steps this invocation ran."""
        return f"{self.steps_run} {unit} in {self.wall_time_s:.1f} s (compile included)"


_CHUNKS_STARTED = [0]  # chunks dispatched by run_chunked in this process


def chunks_started() -> int:
    """How many chunks :func:`run_chunked` has dispatched in this process: a caller that compares the count
    before and after a failure knows whether any work had started (the CLI reports an error raised before
    the first chunk as a configuration error)."""
    return _CHUNKS_STARTED[0]


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_chunked`: the completed steps were checkpointed first.

    Attributes:
      step: steps completed when the interrupt arrived.
      checkpoint_step: the newest checkpoint on disk (None without a checkpointer).
    """

    def __init__(self, step: int, checkpoint_step: int | None):
        super().__init__(f"interrupted at step {step}; newest checkpoint: step {checkpoint_step}")
        self.step = step
        self.checkpoint_step = checkpoint_step


@contextlib.contextmanager
def phase(name: str, *, enabled: bool = True, detail: str = "") -> Iterator[Callable[[str], None]]:
    """Announce a long phase on stderr so a terminal is never silent: ``name (detail) ...`` when it starts and
    ``name: done in X s`` when it ends; the yielded ``note(text)`` prints ``name: text (X s)`` in between.

    Compilation, a ground-state search or data loading can take seconds to minutes before the first
    progress-bar update; this line says which phase is running. ``enabled=False`` prints nothing.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string naming the phase, got {name!r}")
    t0 = time.perf_counter()

    def note(text: str) -> None:
        if enabled:
            print(f"{name}: {text} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    if enabled:
        print(f"{name}{f' ({detail})' if detail else ''} ...", file=sys.stderr, flush=True)
    yield note
    if enabled:
        print(f"{name}: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def _concat(chunks: list[Any], template: Any) -> Any:
    if not chunks:  # host arrays: an eager jnp.zeros (or a transfer of an empty array) compiles a program per leaf
        return jax.tree_util.tree_map(lambda o: np.zeros((0,) + o.shape[1:], o.dtype), template)
    return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs, axis=0), *chunks)


def _progress_reporter(enabled: bool, description: str, total: int, start: int) -> Callable[[Any, Any], None]:
    """A callback ``report(step, obs)`` (``report(None, None)`` closes it).

    A rich progress bar on a terminal; otherwise (CI logs, notebooks) about ten plain lines.
    """
    if not enabled:
        return lambda step, obs: None
    if sys.stderr.isatty():
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        bar.start()
        task = bar.add_task(description, total=total, completed=start)

        def report(step, obs):
            if step is None:
                bar.stop()
                return
            jax.block_until_ready(obs)
            bar.update(task, completed=step)

        return report
    t0 = time.perf_counter()
    every = max(1, (total - start) // 10)
    last = [start]

    def report_plain(step, obs):
        if step is None:
            return
        if step - last[0] >= every or step == total:
            jax.block_until_ready(obs)
            last[0] = step
            print(
                f"{description}: {step}/{total} steps ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True
            )

    return report_plain


@contextlib.contextmanager
def _sigint_flag() -> Iterator[list[bool]]:
    """While chunks run, the first Ctrl-C only sets a flag that the loop checks after each chunk.

    Python's default handler raises KeyboardInterrupt at the next bytecode; when that happens to run inside a
    callback the interpreter calls (e.g. JAX's gc callback) the exception is printed as "ignored" and the
    interrupt is lost, so the run would go on to its end. A second Ctrl-C raises at once. Only the main
    thread can install signal handlers; elsewhere the default behaviour is kept."""
    flag = [False]
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame: Any) -> None:
        if flag[0]:
            raise KeyboardInterrupt
        flag[0] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def _carried_metadata(restored: Mapping[str, Any] | None, given: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The metadata a checkpoint of a resumed run records: ``given`` over what the restored checkpoint held, a
    key ``given`` leaves None (a record the resumed run did not compute again, such as a search done before the
    first step) keeping its restored value, so what the outputs report survives any number of resumes."""
    if not restored:
        return given
    if given is None:
        return dict(restored)
    return {**restored, **{k: v for k, v in given.items() if v is not None or k not in restored}}


def _check_chunking(advance: Advance, n_chunks: int, steps_per_chunk: int, sink: RunStore | None) -> None:
    """The arguments of :func:`run_chunked` that need no tracing, each refused in one line."""
    check_scalar(n_chunks, "n_chunks", integer=True, nonnegative=True)
    check_scalar(steps_per_chunk, "steps_per_chunk", integer=True, minimum=1)
    built = getattr(advance, "steps_per_chunk", None)  # an advance of numerics.rollout.chunked says its own
    if built is not None and built != steps_per_chunk:
        raise ValueError(
            f"steps_per_chunk={steps_per_chunk}, but advance runs {built} steps per call (chunked(stepper, {built})): "
            f"pass steps_per_chunk={built} so the step count, checkpoints and records agree"
        )
    if sink is not None and not isinstance(sink, RunStore):
        raise TypeError(f"sink must be an ivhl_jax.run.store.RunStore or None, got {type(sink).__name__}")


def _observation_template(advance: Advance, state: Any, sink: RunStore | None) -> tuple[Any, int]:
    """The shapes of one chunk's observations, and (with a sink) the most records per chunk any leaf holds."""
    _, obs_template = jax.eval_shape(advance, state)
    leaves = jax.tree_util.tree_leaves(obs_template)
    if sink is not None and any(not o.shape for o in leaves):
        raise ValueError(
            f"with a sink every observation leaf needs a leading record axis, got shapes {[o.shape for o in leaves]}"
        )
    # records per chunk: the most any leaf holds (the others hold one per chunk, on their own store dimension)
    return obs_template, record_rates(leaf_names(obs_template), leaves) if sink is not None else 0


@dataclasses.dataclass
class _Start:
    """Where a run starts: its state, the history chunks held, chunks done, and what a checkpoint restored."""

    state: Any
    chunks: list[Any]
    done: int = 0
    resumed_from: int | None = None
    metadata: dict[str, Any] | None = None


@dataclasses.dataclass
class RestoredRun:
    """A chunked run's state as its checkpoint holds it (:func:`restore_chunked`).

    Attributes:
      state: the run's state (the structure of the template it was restored into).
      history: the observations of the chunks done, concatenated along axis 0 (``done`` × per-chunk records per
        leaf); None for a streamed run, whose records are in its store.
      step: the step the checkpoint was written at.
      done: the chunks done, ``step // steps_per_chunk``.
      metadata: the checkpoint's metadata (None if none was saved).
    """

    state: Any
    history: Any
    step: int
    done: int
    metadata: dict[str, Any] | None = None


def _holds_history(checkpointer: Checkpointer, step: int) -> bool:
    """Whether checkpoint ``step`` holds a run history (a run without a store writes one; a streamed run does not).
    A save that recorded no leaf paths (a multi-process save) counts as streamed."""
    return any(p.startswith("['history']") for p in checkpointer.leaf_paths(step) or ())


def restore_chunked(
    checkpointer: Checkpointer,
    state: Any,
    obs_template: Any,
    *,
    steps_per_chunk: int,
    n_chunks: int | None = None,
    streamed: bool | None = None,
) -> RestoredRun | None:
    """Restore a :func:`run_chunked` run from the newest good checkpoint of ``checkpointer`` that fits its schedule.

    Args:
      checkpointer: the run's :class:`~ivhl_jax.train.checkpoint.Checkpointer`.
      state: a state of the run (its structure, shapes and dtypes: e.g. a fresh one, or
        ``jax.ShapeDtypeStruct`` leaves); a leaf it leaves unplaced comes back on the layout it was saved with.
      obs_template: one chunk's observations (arrays or ``jax.ShapeDtypeStruct``, leading axis the chunk's
        records): the history template is ``step // steps_per_chunk`` of them along axis 0.
      steps_per_chunk: the run's steps per chunk (a checkpoint at a step that is not a multiple is passed over,
        with a warning, for an older one).
      n_chunks: the run's length in chunks; a checkpoint beyond it is refused in one line (None: no bound).
      streamed: True, the run wrote its records to a store and the checkpoint holds the state alone; False, it
        holds the history too; None, read from the checkpoint (whether it holds a ``history``).

    Returns:
      A :class:`RestoredRun` (state, history or None, step, chunks done, metadata), or None when the
      checkpointer holds no checkpoint.
    """
    check_scalar(steps_per_chunk, "steps_per_chunk", integer=True, minimum=1)
    if checkpointer.latest_step() is None:
        return None

    def like(step: int) -> dict[str, Any]:
        # The history's length depends on the step: the checkpointer may fall back to an older good one.
        if step % steps_per_chunk:  # not a step this run writes (a stray one): the newest fitting one is used
            raise StepUnfitError(f"it is not a multiple of steps_per_chunk={steps_per_chunk}")
        if n_chunks is not None and step // steps_per_chunk > n_chunks:
            raise ValueError(f"checkpoint at step {step} is beyond the requested {n_chunks * steps_per_chunk} steps")
        if streamed or (streamed is None and not _holds_history(checkpointer, step)):
            return {"state": state}  # the history is in the run's store (Orbax cannot store an empty array)
        history_like = jax.tree_util.tree_map(
            lambda o: jax.ShapeDtypeStruct(((step // steps_per_chunk) * o.shape[0],) + o.shape[1:], o.dtype),
            obs_template,
        )
        return {"state": state, "history": history_like}

    step, restored, metadata = checkpointer.restore(like, saved_layout=True)
    return RestoredRun(restored["state"], restored.get("history"), step, step // steps_per_chunk, metadata)


def _resume(
    checkpointer: Checkpointer | None,
    state: Any,
    obs_template: Any,
    *,
    n_chunks: int,
    steps_per_chunk: int,
    streamed: bool,
) -> _Start:
    """The start of a run: ``state`` afresh, or the newest checkpoint that fits the run's schedule
    (:func:`restore_chunked`)."""
    restored = None
    if checkpointer is not None:
        restored = restore_chunked(
            checkpointer, state, obs_template, steps_per_chunk=steps_per_chunk, n_chunks=n_chunks, streamed=streamed
        )
    if restored is None:
        return _Start(state, [])
    chunks = [] if restored.history is None else [restored.history]
    return _Start(restored.state, chunks, restored.done, restored.step, restored.metadata)


def _saver(
    checkpointer: Checkpointer | None,
    sink: RunStore | None,
    metadata: Mapping[str, Any] | Callable[[int, Any], Mapping[str, Any]] | None,
    start: _Start,
    obs_template: Any,
) -> Callable[[int, Any, list[Any], bool], None]:
    """``save(step, state, chunks, force)``: one checkpoint of the run (nothing without a checkpointer), after the
    store holds every record it counts, with the metadata carried over from a restored checkpoint."""

    def save(step: int, state: Any, chunks: list[Any], force: bool) -> None:
        if checkpointer is None:
            return
        if sink is not None:
            sink.flush()  # a checkpoint never counts a record the store lacks
        meta = _carried_metadata(start.metadata, metadata(step, state) if callable(metadata) else metadata)
        payload = {"state": state} if sink is not None else {"state": state, "history": _concat(chunks, obs_template)}
        checkpointer.save(step, payload, metadata=meta, force=force)

    return save


def _advance_chunks(
    advance: Advance,
    start: _Start,
    *,
    n_chunks: int,
    steps_per_chunk: int,
    checkpointer: Checkpointer | None,
    save: Callable[[int, Any, list[Any], bool], None],
    report: Callable[[Any, Any], None],
    sink: RunStore | None,
    per_chunk: int,
    compiling: str | None,
) -> tuple[Any, list[Any]]:
    """Chunks ``start.done .. n_chunks - 1``: each one's records to the sink or the history, a checkpoint on the
    checkpointer's schedule and at the end; a Ctrl-C checkpoints the steps done and raises :class:`RunInterrupted`.
    Returns the final state and the history chunks."""
    done = start.done
    # (state, history chunks, completed step) replaced by one assignment, so a Ctrl-C arriving between two
    # statements never sees a state that disagrees with its history
    snapshot = (start.state, start.chunks, done * steps_per_chunk)
    saved_step = snapshot[2]
    try:
        with _sigint_flag() as interrupted:
            for k in range(done, n_chunks):
                _CHUNKS_STARTED[0] += 1
                if k == done:
                    # The first call compiles (seconds to minutes for a large step): say so before and after. The
                    # call returns once the program is compiled and dispatched, so the time is the compile time.
                    with phase(compiling or "compiling", enabled=compiling is not None):
                        new_state, obs = advance(snapshot[0])
                else:
                    new_state, obs = advance(snapshot[0])
                if sink is not None:
                    # before the checkpoint that counts it; the state's snapshot is copied before the next chunk
                    sink.append(k * per_chunk, obs, step=(k + 1) * steps_per_chunk, state=new_state)
                    obs_kept: list[Any] = []
                else:
                    obs_kept = [obs]
                snapshot = (new_state, snapshot[1] + obs_kept, (k + 1) * steps_per_chunk)
                step = snapshot[2]
                report(step, obs)
                if checkpointer is not None and step % checkpointer.save_every == 0:
                    save(step, snapshot[0], snapshot[1], False)
                    saved_step = step
                if interrupted[0]:
                    raise KeyboardInterrupt
        if checkpointer is not None and n_chunks > done:
            save(n_chunks * steps_per_chunk, snapshot[0], snapshot[1], True)
            checkpointer.wait()
        if sink is not None:
            sink.flush()
    except KeyboardInterrupt:
        state, chunks, step = snapshot
        if checkpointer is not None and step > saved_step:
            save(step, state, chunks, True)
        if checkpointer is not None:
            checkpointer.wait()
        raise RunInterrupted(step, checkpointer.latest_step() if checkpointer is not None else None) from None
    finally:
        report(None, None)
    return snapshot[0], snapshot[1]


def run_chunked(
    advance: Advance,
    state: Any,
    *,
    n_chunks: int,
    steps_per_chunk: int,
    checkpointer: Checkpointer | None = None,
    metadata: Mapping[str, Any] | Callable[[int, Any], Mapping[str, Any]] | None = None,
    progress: bool = True,
    description: str = "simulating",
    sink: RunStore | None = None,
) -> RunResult:
    """Run ``n_chunks`` calls of ``advance(state) -> (state, observations)``.

    ``observations`` must have a leading axis (records within the chunk). If ``checkpointer``
    holds a checkpoint, the run resumes from it (state and the history so far) and continues to
    the same end, so interrupted and uninterrupted runs agree bit for bit. A checkpoint is written
    whenever the completed step count is a multiple of the checkpointer's ``save_every`` and at the
    end. ``metadata`` (a dict, or a function of (step, state) returning one) is stored with it; a resumed run
    keeps the restored metadata's entries that it gives as None.

    With a ``sink`` (:class:`ivhl_jax.run.store.RunStore`) each chunk's observations (and the snapshots of the
    state the store asks for) are written to the store, on a background thread that overlaps the next chunk, and
    kept neither in memory nor in the checkpoints; the store is flushed before every checkpoint. A resumed run
    first cuts the store back to its checkpoint, then writes the later records again (the same bits).

    With ``progress`` the first chunk's compilation is announced (``compiling <description> ...`` and
    ``compiling <description>: done in X s``, see :func:`phase`) and then a bar or plain lines report the steps.
    """
    _check_chunking(advance, n_chunks, steps_per_chunk, sink)
    t0 = time.perf_counter()
    obs_template, per_chunk = _observation_template(advance, state, sink)
    start = _resume(
        checkpointer, state, obs_template, n_chunks=n_chunks, steps_per_chunk=steps_per_chunk, streamed=sink is not None
    )
    if sink is not None:  # records written after the checkpoint are written again below
        sink.begin(
            obs_template,
            steps_per_chunk=steps_per_chunk,
            n_chunks=n_chunks,
            done_chunks=start.done,
            state_like=start.state,
        )
    report = _progress_reporter(
        progress and n_chunks > start.done, description, n_chunks * steps_per_chunk, start.done * steps_per_chunk
    )
    state, chunks = _advance_chunks(
        advance,
        start,
        n_chunks=n_chunks,
        steps_per_chunk=steps_per_chunk,
        checkpointer=checkpointer,
        save=_saver(checkpointer, sink, metadata, start, obs_template),
        report=report,
        sink=sink,
        per_chunk=per_chunk,
        compiling=f"compiling {description}" if progress else None,
    )
    history = _concat(chunks, obs_template)
    jax.block_until_ready((state, history))
    return RunResult(
        state=state,
        history=history,
        steps=n_chunks * steps_per_chunk,
        resumed_from=start.resumed_from,
        wall_time_s=time.perf_counter() - t0,
        metadata=start.metadata,
        steps_run=max(n_chunks - start.done, 0) * steps_per_chunk,
    )
