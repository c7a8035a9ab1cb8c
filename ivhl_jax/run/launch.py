"""Multi-process launch: ``ivhl launch --nproc N -- <command>`` and :func:`initialize` for the workers.

One script runs unchanged from one CPU to many hosts:

* alone (``python train.py``): :func:`initialize` does nothing; one process, all local devices;
* ``ivhl launch --nproc N -- python train.py``: N local processes; the launcher exports
  ``IVHL_COORDINATOR`` (``127.0.0.1:PORT``, a free port), ``IVHL_NUM_PROCESSES`` and
  ``IVHL_PROCESS_ID`` and :func:`initialize` passes them to ``jax.distributed.initialize`` with the
  coordinator bound to 127.0.0.1 only;
* SLURM (``srun``), Open MPI (``mpirun``) or Cloud TPU pods: :func:`initialize` lets JAX's cluster
  auto-detection pick coordinator, process count and id.

Failure is bounded, never a hang. Every process heartbeats to the coordination service; a process
that misses heartbeats for ``heartbeat_timeout`` seconds is declared dead and the service stops every
other process with an error (jax's ``heartbeat_timeout_seconds``). The launcher adds a second line of
defence: when one child exits non-zero it terminates the rest after ``--grace`` seconds and returns
that exit code.

A worker that raises must not linger: :func:`initialize` installs an exception hook that prints the
traceback and ends the process at once (``os._exit``), instead of letting JAX's distributed shutdown wait
for peers that are still computing. The launcher relays every worker line with a ``[rank i]`` prefix,
drops routine Gloo/absl chatter (``--verbose`` keeps it), and when a rank fails names the rank that
failed first (by exit time, not by rank number) and shows its traceback in one block as soon as it is
seen; its last line repeats that root cause, so the errors the peers report in consequence cannot bury it.

A hang is bounded too. A rank that blocks (a deadlock, an endless wait, a ``sleep``) keeps heartbeating, so the
coordination service never fails it, and its peers wait in their next collective for ever. The launcher watches
the CPU time of every worker's process tree: when no live rank has used more than 5 % of a core for
``stall_timeout`` seconds (default: the heartbeat timeout), the job is hung. It asks every rank for its Python
stacks (:func:`initialize` registers ``faulthandler`` on SIGUSR1), names every rank with the line its main
thread stopped at (the rank stuck elsewhere than its peers is the one they wait for in their collective), stops
every process and exits 124.
A single computation that runs longer than the timeout is not a hang: it uses CPU.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import faulthandler
import functools
import linecache
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = [
    "ENV_COORDINATOR",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "ENV_HEARTBEAT",
    "ENV_INIT_TIMEOUT",
    "HANG_EXIT_CODE",
    "free_port",
    "parser",
    "detect_environment",
    "initialize",
    "child_env",
    "launch",
    "main",
    "is_noise",
    "NOISE",
]

ENV_COORDINATOR = "IVHL_COORDINATOR"
ENV_NUM_PROCESSES = "IVHL_NUM_PROCESSES"
ENV_PROCESS_ID = "IVHL_PROCESS_ID"
ENV_HEARTBEAT = "IVHL_HEARTBEAT_TIMEOUT"
ENV_INIT_TIMEOUT = "IVHL_INIT_TIMEOUT"
#: exit code of ``ivhl launch`` when the job hung (no rank used CPU for the stall timeout), as ``timeout`` gives
HANG_EXIT_CODE = 124
#: a rank using less than this fraction of one core counts as idle (JAX's heartbeat threads use ~0.3 %)
_IDLE_CPU_FRACTION = 0.05

_CLUSTER_MARKERS = {
    "slurm": ("SLURM_JOB_ID", "SLURM_NTASKS"),
    "ompi": ("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE"),
    "tpu": ("TPU_WORKER_HOSTNAMES", "CLOUD_TPU_TASK_ID"),
}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def detect_environment(env: dict[str, str] | None = None) -> str:
    """Which launcher started this process: ``"ivhl"``, ``"slurm"``, ``"ompi"``, ``"tpu"`` or ``"single"``.

    SLURM counts only when it started more than one task (an interactive ``salloc`` shell with one
    task is a single process).
    """
    env = dict(os.environ if env is None else env)
    if ENV_COORDINATOR in env:
        return "ivhl"
    if "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1")) or 1) > 1:
        return "slurm"
    if "OMPI_COMM_WORLD_SIZE" in env and int(env["OMPI_COMM_WORLD_SIZE"]) > 1:
        return "ompi"
    if "TPU_WORKER_HOSTNAMES" in env and "," in env["TPU_WORKER_HOSTNAMES"]:
        return "tpu"
    return "single"


def initialize(
    *,
    heartbeat_timeout: int | None = None,
    initialization_timeout: int | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, int | str]:
    """Join the distributed system this process was started in; a no-op for a single process.

    Call once at the top of a script, before any JAX computation. Returns ``{"environment",
    "process_id", "num_processes"}``.

    Args:
      heartbeat_timeout: seconds without a heartbeat after which a peer counts as dead and every
        process is stopped with an error (default: ``$IVHL_HEARTBEAT_TIMEOUT`` or 30; jax's own
        default is 100).
      initialization_timeout: seconds to wait for all peers to join (default ``$IVHL_INIT_TIMEOUT``
        or 120).
    """
    import jax

    env = dict(os.environ if env is None else env)
    kind = detect_environment(env)
    hb = int(heartbeat_timeout if heartbeat_timeout is not None else env.get(ENV_HEARTBEAT, 30))
    it = int(initialization_timeout if initialization_timeout is not None else env.get(ENV_INIT_TIMEOUT, 120))
    if hb < 1 or it < 1:
        raise ValueError(f"heartbeat_timeout ({hb}) and initialization_timeout ({it}) must be >= 1 second")
    if kind == "single":
        return {"environment": kind, "process_id": 0, "num_processes": 1}
    if jax.distributed.is_initialized():
        return {"environment": kind, "process_id": jax.process_index(), "num_processes": jax.process_count()}
    init = functools.partial(jax.distributed.initialize, initialization_timeout=it, heartbeat_timeout_seconds=hb)
    if kind == "ivhl":
        address = env[ENV_COORDINATOR]
        n = int(env[ENV_NUM_PROCESSES])
        pid = int(env[ENV_PROCESS_ID])
        if not 0 <= pid < n:
            raise ValueError(f"{ENV_PROCESS_ID}={pid} must lie in [0, {ENV_NUM_PROCESSES}={n})")
        init(coordinator_address=address, num_processes=n, process_id=pid, coordinator_bind_address=address)
    else:
        # SLURM / Open MPI / TPU: jax reads the cluster's own variables.
        init()
    _exit_on_uncaught_exception()
    if kind == "ivhl" and hasattr(signal, "SIGUSR1"):
        # `ivhl launch` asks a hung job for its stacks with SIGUSR1 (see launch()); without this it would kill us
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    return {"environment": kind, "process_id": jax.process_index(), "num_processes": jax.process_count()}


def _exit_on_uncaught_exception() -> None:
    """Make an uncaught exception end this process at once, after its traceback is printed.

    Without this a raising worker runs its ``atexit`` handlers, and JAX's ``distributed.shutdown`` waits at
    a barrier for peers that are still computing (they in turn wait for it in their next collective):
    the failure surfaces only when the heartbeat timeout or the peers' end arrives, if ever. Exiting with
    ``os._exit`` stops the heartbeats, so the coordination service fails the peers within the heartbeat
    timeout, and ``ivhl launch`` sees the failure immediately.
    """
    previous = sys.excepthook
    if getattr(previous, "_ivhl_exit_hook", False):
        return

    def hook(kind, value, tb):
        try:
            previous(kind, value, tb)
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # a closed stream must not keep the process alive
                    pass
            os._exit(130 if issubclass(kind, KeyboardInterrupt) else 1)

    hook._ivhl_exit_hook = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _xla_flags_with_devices(flags: str, n: int) -> str:
    parts = [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
    parts.append(f"--xla_force_host_platform_device_count={n}")
    return " ".join(parts)


def _check_int(value: Any, name: str, lo: int, hi: int | None = None) -> None:
    """A launcher argument must be an int in [lo, hi] (plain Python: the launcher never imports JAX)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")


def child_env(
    process_id: int,
    nproc: int,
    port: int,
    *,
    devices_per_process: int | None = None,
    heartbeat_timeout: int = 30,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of local worker ``process_id`` (what ``ivhl launch`` exports)."""
    _check_int(nproc, "nproc", 1)
    _check_int(process_id, "process_id", 0, nproc - 1)
    _check_int(port, "port", 1, 65535)
    _check_int(heartbeat_timeout, "heartbeat_timeout", 1)
    if devices_per_process is not None:
        _check_int(devices_per_process, "devices_per_process", 1)
    env = dict(os.environ if base is None else base)
    env[ENV_COORDINATOR] = f"127.0.0.1:{port}"
    env[ENV_NUM_PROCESSES] = str(nproc)
    env[ENV_PROCESS_ID] = str(process_id)
    env[ENV_HEARTBEAT] = str(heartbeat_timeout)
    if devices_per_process is not None:
        env["XLA_FLAGS"] = _xla_flags_with_devices(env.get("XLA_FLAGS", ""), devices_per_process)
    return env


# Lines of routine chatter that ``ivhl launch`` drops from worker output (``--verbose`` keeps them): Gloo's
# connection report, absl's pre-initialisation banner, and the note JAX's preemption notifier logs when the
# launcher itself sends SIGTERM. Errors (absl ``E``/``F`` lines, tracebacks) always pass.
NOISE = (
    re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks"),
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called"),
    re.compile(r"^[IW]\d{4} [\d:.]+\s+\d+ preemption_notifier\.cc:\d+\] SIGTERM caught"),
    re.compile(r"^I\d{4} [\d:.]+\s+\d+ \S+\.cc:\d+\] "),  # absl INFO lines
)


def is_noise(line: str) -> bool:
    """True for a worker output line that is routine chatter (see :data:`NOISE`)."""
    return any(p.search(line) for p in NOISE)


class _Relay:
    """Copies one worker's stdout and stderr to the launcher's, each line prefixed ``[rank i]``.

    The tail of the worker's stderr is kept so the launcher can show the traceback of the rank that
    failed first in one block, apart from the errors its peers report in consequence.
    """

    def __init__(self, rank: int, proc: subprocess.Popen, *, quiet: bool, lock: threading.Lock, tail: int = 400):
        self.rank = rank
        self.err_tail: collections.deque[str] = collections.deque(maxlen=tail)
        self._quiet = quiet
        self._lock = lock
        self._threads = [
            threading.Thread(target=self._pump, args=(stream, target, keep), daemon=True)
            for stream, target, keep in ((proc.stdout, sys.stdout, False), (proc.stderr, sys.stderr, True))
            if stream is not None
        ]
        for t in self._threads:
            t.start()

    def _pump(self, stream: Any, target: Any, keep: bool) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if self._quiet and is_noise(line):
                continue
            if keep:
                self.err_tail.append(line)
            with self._lock:
                target.write(f"[rank {self.rank}] {line}\n")
                target.flush()
        stream.close()

    def join(self, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def traceback(self) -> list[str]:
        """The last Python traceback in the worker's stderr (to its final line), or its last 10 lines."""
        lines = list(self.err_tail)
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
        return lines[starts[-1] :] if starts else lines[-10:]


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch(
    command: Sequence[str],
    nproc: int,
    *,
    devices_per_process: int | None = None,
    port: int | None = None,
    heartbeat_timeout: int = 30,
    grace: float = 10.0,
    timeout: float | None = None,
    prefix_output: bool = True,
    quiet: bool = True,
    stall_timeout: float | None = None,
) -> int:
    """Start ``nproc`` local copies of ``command`` wired together; return the first non-zero exit code (or 0).

    When a child fails (an uncaught exception: :func:`initialize` makes the worker exit at once instead
    of waiting in JAX's distributed shutdown for its peers; a signal; a non-zero exit), the launcher
    prints which rank failed and that rank's traceback, gives the others ``grace`` seconds to fail on
    their own (the coordination service stops them within ``heartbeat_timeout``) and then sends
    SIGTERM, then SIGKILL. ``timeout`` bounds the whole run (exit code 124). A child killed by a signal
    gives 128 + the signal number, as a shell does.

    Args:
      prefix_output: relay each worker's stdout/stderr line by line with a ``[rank i]`` prefix (else the
        children write straight to the launcher's terminal and no traceback summary can be shown).
      quiet: drop routine Gloo/absl chatter from the relayed output (:func:`is_noise`).
      stall_timeout: seconds after which a job none of whose live ranks uses CPU counts as hung (a rank
        blocked outside a collective its peers wait in): the launcher shows each rank's stack, names the
        stuck rank, stops every process and returns :data:`HANG_EXIT_CODE`. Default: ``heartbeat_timeout``;
        0 turns the check off (Linux only: it reads ``/proc``).
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    stall = float(heartbeat_timeout if stall_timeout is None else stall_timeout)
    if not stall >= 0:
        raise ValueError(f"stall_timeout must be >= 0 seconds (0: off), got {stall_timeout}")
    if not command:
        raise ValueError("no command given: use `ivhl launch --nproc N -- python script.py ...`")
    port = free_port() if port is None else int(port)

    class _Stop(Exception):
        pass

    def _on_sigterm(signum, frame):
        raise _Stop

    # A launcher stopped by SIGTERM (a scheduler, `timeout`) must not leave its children running.
    old_handler = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    job = _Job(start=time.monotonic())
    try:
        _start_children(
            job,
            command,
            nproc,
            port,
            devices_per_process=devices_per_process,
            heartbeat_timeout=heartbeat_timeout,
            prefix_output=prefix_output,
            quiet=quiet,
        )
        stopped = _supervise(job, stall=stall, grace=grace, timeout=timeout)
        if stopped is not None:
            return stopped
    except KeyboardInterrupt:
        _terminate(job.procs)
        return 130
    except _Stop:
        _terminate(job.procs)
        return 143
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
        for r in job.relays:
            r.join()
    return _exit_code(job, nproc)


@dataclasses.dataclass
class _Job:
    """The launched processes, their relays, and the first failure seen (its exit code and rank)."""

    start: float
    procs: list[subprocess.Popen] = dataclasses.field(default_factory=list)
    relays: list[_Relay] = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    first_bad: int | None = None
    first_rank: int = 0


def _start_children(
    job: _Job,
    command: Sequence[str],
    nproc: int,
    port: int,
    *,
    devices_per_process: int | None,
    heartbeat_timeout: int,
    prefix_output: bool,
    quiet: bool,
) -> None:
    """Start the ``nproc`` ranks of ``command`` (each with its :func:`child_env`) into ``job``, one relay each when
    their output is prefixed."""
    pipe = subprocess.PIPE if prefix_output else None
    for i in range(nproc):
        env = child_env(i, nproc, port, devices_per_process=devices_per_process, heartbeat_timeout=heartbeat_timeout)
        if quiet:
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # absl INFO off; warnings and errors stay
        if prefix_output:
            env.setdefault("PYTHONUNBUFFERED", "1")  # relayed lines in the order the worker wrote them
        job.procs.append(subprocess.Popen(list(command), env=env, stdout=pipe, stderr=pipe))
        if prefix_output:
            job.relays.append(_Relay(i, job.procs[-1], quiet=quiet, lock=job.lock))


def _supervise(job: _Job, *, stall: float, grace: float, timeout: float | None) -> int | None:
    """Poll the ranks until all have exited: the first failure is reported (and the others stopped ``grace``
    seconds later). Returns the launcher's exit code when it stops the job itself (a hang, the ``timeout``),
    else None."""
    procs = job.procs
    # One waiter per child stamps its exit time: when a failure brings its peers down within milliseconds,
    # the earliest exit (not the lowest rank seen in one poll) is the cause to report.
    exited: dict[int, float] = {}
    for i, proc in enumerate(procs):
        threading.Thread(
            target=lambda i=i, proc=proc: (proc.wait(), exited.setdefault(i, time.monotonic())), daemon=True
        ).start()
    watch = _StallWatch([p.pid for p in procs], stall) if stall > 0 else None
    failed_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if job.first_bad is None:
            bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                time.sleep(0.02)  # let the waiters of children that ended together stamp their times
                first = min(bad, key=lambda i: exited.get(i, float("inf")))
                job.first_bad, job.first_rank = codes[first], first
                failed_at = time.monotonic()
                _report_failure(first, int(codes[first] or 0), job.relays[first] if job.relays else None, job.lock)
        if all(c is not None for c in codes):
            return None
        now = time.monotonic()
        if watch is not None and job.first_bad is None:
            live = [i for i, c in enumerate(codes) if c is None]
            if watch.hung(live, now):
                return _stop_hung_job(procs, job.relays, live, watch, job.lock, job.start)
        if failed_at is not None and now - failed_at > grace:
            _terminate(procs)
            return None
        if timeout is not None and now - job.start > timeout:
            print(f"ivhl launch: timeout after {timeout:.0f} s; stopping all processes", file=sys.stderr)
            _terminate(procs)
            return 124
        time.sleep(0.05)


def _exit_code(job: _Job, nproc: int) -> int:
    """0 when every rank succeeded; else the first failure's code (128 + the signal for a signal), after one line
    that names its rank and repeats its root cause, so it is not lost under the errors its peers reported."""
    if job.first_bad is None:
        return 0
    code = int(job.first_bad) if job.first_bad > 0 else 128 - int(job.first_bad)
    cause = ""
    if job.relays:
        tb = job.relays[job.first_rank].traceback()
        if tb and tb[0].startswith("Traceback"):
            cause = f": {tb[-1].strip()}"
    print(
        f"ivhl launch: process {job.first_rank} failed first ({_describe_exit(int(job.first_bad))}{cause}); all "
        f"{nproc} processes stopped {time.monotonic() - job.start:.1f} s after the start; exit code {code}",
        file=sys.stderr,
    )
    return code


def _report_failure(rank: int, code: int, relay: _Relay | None, lock: threading.Lock) -> None:
    """Say which rank failed first and show its traceback, before the consequent errors of its peers."""
    if relay is not None:
        relay.join()  # the failed process's pipes are at EOF: its whole output is in
    with lock:
        print(f"ivhl launch: process {rank} {_describe_exit(code)}; stopping the others", file=sys.stderr)
        if relay is not None:
            lines = relay.traceback()
            what = "traceback" if lines and lines[0].startswith("Traceback") else "last output"
            print(f"---- process {rank}: {what} ----", file=sys.stderr)
            for line in lines or ["(no output)"]:
                print(f"[rank {rank}] {line}", file=sys.stderr)
            print("----", file=sys.stderr, flush=True)


class _StallWatch:
    """Tracks, once a second, when each rank's process tree last used more than 5 % of a core."""

    def __init__(self, pids: list[int], stall: float):
        self.pids, self.stall = pids, stall
        self.tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        now = time.monotonic()
        self.active_at = [now] * len(pids)
        self.cpu: list[float | None] = [None] * len(pids)
        self.sampled = now
        self.enabled = os.path.isdir("/proc")

    def _tree_cpu(self) -> dict[int, float]:
        """CPU seconds used so far by each rank's process and all its descendants (a shell wrapper's child)."""
        parent: dict[int, int] = {}
        used: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            rest = data[data.rindex(b")") + 2 :].split()  # after "pid (comm) ": state ppid ... utime stime
            parent[int(entry)] = int(rest[1])
            used[int(entry)] = (int(rest[11]) + int(rest[12])) / self.tick
        children: dict[int, list[int]] = collections.defaultdict(list)
        for pid, ppid in parent.items():
            children[ppid].append(pid)
        out = {}
        for root in self.pids:
            total, todo = 0.0, [root]
            while todo:
                pid = todo.pop()
                total += used.get(pid, 0.0)
                todo.extend(children.get(pid, ()))
            out[root] = total
        return out

    def hung(self, live: list[int], now: float) -> bool:
        """True when every live rank has been idle for ``stall`` seconds."""
        if not self.enabled or not live or now - self.sampled < 1.0:
            return False
        try:
            cpu = self._tree_cpu()
        except OSError:
            return False
        dt = now - self.sampled
        self.sampled = now
        for i, pid in enumerate(self.pids):
            before, self.cpu[i] = self.cpu[i], cpu.get(pid)
            if before is None or self.cpu[i] is None or self.cpu[i] - before > _IDLE_CPU_FRACTION * dt:  # type: ignore[operator]
                self.active_at[i] = now
        return all(now - self.active_at[i] >= self.stall for i in live)


_STACK_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")
_STACK_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+)$')


def _main_thread_frame(lines: Sequence[str]) -> tuple[str, int, str] | None:
    """The innermost frame (file, line, function) of the main thread in the last faulthandler dump in ``lines``.

    faulthandler lists the newest thread first, so the main thread is the last block of a dump.
    """
    blocks: list[list[tuple[str, int, str]]] = []
    current: list[tuple[str, int, str]] | None = None
    for line in lines:
        if _STACK_HEADER.match(line):
            current = []
            blocks.append(current)
        elif current is not None and (m := _STACK_FRAME.match(line)):
            current.append((m["file"], int(m["line"]), m["func"]))
        else:
            current = None
    blocks = [b for b in blocks if b]
    return blocks[-1][0] if blocks else None


def _in_jax(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return "jax" in parts or "jaxlib" in parts


def _stop_hung_job(
    procs: list[subprocess.Popen],
    relays: list[_Relay],
    live: list[int],
    watch: _StallWatch,
    lock: threading.Lock,
    start: float,
) -> int:
    """Show every live rank's stack, name where each rank stopped, stop all processes; return 124."""
    with lock:
        print(
            f"ivhl launch: no process used CPU for {watch.stall:.0f} s: the job hangs; asking processes "
            f"{', '.join(map(str, live))} for their stacks",
            file=sys.stderr,
            flush=True,
        )
    if relays:
        for i in live:
            try:
                procs[i].send_signal(signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(1.5)  # the dumps arrive through the relays
    where = {i: _main_thread_frame(list(relays[i].err_tail)) if relays else None for i in live}
    _terminate(procs)
    for r in relays:
        r.join()

    def at(frame: tuple[str, int, str]) -> str:
        code = linecache.getline(frame[0], frame[1]).strip()
        return f"{os.path.basename(frame[0])}:{frame[1]} in {frame[2]}" + (f" ({code})" if code else "")

    known = {i: f for i, f in where.items() if f is not None}
    in_jax = [i for i in known if _in_jax(known[i][0])]
    outside = [i for i in known if i not in in_jax]
    places = {known[i] for i in known}
    if not known:
        first = min(live, key=lambda i: watch.active_at[i])
        cause = f"process {first} went idle first (no stacks: was initialize() called?)"
    elif len(places) == 1 and len(known) > 1:
        cause = (
            f"processes {', '.join(map(str, known))} all wait at {at(next(iter(places)))}: a deadlock or an "
            "endless wait"
        )
    else:
        # SPMD ranks run the same code: one that stopped somewhere else than its peers (outside JAX, while
        # they wait inside a JAX call / collective) is the one they wait for
        parts = [f"process {i} stopped at {at(known[i])}" for i in outside]
        parts += [f"process {i} waits in a JAX call at {at(known[i])}" for i in in_jax]
        cause = "; ".join(parts)
    print(
        f"ivhl launch: hang: {cause}; all {len(procs)} processes stopped "
        f"{time.monotonic() - start:.1f} s after the start; exit code {HANG_EXIT_CODE}",
        file=sys.stderr,
    )
    return HANG_EXIT_CODE


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _terminate(procs: list[subprocess.Popen], wait: float = 3.0) -> None:
    # JAX installs a SIGTERM handler in its workers (the preemption notifier) that only logs, so a worker
    # that ignores SIGTERM is killed after ``wait`` seconds.
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + wait
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def parser() -> argparse.ArgumentParser:
    """The parser of ``ivhl launch``'s own options (those before ``--``); a usage error is one line."""
    from ivhl_jax.run.config import OneLineArgumentParser

    p = OneLineArgumentParser(
        prog="ivhl launch",
        description="Start N local JAX processes wired with jax.distributed (coordinator on 127.0.0.1). "
        "In the script call ivhl_jax.run.launch.initialize() first; under SLURM/MPI/TPU the same "
        "call auto-detects the cluster.",
        epilog="example: ivhl launch --nproc 2 --devices-per-process 4 -- python train.py",
    )
    p.add_argument("--nproc", type=int, required=True, help="number of processes")
    for flag, kind, default, text in (
        (
            "--devices-per-process",
            int,
            None,
            "emulated CPU devices per process (sets --xla_force_host_platform_device_count)",
        ),
        ("--port", int, None, "coordinator port (default: a free one)"),
        (
            "--heartbeat-timeout",
            int,
            30,
            "seconds after which a silent process counts as dead and all stop (default 30)",
        ),
        ("--grace", float, 10.0, "seconds the others get to exit after one fails, before SIGTERM (default 10)"),
        ("--timeout", float, None, "wall-clock limit of the whole run in seconds"),
        (
            "--stall-timeout",
            float,
            None,
            "seconds without CPU use in every process after which the job counts as hung: the stuck rank is named "
            "and all stop with exit code 124 (default: the heartbeat timeout; 0: off)",
        ),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument(
        "--verbose", action="store_true", help="keep Gloo/absl chatter in the workers' output (dropped by default)"
    )
    p.add_argument(
        "--no-prefix",
        action="store_true",
        help="let the workers write straight to this terminal (no [rank i] prefix, no traceback summary)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``ivhl launch --nproc N [--devices-per-process K] [--port P] -- command ...``"""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1 :]
    else:
        own, command = argv, []
    p = parser()
    a = p.parse_args(own)
    if a.nproc < 1:
        p.error(f"--nproc must be >= 1, got {a.nproc}")
    if a.devices_per_process is not None and a.devices_per_process < 1:
        p.error(f"--devices-per-process must be >= 1, got {a.devices_per_process}")
    if a.heartbeat_timeout < 1:
        p.error(f"--heartbeat-timeout must be >= 1, got {a.heartbeat_timeout}")
    if a.stall_timeout is not None and not a.stall_timeout >= 0:
        p.error(f"--stall-timeout must be >= 0 (0: off), got {a.stall_timeout}")
    if not command:
        p.error("no command: put it after `--`, e.g. `ivhl launch --nproc 2 -- python train.py`")
    return launch(
        command,
        a.nproc,
        devices_per_process=a.devices_per_process,
        port=a.port,
        heartbeat_timeout=a.heartbeat_timeout,
        grace=a.grace,
        timeout=a.timeout,
        prefix_output=not a.no_prefix,
        quiet=not a.verbose,
        stall_timeout=a.stall_timeout,
    )


if __name__ == "__main__":
    sys.exit(main())
