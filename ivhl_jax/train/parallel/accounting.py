"""Communication accounting: bytes moved by the collectives of a compiled program, parsed from its HLO."""

from __future__ import annotations

import math
import re
from typing import Any

from ivhl_jax.core.validation import check_scalar

__all__ = ["collective_bytes"]


_COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "reduce-scatter", "collective-permute")
_DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1, "s32": 4, "u32": 4, "pred": 1,
                "s64": 8, "u64": 8, "c64": 8, "c128": 16, "s16": 2, "u16": 2}
_SHAPE = re.compile(r"\b(f64|f32|bf16|f16|s8|u8|s16|u16|s32|u32|s64|u64|pred|c64|c128)\[([0-9,]*)\]")


def collective_bytes(compiled_or_text: Any, n_devices: int | None = None) -> dict[str, Any]:
    """Per-device bytes of the results of each collective in a compiled program (from its HLO text).

    Counts every ``all-reduce``, ``all-gather``, ``all-to-all``, ``reduce-scatter`` and
    ``collective-permute`` instruction (``-start`` variants included, ``-done`` skipped), summing the
    sizes of its result shapes. A loop body is counted once (multiply by trip count yourself).
    Returns ``{"total": bytes, "by_op": {op: bytes}, "count": {op: n}}``; with ``n_devices`` also
    ``"wire_total"``: bytes each device sends under the bandwidth-optimal (ring) model — all-reduce
    2(n−1)/n·size, all-gather and all-to-all (n−1)/n·size, reduce-scatter (n−1)·size, permute size.
    """
    if n_devices is not None:
        check_scalar(n_devices, "n_devices", integer=True, minimum=1)
    text = compiled_or_text if isinstance(compiled_or_text, str) else compiled_or_text.as_text()
    by_op: dict[str, int] = {}
    count: dict[str, int] = {}
    for line in text.splitlines():
        if "=" not in line:
            continue
        rhs = line.split("=", 1)[1].strip()
        op = None
        for c in _COLLECTIVES:
            if re.search(rf"\s{c}(-start)?\(", " " + rhs):
                op = c
                break
        if op is None or re.search(r"-done\(", rhs):
            continue
        head = rhs.split(op, 1)[0]
        nbytes = 0
        for dt, dims in _SHAPE.findall(head):
            size = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
            nbytes += size * _DTYPE_BYTES[dt]
        if op in ("all-gather", "collective-permute") and "-start" in rhs and head.count("[") > 1:
            nbytes //= 2  # async start returns (operand, result)
        by_op[op] = by_op.get(op, 0) + nbytes
        count[op] = count.get(op, 0) + 1
    out: dict[str, Any] = {"total": int(sum(by_op.values())), "by_op": by_op, "count": count}
    if n_devices is not None:
        n = int(n_devices)
        factor = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "all-to-all": (n - 1) / n,
                  "reduce-scatter": float(n - 1), "collective-permute": 1.0}
        out["wire_total"] = float(sum(factor[op] * b for op, b in by_op.items()))
    return out
