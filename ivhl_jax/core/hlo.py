"""Reading compiled XLA programs: the collectives of a compiled (per-device) HLO module and their sizes.

One parser for every caller that asks what a program communicates (the distributed FFT's tests and studies,
:func:`ivhl_jax.train.parallel.collective_bytes`). Give it ``jax.jit(f).lower(...).compile()`` or its
``as_text()``.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["COLLECTIVE_KINDS", "collectives", "dtype_bytes"]

#: The collective instructions counted (their ``-start`` forms too; ``-done`` halves are not counted again).
COLLECTIVE_KINDS = ("all-to-all", "all-gather", "all-reduce", "collective-permute", "reduce-scatter")

_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "bf16": 2,
    "f16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
# `%name = SHAPE KIND(` or `KIND-start(`: SHAPE is an array type or a (possibly nested) tuple of them
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.*?)\s+(?P<op>" + "|".join(COLLECTIVE_KINDS) + r")(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")


def dtype_bytes(name: str) -> int:
    """Bytes per element of an HLO element type (``f32`` → 4, ``c128`` → 16, ``pred`` → 1)."""
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown HLO element type {name!r}; known: {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def _strip_layouts(shape: str) -> str:
    """The shape text without its ``{...}`` layouts (which may hold parentheses: ``{1,0:T(8,128)}``)."""
    out, depth = [], 0
    for ch in shape:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _top_level_parts(shape: str) -> list[str]:
    """The elements of a tuple shape ``(a, (b, c), d)`` → ``["a", "(b, c)", "d"]``; an array shape → ``[shape]``."""
    s = shape.strip()
    if not (s.startswith("(") and s.endswith(")")):
        return [s]
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in s[1:-1]:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _nbytes(shape: str) -> int:
    return sum(
        math.prod(int(d) for d in dims.split(",") if d) * dtype_bytes(dt)
        for dt, dims in _ARRAY.findall(shape)
        if dt in _DTYPE_BYTES
    )


def collectives(program: Any) -> list[tuple[str, int]]:
    """The collectives of a compiled (per-device) HLO module, in program order: ``(kind, bytes of its result on
    one device)``.

    ``program`` is a compiled program (``jax.jit(f).lower(...).compile()``) or its HLO text. ``kind`` is one of
    :data:`COLLECTIVE_KINDS`. A tuple-shaped collective (XLA:CPU splits an all-to-all into one chunk per peer; a
    combined all-reduce returns one array per operand) counts the sum of its parts. An asynchronous all-gather or
    collective-permute (``-start``) returns ``(operands, results, ...)``: its results are counted, and the matching
    ``-done`` is not counted again. A loop body is counted once (multiply by its trip count yourself). An
    all-to-all over p devices sends (p − 1)/p of its bytes off the device.
    """
    text = program if isinstance(program, str) else program.as_text()
    out = []
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        shape = _strip_layouts(m.group("shape"))
        op = m.group("op")
        if m.group("start") and op in ("all-gather", "collective-permute"):
            parts = _top_level_parts(shape)
            if len(parts) >= 2:
                shape = parts[1]
        out.append((op, _nbytes(shape)))
    return out
