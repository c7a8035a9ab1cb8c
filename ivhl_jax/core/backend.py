"""Per-backend defaults: the one place where the platform JAX runs on chooses a setting.

Every kernel and model that has a platform-dependent default (a chunk size, a layer loop, an engine)
reads it here with :func:`defaults`; no other module calls ``jax.default_backend()`` to choose a
setting. Each row of :data:`TABLE` names the measurement that chose it (:data:`EVIDENCE`: a results file
in ``bench/results/`` and the command that wrote it), MaxText style: configuration decides, code does not
sniff the backend.

A platform missing from the table (a new accelerator plugin) gets the ``"portable"`` row, which is never
the CPU-only choice: it assumes an accelerator with its own memory and no host kernels.

Users see the table in force with ``ivhl info`` (:func:`describe`) and change it two ways::

    with ivhl_jax.core.backend.override(fields_chunking="pair_budget"):
        ...                                   # this block only (context-local)
    ivhl_jax.core.backend.configure("gpu", fields_memory_fraction=0.1)   # process-wide, one platform
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import types
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import jax

__all__ = ["Tuning", "TABLE", "EVIDENCE", "PLATFORMS", "platform", "defaults", "override", "configure",
           "reset", "describe"]

PLATFORMS = ("cpu", "gpu", "tpu", "portable")


@dataclasses.dataclass(frozen=True)
class Tuning:
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
      mera_busy_host_cores: CPU cores a MERA ladder holds XLA to when the host is busy (0: no limit).
      host_fft: whether ``fft="ducc"`` (a host FFT) is allowed.
    """

    fields_chunking: Literal["pair_budget", "memory"]
    fields_pair_budget: int
    fields_memory_fraction: float
    transformer_layer_loop: Literal["unrolled", "scan"]
    transposed_save_matmul: bool
    attention_half: Literal["xla", "cudnn", "pallas", "chunked"]
    attention_dense: bool
    cdt_engine: Literal["host", "jax", "pallas"]
    mera_busy_host_cores: int
    host_fft: bool

    def __post_init__(self) -> None:
        if self.fields_chunking not in ("pair_budget", "memory"):
            raise ValueError(f"fields_chunking must be 'pair_budget' or 'memory', got {self.fields_chunking!r}")
        if not isinstance(self.fields_pair_budget, int) or self.fields_pair_budget < 1:
            raise ValueError(f"fields_pair_budget must be a positive int, got {self.fields_pair_budget!r}")
        if not 0.0 < float(self.fields_memory_fraction) <= 0.9:
            raise ValueError(f"fields_memory_fraction must be in (0, 0.9], got {self.fields_memory_fraction!r}")
        if self.transformer_layer_loop not in ("unrolled", "scan"):
            raise ValueError(f"transformer_layer_loop must be 'unrolled' or 'scan', got "
                             f"{self.transformer_layer_loop!r}")
        if self.attention_half not in ("xla", "cudnn", "pallas", "chunked"):
            raise ValueError(f"attention_half must be one of xla, cudnn, pallas, chunked; got {self.attention_half!r}")
        if self.cdt_engine not in ("host", "jax", "pallas"):
            raise ValueError(f"cdt_engine must be 'host', 'jax' or 'pallas', got {self.cdt_engine!r}")
        if not isinstance(self.mera_busy_host_cores, int) or self.mera_busy_host_cores < 0:
            raise ValueError(f"mera_busy_host_cores must be an int >= 0, got {self.mera_busy_host_cores!r}")


_CPU = Tuning(fields_chunking="pair_budget", fields_pair_budget=1 << 22, fields_memory_fraction=0.25,
              transformer_layer_loop="unrolled", transposed_save_matmul=True, attention_half="xla",
              attention_dense=True, cdt_engine="host", mera_busy_host_cores=1, host_fft=True)
_ACCELERATOR = Tuning(fields_chunking="memory", fields_pair_budget=1 << 22, fields_memory_fraction=0.25,
                      transformer_layer_loop="scan", transposed_save_matmul=False, attention_half="cudnn",
                      attention_dense=False, cdt_engine="jax", mera_busy_host_cores=0, host_fft=False)

#: The tuned row per platform. ``"portable"`` serves any platform not listed.
TABLE: Mapping[str, Tuning] = {
    "cpu": _CPU,
    "gpu": _ACCELERATOR,
    "tpu": dataclasses.replace(_ACCELERATOR, attention_half="xla"),
    "portable": dataclasses.replace(_ACCELERATOR, attention_half="xla"),
}

#: Why each setting has its value: ``{setting: {platform: "results file — command"}}``. A platform
#: without an entry runs the portable choice, not a measured one.
EVIDENCE: Mapping[str, Mapping[str, str]] = {
    "fields_chunking": {
        "cpu": "bench/results/fields_superpose_cpu.json — ivhl bench --op superpose --size large --size extreme",
        "gpu": "../shared/reference/gpu_h200.md (chunk=n 2.45 ms vs the pair-budget default 212 ms at "
               "1048576 x 512 on one H200) — python -m ivhl_jax.bench.gpu_checks",
    },
    "fields_pair_budget": {
        "cpu": "bench/results/fields_superpose_cpu.json — ivhl bench --op superpose --size large --size extreme",
    },
    "fields_memory_fraction": {"gpu": "../shared/reference/gpu_h200.md — python -m ivhl_jax.bench.gpu_checks"},
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
        "cpu": "bench/results/cdt_host_vs_2dcdt.json (host engine 1.4-1.8e7 accepted moves/s per chain; the JAX "
               "engine 2-4e4, bench/results/cdt_jax_scaling.json) — python -m ivhl_jax.bench.ops_cdt "
               "--engines host --chains 1,2 --volumes 512,2048,8192 --peer-src DIR",
        "gpu": "../shared/reference/gpu_h200.md (JAX engine 1.45e8 accepted moves/s at 65536 chains) — "
               "python -m ivhl_jax.bench.gpu_checks",
    },
    "mera_busy_host_cores": {
        "cpu": "bench/results/mera_busy_host.json — python -m ivhl_jax.bench.mera_busy_host --window 0.5 "
               "(the script as at commit d695879: git show d695879:bench/mera_busy_host.py)",
    },
    "host_fft": {"cpu": "bench/results/condensate_gp_step_xla_vs_ducc_cpu.json — ivhl bench --op gp_step "
                        "--op gp_step_ducc --size extreme"},
}

_configured: dict[str, Tuning] = {}
_override: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "ivhl_backend_override", default=types.MappingProxyType({}))


def platform() -> str:
    """The platform JAX computes on (``jax.default_backend()``): ``"cpu"``, ``"gpu"``, ``"tpu"`` or a plugin's name."""
    return jax.default_backend()


def _row(name: str) -> Tuning:
    if name in _configured:
        return _configured[name]
    return TABLE.get(name, TABLE["portable"])


def _check_settings(settings: Mapping[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(Tuning)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"unknown backend setting(s) {unknown}; the settings are {sorted(known)}")


def defaults(platform_name: str | None = None) -> Tuning:
    """The defaults in force for ``platform_name`` (default: the current platform), overrides applied."""
    row = _row(platform() if platform_name is None else str(platform_name))
    over = _override.get()
    return dataclasses.replace(row, **over) if over else row


@contextlib.contextmanager
def override(**settings: Any) -> Iterator[Tuning]:
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


def configure(platform_name: str, **settings: Any) -> Tuning:
    """Replace settings of one platform's row for the rest of the process; returns the new row."""
    if not isinstance(platform_name, str) or not platform_name:
        raise ValueError(f"platform_name must be a platform such as 'cpu', 'gpu' or 'tpu', got {platform_name!r}")
    _check_settings(settings)
    row = dataclasses.replace(_row(platform_name), **settings)
    _configured[platform_name] = row
    return row


def reset() -> None:
    """Forget every :func:`configure` call (overrides of active ``with`` blocks are kept)."""
    _configured.clear()


def describe(platform_name: str | None = None) -> list[dict[str, str]]:
    """The table in force as rows ``{"setting", "value", "source"}`` (what ``ivhl info`` prints)."""
    name = platform() if platform_name is None else platform_name
    row = defaults(name)
    base = TABLE.get(name, TABLE["portable"])
    over = _override.get()
    rows = []
    for f in dataclasses.fields(Tuning):
        value = getattr(row, f.name)
        if f.name in over:
            source = "override()"
        elif name in _configured and getattr(_configured[name], f.name) != getattr(base, f.name):
            source = "configure()"
        else:
            source = EVIDENCE.get(f.name, {}).get(name) or (
                f"portable default ({name!r} not measured)" if name not in TABLE else "portable choice, not measured")
        rows.append({"setting": f.name, "value": repr(value), "source": source})
    return rows
