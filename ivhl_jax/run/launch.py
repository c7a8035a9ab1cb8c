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
"""

from __future__ import annotations

import argparse
import collections
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

__all__ = ["ENV_COORDINATOR", "ENV_NUM_PROCESSES", "ENV_PROCESS_ID", "ENV_HEARTBEAT", "ENV_INIT_TIMEOUT",
    "free_port", "detect_environment", "initialize", "child_env", "launch", "main", "is_noise", "NOISE"]

ENV_COORDINATOR = "IVHL_COORDINATOR"
ENV_NUM_PROCESSES = "IVHL_NUM_PROCESSES"
ENV_PROCESS_ID = "IVHL_PROCESS_ID"
ENV_HEARTBEAT = "IVHL_HEARTBEAT_TIMEOUT"
ENV_INIT_TIMEOUT = "IVHL_INIT_TIMEOUT"

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


def initialize(*, heartbeat_timeout: int | None = None, initialization_timeout: int | None = None,
               env: dict[str, str] | None = None) -> dict[str, int | str]:
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
    if kind == "ivhl":
        address = env[ENV_COORDINATOR]
        n = int(env[ENV_NUM_PROCESSES])
        pid = int(env[ENV_PROCESS_ID])
        if not 0 <= pid < n:
            raise ValueError(f"{ENV_PROCESS_ID}={pid} must lie in [0, {ENV_NUM_PROCESSES}={n})")
        jax.distributed.initialize(coordinator_address=address, num_processes=n, process_id=pid,
                                   coordinator_bind_address=address, initialization_timeout=it,
                                   heartbeat_timeout_seconds=hb)
    else:
        # SLURM / Open MPI / TPU: jax reads the cluster's own variables.
        jax.distributed.initialize(initialization_timeout=it, heartbeat_timeout_seconds=hb)
    _exit_on_uncaught_exception()
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


def child_env(process_id: int, nproc: int, port: int, *, devices_per_process: int | None = None,
              heartbeat_timeout: int = 30, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of local worker ``process_id`` (what ``ivhl launch`` exports)."""
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

    def __init__(self, rank: int, proc: subprocess.Popen, *, quiet: bool, lock: threading.Lock,
                 tail: int = 400):
        self.rank = rank
        self.err_tail: collections.deque[str] = collections.deque(maxlen=tail)
        self._quiet = quiet
        self._lock = lock
        self._threads = [threading.Thread(target=self._pump, args=(stream, target, keep), daemon=True)
                         for stream, target, keep in ((proc.stdout, sys.stdout, False), (proc.stderr, sys.stderr, True))
                         if stream is not None]
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
        return lines[starts[-1]:] if starts else lines[-10:]


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch(command: Sequence[str], nproc: int, *, devices_per_process: int | None = None, port: int | None = None,
           heartbeat_timeout: int = 30, grace: float = 10.0, timeout: float | None = None,
           prefix_output: bool = True, quiet: bool = True) -> int:
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
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if not command:
        raise ValueError("no command given: use `ivhl launch --nproc N -- python script.py ...`")
    port = free_port() if port is None else int(port)

    class _Stop(Exception):
        pass

    def _on_sigterm(signum, frame):
        raise _Stop

    # A launcher stopped by SIGTERM (a scheduler, `timeout`) must not leave its children running.
    old_handler = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    procs: list[subprocess.Popen] = []
    relays: list[_Relay] = []
    lock = threading.Lock()
    start = time.monotonic()
    first_bad: int | None = None
    first_rank = 0
    failed_at: float | None = None
    pipe = subprocess.PIPE if prefix_output else None
    try:
        for i in range(nproc):
            env = child_env(i, nproc, port, devices_per_process=devices_per_process,
                            heartbeat_timeout=heartbeat_timeout)
            if quiet:
                env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # absl INFO off; warnings and errors stay
            if prefix_output:
                env.setdefault("PYTHONUNBUFFERED", "1")  # relayed lines in the order the worker wrote them
            procs.append(subprocess.Popen(list(command), env=env, stdout=pipe, stderr=pipe))
            if prefix_output:
                relays.append(_Relay(i, procs[-1], quiet=quiet, lock=lock))
        # One waiter per child stamps its exit time: when a failure brings its peers down within milliseconds,
        # the earliest exit (not the lowest rank seen in one poll) is the cause to report.
        exited: dict[int, float] = {}
        for i, proc in enumerate(procs):
            threading.Thread(target=lambda i=i, proc=proc: (proc.wait(), exited.setdefault(i, time.monotonic())),
                             daemon=True).start()
        while True:
            codes = [p.poll() for p in procs]
            if first_bad is None:
                bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    time.sleep(0.02)  # let the waiters of children that ended together stamp their times
                    first = min(bad, key=lambda i: exited.get(i, float("inf")))
                    first_bad, first_rank = codes[first], first
                    failed_at = time.monotonic()
                    _report_failure(first, int(codes[first] or 0), relays[first] if relays else None, lock)
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if failed_at is not None and now - failed_at > grace:
                _terminate(procs)
                break
            if timeout is not None and now - start > timeout:
                print(f"ivhl launch: timeout after {timeout:.0f} s; stopping all processes", file=sys.stderr)
                _terminate(procs)
                return 124
            time.sleep(0.05)
    except KeyboardInterrupt:
        _terminate(procs)
        return 130
    except _Stop:
        _terminate(procs)
        return 143
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
        for r in relays:
            r.join()
    if first_bad is not None:
        code = int(first_bad) if first_bad > 0 else 128 - int(first_bad)
        cause = ""
        if relays:
            tb = relays[first_rank].traceback()
            if tb and tb[0].startswith("Traceback"):
                cause = f": {tb[-1].strip()}"
        # The last line repeats the root cause, so it is not lost under the errors the peers reported after it.
        print(f"ivhl launch: process {first_rank} failed first ({_describe_exit(int(first_bad))}{cause}); all "
              f"{nproc} processes stopped {time.monotonic() - start:.1f} s after the start; exit code {code}",
              file=sys.stderr)
        return code
    return 0


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


def main(argv: Sequence[str] | None = None) -> int:
    """``ivhl launch --nproc N [--devices-per-process K] [--port P] -- command ...``"""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1:]
    else:
        own, command = argv, []
    p = argparse.ArgumentParser(
        prog="ivhl launch",
        description="Start N local JAX processes wired with jax.distributed (coordinator on 127.0.0.1). "
                    "In the script call ivhl_jax.run.launch.initialize() first; under SLURM/MPI/TPU the same "
                    "call auto-detects the cluster.",
        epilog="example: ivhl launch --nproc 2 --devices-per-process 4 -- python train.py")
    p.add_argument("--nproc", type=int, required=True, help="number of processes")
    p.add_argument("--devices-per-process", type=int, default=None,
                   help="emulated CPU devices per process (sets --xla_force_host_platform_device_count)")
    p.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    p.add_argument("--heartbeat-timeout", type=int, default=30,
                   help="seconds after which a silent process counts as dead and all stop (default 30)")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds the others get to exit after one fails, before SIGTERM (default 10)")
    p.add_argument("--timeout", type=float, default=None, help="wall-clock limit of the whole run in seconds")
    p.add_argument("--verbose", action="store_true",
                   help="keep Gloo/absl chatter in the workers' output (dropped by default)")
    p.add_argument("--no-prefix", action="store_true",
                   help="let the workers write straight to this terminal (no [rank i] prefix, no traceback summary)")
    a = p.parse_args(own)
    if a.nproc < 1:
        p.error(f"--nproc must be >= 1, got {a.nproc}")
    if a.devices_per_process is not None and a.devices_per_process < 1:
        p.error(f"--devices-per-process must be >= 1, got {a.devices_per_process}")
    if a.heartbeat_timeout < 1:
        p.error(f"--heartbeat-timeout must be >= 1, got {a.heartbeat_timeout}")
    if not command:
        p.error("no command: put it after `--`, e.g. `ivhl launch --nproc 2 -- python train.py`")
    return launch(command, a.nproc, devices_per_process=a.devices_per_process, port=a.port,
                  heartbeat_timeout=a.heartbeat_timeout, grace=a.grace, timeout=a.timeout,
                  prefix_output=not a.no_prefix, quiet=not a.verbose)


if __name__ == "__main__":
    sys.exit(main())
