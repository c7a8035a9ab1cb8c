"""The host's facts, read in one place: CPU model, instruction-set flags, the cores this process may use.

:func:`facts` is the one reader of ``/proc/cpuinfo`` (and of the process's affinity mask and the machine's CPU
count); :mod:`ivhl_jax.core.backend` (core counts), :mod:`ivhl_jax.core.tuning_cache` (the machine fingerprint),
``ivhl info`` and the benchmark headers ask it. It starts no JAX backend and imports nothing from ivhl_jax, so it
can be called while XLA's flags and the affinity mask can still be set.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import platform as _platform

__all__ = ["HostFacts", "facts", "installed"]


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """What this host is and what this process may use of it.

    Attributes:
      cpu_model: the CPU's model name (``/proc/cpuinfo``; elsewhere ``platform.processor()`` or the machine).
      cpu_flags: every flag ``/proc/cpuinfo`` lists (x86 ``flags``, ARM ``Features``), sorted; empty elsewhere.
      core_ids: the ids of the cores this process may run on (its affinity mask on Linux: ``taskset``, cgroups),
        sorted; elsewhere every core of the machine.
      machine_cores: the machine's logical CPU count (``os.cpu_count()``; 1 where unknown).
      machine: ``platform.machine()`` (``x86_64``, ``arm64``, ...).
      system: ``platform.system()`` (``Linux``, ``Darwin``, ...).
    """

    cpu_model: str
    cpu_flags: tuple[str, ...]
    core_ids: tuple[int, ...]
    machine_cores: int
    machine: str
    system: str

    @property
    def cores(self) -> int:
        """How many cores this process may run on (``len(core_ids)``)."""
        return len(self.core_ids)


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, tuple[str, ...]]:
    """(model name, flags) from ``/proc/cpuinfo``, read once per process (they do not change while it runs)."""
    model, flags = "", tuple[str, ...]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware", "cpu model") and not model:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = tuple(sorted(set(value.split())))
    except OSError:  # not Linux: the platform module's names, no flags
        pass
    return model or _platform.processor() or _platform.machine(), flags


def facts() -> HostFacts:
    """This host's facts now (the CPU's model and flags are read once per process; the affinity mask each call,
    since :func:`ivhl_jax.run.device.limit_host_cores` may narrow it)."""
    model, flags = _cpuinfo()
    machine_cores = os.cpu_count() or 1
    try:
        core_ids = tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux: every core of the machine
        core_ids = tuple(range(machine_cores))
    return HostFacts(
        cpu_model=model,
        cpu_flags=flags,
        core_ids=core_ids,
        machine_cores=machine_cores,
        machine=_platform.machine(),
        system=_platform.system(),
    )


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here (found on the path; nothing is imported)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken parent package
        return False
