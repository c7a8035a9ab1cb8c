"""Per-backend defaults: the one place where the platform JAX runs on chooses a setting.

Every kernel and model that has a platform-dependent default (a chunk size, a layer loop, an engine)
reads it here with :func:`defaults`; no other module calls ``jax.default_backend()`` to choose a
setting. Each row of :data:`TABLE` names the measurement that chose it (:data:`EVIDENCE`: a results file
in ``bench/results/`` and the command that wrote it), MaxText style: configuration decides, code does not
sniff the backend.

A platform missing from the table (a new accelerator plugin) gets the ``"portable"`` row, which is never
the CPU-only choice: it assumes an accelerator with its own memory and no host kernels.

The table is the starting point: ``ivhl tune`` measures the choices on the machine it runs on and stores them
in a per-machine cache (:mod:`ivhl_jax.core.tuning_cache`), which :func:`defaults` reads before the table (per op and
problem-size bucket where the op passes ``op=`` and ``size=``); ``IVHL_TUNING=frozen`` uses the table alone.

Users see every setting in force, with its source, with ``ivhl info`` (:func:`describe`) and change it two ways::

    with ivhl_jax.core.backend.override(fields_chunking="pair_budget"):
        ...                                   # this block only (context-local)
    ivhl_jax.core.backend.configure("gpu", fields_memory_fraction=0.1)   # process-wide, one platform
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import types
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import jax

from ivhl_jax.core import host, tuning_cache

__all__ = [
    "Defaults",
    "TABLE",
    "EVIDENCE",
    "PLATFORMS",
    "platform",
    "platform_before_start",
    "started",
    "host_core_ids",
    "host_cores",
    "machine_cores",
    "defaults",
    "override",
    "configure",
    "reset",
    "describe",
]

PLATFORMS = ("cpu", "gpu", "tpu", "portable")


@dataclasses.dataclass(frozen=True)
class Defaults:
    """The tuned defaults of one platform (every field is a default; explicit arguments always win).

    Attributes:
      fields_chunking: how :func:`ivhl_jax.fields.superpose` picks ``chunk`` when none is given:
        ``"pair_budget"`` processes ``fields_pair_budget // M`` points per block (keeps the temporaries in
        a CPU's cache); ``"memory"`` takes the largest block whose temporaries fit
        ``fields_memory_fraction`` of the device's memory (on an accelerator a sequential chunk loop
        serialises the whole device).
      fields_pair_budget: point-source pairs per block under ``"pair_budget"``.
      fields_memory_fraction: fraction of device memory a block's temporaries may use under ``"memory"``.
      transformer_layer_loop: what ``layer_loop="auto"`` resolves to without remat (``"unrolled"`` or
        ``"scan"``).
      transposed_save_matmul: expanding projections save their input transposed for the weight gradient
        (works around the layout XLA:CPU picks for the unrolled layer loop).
      attention_half: the attention implementation ``"auto"`` uses for bf16/fp16 inputs.
      attention_dense: ``implementation="xla"`` attention runs the library's dense kernel (heads-major
        matmuls, a custom VJP that reuses the saved probabilities) instead of
        ``jax.nn.dot_product_attention(implementation="xla")``.
      cdt_engine: the CDT engine ``engine="auto"`` picks (``"host"``, ``"jax"`` or ``"pallas"``); the
        host engine falls back to ``"jax"`` where numba is missing.
      host_fft: whether ``fft="ducc"`` (a host FFT) is allowed.
      fields_method: the kernel of :func:`ivhl_jax.numerics.fastmath.point_source_sum` that
        :func:`ivhl_jax.fields.superpose` runs: ``"loop"`` (a loop over sources, one elementwise fusion per
        step: CPU), ``"reduce"`` (one fused reduction over all pairs per block: accelerators) or ``"pallas"``
        (the Pallas tile kernel :mod:`ivhl_jax.physics.fields_pallas`, float32; a GPU candidate ``ivhl tune``
        races, chosen by no row).
      fields_serial_pairs: blocks of at most this many (point, source) pairs run the ``"loop"`` kernel on one
        thread (XLA:CPU splits larger fusions over the cores, and each split costs a hand-off).

    A row is the starting point: :func:`defaults` applies this machine's measured choices from the tuning cache
    (:mod:`ivhl_jax.core.tuning_cache`, written by ``ivhl tune``) over it unless ``IVHL_TUNING=frozen``.
    """

    fields_chunking: Literal["pair_budget", "memory"]
    fields_pair_budget: int
    fields_memory_fraction: float
    transformer_layer_loop: Literal["unrolled", "scan"]
    transposed_save_matmul: bool
    attention_half: Literal["xla", "cudnn", "pallas", "chunked"]
    attention_dense: bool
    cdt_engine: Literal["host", "jax", "pallas"]
    host_fft: bool
    fields_method: Literal["loop", "reduce", "pallas"] = "loop"
    fields_serial_pairs: int = 1 << 22

    def __post_init__(self) -> None:
        if self.fields_chunking not in ("pair_budget", "memory"):
            raise ValueError(f"fields_chunking must be 'pair_budget' or 'memory', got {self.fields_chunking!r}")
        if not isinstance(self.fields_pair_budget, int) or self.fields_pair_budget < 1:
            raise ValueError(f"fields_pair_budget must be a positive int, got {self.fields_pair_budget!r}")
        if not 0.0 < float(self.fields_memory_fraction) <= 0.9:
            raise ValueError(f"fields_memory_fraction must be in (0, 0.9], got {self.fields_memory_fraction!r}")
        if self.transformer_layer_loop not in ("unrolled", "scan"):
            raise ValueError(
                f"transformer_layer_loop must be 'unrolled' or 'scan', got {self.transformer_layer_loop!r}"
            )
        if self.attention_half not in ("xla", "cudnn", "pallas", "chunked"):
            raise ValueError(f"attention_half must be one of xla, cudnn, pallas, chunked; got {self.attention_half!r}")
        if self.cdt_engine not in ("host", "jax", "pallas"):
            raise ValueError(f"cdt_engine must be 'host', 'jax' or 'pallas', got {self.cdt_engine!r}")
        if self.fields_method not in ("loop", "reduce", "pallas"):
            raise ValueError(f"fields_method must be 'loop', 'reduce' or 'pallas', got {self.fields_method!r}")
        if not isinstance(self.fields_serial_pairs, int) or self.fields_serial_pairs < 0:
            raise ValueError(f"fields_serial_pairs must be an int >= 0, got {self.fields_serial_pairs!r}")


def host_core_ids() -> list[int]:
    """The ids of the CPU cores this process may run on, sorted: its affinity mask on Linux (``taskset``,
    cgroups), else every core of the machine (:func:`ivhl_jax.core.host.facts`)."""
    return list(host.facts().core_ids)


def host_cores() -> int:
    """How many CPU cores this process may run on (:func:`host_core_ids`)."""
    return host.facts().cores


def machine_cores() -> int:
    """The machine's logical CPU count (``os.cpu_count()``; 1 where unknown), whatever this process may use."""
    return host.facts().machine_cores


def _cpu_serial_pairs() -> int:
    """The one-thread threshold of the CPU row: with two cores or fewer every default block (2**22 pairs) runs
    on one thread (measured, ``bench/results/fields_vs_torch_compile.json``); with more cores 2**19 pairs is an
    estimate that ``ivhl tune`` replaces with a measurement."""
    return 1 << 22 if host_cores() <= 2 else 1 << 19


#: setting -> (CPU value, accelerator value): the two measured rows side by side.
_ROWS: Mapping[str, tuple[Any, Any]] = {
    "fields_chunking": ("pair_budget", "memory"),
    "fields_pair_budget": (1 << 24, 1 << 22),
    "fields_memory_fraction": (0.25, 0.25),
    "transformer_layer_loop": ("unrolled", "scan"),
    "transposed_save_matmul": (True, False),
    "attention_half": ("xla", "cudnn"),
    "attention_dense": (True, False),
    "cdt_engine": ("host", "jax"),
    "host_fft": (True, False),
    "fields_method": ("loop", "reduce"),
    "fields_serial_pairs": (_cpu_serial_pairs(), 0),
}
_CPU = Defaults(**{name: cpu for name, (cpu, _) in _ROWS.items()})
_ACCELERATOR = Defaults(**{name: accelerator for name, (_, accelerator) in _ROWS.items()})

#: The row per platform. ``"portable"`` serves any platform not listed.
TABLE: Mapping[str, Defaults] = {
    "cpu": _CPU,
    "gpu": _ACCELERATOR,
    "tpu": dataclasses.replace(_ACCELERATOR, attention_half="xla"),
    "portable": dataclasses.replace(_ACCELERATOR, attention_half="xla"),
}

_TUNE_CPU = "bench/results/tune_cpu.json — ivhl tune --quick"
_UNMEASURED = "unmeasured (no results file times it on this platform; bench/gpu_tune_and_check.sh measures it)"

#: Why each setting has its value: ``{setting: {platform: "results file — command"}}``, every file inside this
#: repository. ``"unmeasured ..."`` marks a choice that has never been timed on that platform; a platform
#: without an entry runs the portable choice, not a measured one.
EVIDENCE: Mapping[str, Mapping[str, str]] = {
    "fields_chunking": {"cpu": _TUNE_CPU, "gpu": _UNMEASURED},
    "fields_pair_budget": {"cpu": _TUNE_CPU},
    "fields_memory_fraction": {"gpu": _UNMEASURED},
    "fields_method": {"cpu": _TUNE_CPU, "gpu": _UNMEASURED},
    "fields_serial_pairs": {
        "cpu": _TUNE_CPU + " (hosts with <= 2 cores; with more cores 2**19 is an estimate until tuned)"
    },
    "transformer_layer_loop": {
        "cpu": "bench/results/transformer_cpu_vs_torch.json — python -m ivhl_jax.bench.ops_transformer --vs-torch",
        "gpu": "bench/results/gpu_h100.json — python -m ivhl_jax.bench.gpu_checks",
    },
    "transposed_save_matmul": {
        "cpu": "bench/results/transformer_cpu_vs_torch.json — python -m ivhl_jax.bench.ops_transformer --vs-torch",
    },
    "attention_dense": {
        "cpu": "bench/results/transformer_cpu_vs_torch.json — python -m ivhl_jax.bench.ops_transformer --vs-torch",
    },
    "attention_half": {"gpu": "bench/results/gpu_h100.json — python -m ivhl_jax.bench.gpu_checks"},
    "cdt_engine": {
        "cpu": "bench/results/cdt_host_vs_2dcdt.json and bench/results/cdt_jax_scaling.json — python -m "
        "ivhl_jax.bench.ops_cdt --engines host,jax; " + _TUNE_CPU,
        "gpu": _UNMEASURED,
    },
    "host_fft": {
        "cpu": "bench/results/condensate_gp_step_xla_vs_ducc_cpu.json — ivhl bench --op gp_step "
        "--op gp_step_ducc --size extreme"
    },
}

_configured: dict[str, dict[str, Any]] = {}
_override: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "ivhl_backend_override", default=types.MappingProxyType({})
)
_FIELDS = frozenset(f.name for f in dataclasses.fields(Defaults))


def platform() -> str:
    """The platform JAX computes on (``jax.default_backend()``): ``"cpu"``, ``"gpu"``, ``"tpu"`` or a plugin's name.
    Starts the backend (use :func:`platform_before_start` where flags or the affinity mask must still be set)."""
    return jax.default_backend()


def platform_before_start() -> str:
    """The platform JAX will compute on, read without starting its backend: the first of ``JAX_PLATFORMS`` /
    ``jax_platforms`` when set ("cuda"/"rocm" read as "gpu"), else "gpu" or "tpu" when their JAX plugin is
    installed, else "cpu"."""
    import importlib.util

    names = getattr(jax.config, "jax_platforms", None) or os.environ.get("JAX_PLATFORMS", "")
    first = names.split(",")[0].strip().lower() if names else ""
    if first:
        return "gpu" if first in ("cuda", "rocm", "gpu") else first
    for plugin, name in (
        ("jax_cuda12_plugin", "gpu"),
        ("jax_cuda13_plugin", "gpu"),
        ("jax_rocm60_plugin", "gpu"),
        ("libtpu", "tpu"),
    ):
        if importlib.util.find_spec(plugin) is not None:
            return name
    return "cpu"


def started() -> bool:
    """Whether JAX has started its backends (after which XLA's flags and thread pools are fixed). False where
    JAX's internals do not say (both uses, flags and the affinity mask, are then harmless to try)."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return False


def _row(name: str) -> Defaults:
    base = TABLE.get(name, TABLE["portable"])
    return dataclasses.replace(base, **_configured[name]) if name in _configured else base


def _check_settings(settings: Mapping[str, Any]) -> None:
    unknown = sorted(set(settings) - _FIELDS)
    if unknown:
        raise ValueError(f"unknown backend setting(s) {unknown}; the settings are {sorted(_FIELDS)}")


def _measured(name: str, op: str | None, size: int | float | None) -> dict[str, tuple[Any, str]]:
    """``{setting: (value, source)}`` from this machine's tuning cache: the size-independent entries, then
    ``op``'s entry nearest to ``size``. Only for the platform JAX runs on (the cache measures this machine)."""
    if name != platform():
        return {}
    table = tuning_cache.entries(name)
    chosen: list[dict[str, Any]] = [e for k, e in sorted(table.items()) if k.endswith("|all")]
    if op is not None and size is not None:
        entry = tuning_cache.lookup(name, op, size)
        if entry is not None:
            chosen.append(entry)
    out: dict[str, tuple[Any, str]] = {}
    for entry in chosen:
        where = (
            f"measured {entry.get('measured_utc', '?')} ({entry.get('op', '?')} at "
            f"{entry.get('bucket', '?')}), {tuning_cache.cache_path(name)}"
        )
        for key, value in entry.get("settings", {}).items():
            if key in _FIELDS:
                out[key] = (value, where)
    return out


def defaults(platform_name: str | None = None, *, op: str | None = None, size: int | float | None = None) -> Defaults:
    """The defaults in force for ``platform_name`` (default: the current platform).

    In order, later wins: the table row, this machine's tuning cache (size-independent choices, then ``op``'s
    choice for the size bucket of ``size`` work items, when both are given; skipped under
    ``IVHL_TUNING=frozen``), :func:`configure`, :func:`override`. A cached value that no longer validates is
    ignored (the row's value stays)."""
    name = platform() if platform_name is None else str(platform_name)
    row = TABLE.get(name, TABLE["portable"])
    for key, (value, _) in _measured(name, op, size).items():
        try:
            row = dataclasses.replace(row, **{key: value})
        except (TypeError, ValueError):
            continue
    if name in _configured:
        row = dataclasses.replace(row, **_configured[name])
    over = _override.get()
    return dataclasses.replace(row, **over) if over else row


@contextlib.contextmanager
def override(**settings: Any) -> Iterator[Defaults]:
    """Within the ``with`` block (this thread/context only), use ``settings`` over the table row.

    Settings are read when a function is called (traced), so a jitted function already compiled keeps
    the defaults it was traced with; pass the explicit argument (``chunk=``, ``engine=``) to change one
    compiled call.
    """
    _check_settings(settings)
    merged = {**_override.get(), **settings}
    dataclasses.replace(_row(platform()), **merged)  # validate now, not at first use
    token = _override.set(merged)
    try:
        yield defaults()
    finally:
        _override.reset(token)


def configure(platform_name: str, **settings: Any) -> Defaults:
    """Replace settings of one platform's row for the rest of the process; returns the new row."""
    if not isinstance(platform_name, str) or not platform_name:
        raise ValueError(f"platform_name must be a platform such as 'cpu', 'gpu' or 'tpu', got {platform_name!r}")
    _check_settings(settings)
    merged = {**_configured.get(platform_name, {}), **settings}
    row = dataclasses.replace(TABLE.get(platform_name, TABLE["portable"]), **merged)  # validate now
    _configured[platform_name] = merged
    return row


def reset() -> None:
    """Forget every :func:`configure` call (overrides of active ``with`` blocks are kept)."""
    _configured.clear()


def _table_source(setting: str, name: str) -> str:
    if name not in TABLE:
        return f"portable default (not measured on this kind of machine: {name!r} has no row)"
    evidence = EVIDENCE.get(setting, {}).get(name)
    if evidence is None:
        return "table, portable choice (not measured on this kind of machine)"
    if evidence.startswith("unmeasured"):
        return "table, not measured on this kind of machine: " + evidence
    return "table: " + evidence


# A default that needs an optional package: (setting, value) -> (package, the extra that installs it, what is in
# force without it, what that means)
_NEEDS: Mapping[tuple[str, Any], tuple[str, str, Any, str]] = {
    ("cdt_engine", "host"): ("numba", "cpu-kernels", "jax", "the host engine cannot run, engine='auto' runs jax"),
    ("host_fft", True): ("ducc0", "cpu-fft", False, "fft='ducc' cannot run"),
}


def describe(platform_name: str | None = None) -> list[dict[str, str]]:
    """Every setting in force as rows ``{"setting", "value", "source"}`` (what ``ivhl info`` prints and every run
    folder records): the source is ``override()``, ``configure()``, the tuning cache file and when it was measured,
    or the table and its evidence ("not measured on this kind of machine" where nothing timed it). A default that
    needs a package this install lacks (the CDT host engine: numba; the host FFT: ducc0) shows what runs instead,
    and why.

    Settings the cache holds per problem size (``fields.superpose`` per pair-count bucket) follow as rows named
    ``setting@op[bucket]``, and the XLA flags measured by ``ivhl tune`` as ``xla_flags``."""
    name = platform() if platform_name is None else platform_name
    row = defaults(name)
    measured = _measured(name, None, None)
    over = _override.get()
    rows = []
    for f in dataclasses.fields(Defaults):
        value = getattr(row, f.name)
        if f.name in over:
            source = "override()"
        elif f.name in _configured.get(name, {}):
            source = "configure()"
        elif f.name in measured and measured[f.name][0] == value:
            source = "tuning cache: " + measured[f.name][1]
        else:
            source = _table_source(f.name, name)
        missing = _NEEDS.get((f.name, value))
        if missing is not None and not host.installed(missing[0]):
            package, extra, value, why = missing
            source = f"{why}: {package} is not installed (pip install 'ivhl_jax[{extra}]'); {source}"
        rows.append({"setting": f.name, "value": repr(value), "source": source})
    if name == platform():
        where = tuning_cache.cache_path(name)
        for key, entry in sorted(tuning_cache.entries(name).items()):
            if key.endswith("|all"):
                continue
            for setting, value in sorted(entry.get("settings", {}).items()):
                if setting not in _FIELDS:  # a measured fact (e.g. the GP's FFT), not a default this table sets
                    continue
                rows.append(
                    {
                        "setting": f"{setting}@{entry.get('op', '?')}[{entry.get('bucket', '?')}]",
                        "value": repr(value),
                        "source": f"tuning cache: measured {entry.get('measured_utc', '?')}, {where}",
                    }
                )
    if name == "cpu":
        rows.append(_xla_flags_row())
    return rows


def _xla_flags_row() -> dict[str, str]:
    """The ``xla_flags`` row of :func:`describe`: the flags ``ivhl tune`` measured as paying here and whether
    :func:`ivhl_jax.run.tune.apply` put them in force in this process."""
    if tuning_cache.mode() == "frozen":
        return {"setting": "xla_flags", "value": repr(""), "source": "IVHL_TUNING=frozen: XLA's defaults"}
    done = tuning_cache.applied_xla_flags()
    found = done or tuning_cache.measured_xla_flags()
    if not found:
        why = (
            "not measured on this kind of machine (ivhl tune --only xla)"
            if "avx512f" in host.facts().cpu_flags
            else "XLA's defaults: no candidate flag for this CPU (the tuner's flags need AVX-512)"
        )
        return {"setting": "xla_flags", "value": repr(""), "source": why}
    if not found["flags"]:
        state = "no candidate flag paid here: XLA's defaults"
    elif done.get("applied"):
        state = "applied by ivhl_jax.run.tune.apply()"
    else:
        state = "not applied: " + (
            done.get("why") or "call ivhl_jax.run.tune.apply() before the first JAX computation (the ivhl command does)"
        )
    return {
        "setting": "xla_flags",
        "value": repr(" ".join(found["flags"])),
        "source": f"tuning cache: measured {found.get('measured_utc', '?')}, {found['file']} ({state})",
    }
