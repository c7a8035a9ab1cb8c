"""Communication accounting: bytes moved by the collectives of a compiled program, parsed from its HLO."""

from __future__ import annotations

from typing import Any

from ivhl_jax.core.hlo import collectives
from ivhl_jax.core.validation import check_scalar

__all__ = ["collective_bytes"]


def collective_bytes(compiled_or_text: Any, n_devices: int | None = None) -> dict[str, Any]:
    """Per-device bytes of the results of each collective in a compiled program (from its HLO text).

    The collectives and their result sizes are those of :func:`ivhl_jax.core.hlo.collectives` (``-start``
    variants counted by their results, ``-done`` skipped; a loop body is counted once: multiply by the trip
    count yourself).
    Returns ``{"total": bytes, "by_op": {op: bytes}, "count": {op: n}}``; with ``n_devices`` also
    ``"wire_total"``: bytes each device sends under the bandwidth-optimal (ring) model — all-reduce
    2(n−1)/n·size, all-gather and all-to-all (n−1)/n·size, reduce-scatter (n−1)·size, permute size.
    """
    if n_devices is not None:
        check_scalar(n_devices, "n_devices", integer=True, minimum=1)
    by_op: dict[str, int] = {}
    count: dict[str, int] = {}
    for op, nbytes in collectives(compiled_or_text):
        by_op[op] = by_op.get(op, 0) + nbytes
        count[op] = count.get(op, 0) + 1
    out: dict[str, Any] = {"total": int(sum(by_op.values())), "by_op": by_op, "count": count}
    if n_devices is not None:
        n = int(n_devices)
        factor = {
            "all-reduce": 2 * (n - 1) / n,
            "all-gather": (n - 1) / n,
            "all-to-all": (n - 1) / n,
            "reduce-scatter": float(n - 1),
            "collective-permute": 1.0,
        }
        out["wire_total"] = float(sum(factor[op] * b for op, b in by_op.items()))
    return out
