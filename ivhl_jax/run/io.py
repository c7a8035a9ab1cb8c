"""Small output helpers shared by simulations, training scripts and benchmarks."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["to_jsonable", "write_json", "save_figure"]


def to_jsonable(obj: Any) -> Any:
    """Convert numpy/JAX arrays and scalars, dataclasses and paths into plain JSON types.

    Non-finite floats become None (JSON has no NaN), so a reader never chokes on the file.
    """
    if hasattr(obj, "__dataclass_fields__"):
        return {k: to_jsonable(getattr(obj, k)) for k in obj.__dataclass_fields__}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "__array__") and not isinstance(obj, (str, bytes)):
        arr = np.asarray(obj)
        if arr.ndim == 0:
            return to_jsonable(arr.item())
        if np.iscomplexobj(arr):
            return {"real": to_jsonable(arr.real.tolist()), "imag": to_jsonable(arr.imag.tolist())}
        return to_jsonable(arr.tolist())
    if isinstance(obj, complex):
        return {"real": to_jsonable(obj.real), "imag": to_jsonable(obj.imag)}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (np.generic,)):
        return to_jsonable(obj.item())
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def _current_umask() -> int:
    """The process umask (read from /proc on Linux; else set-and-restore, which is not thread-safe)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike, obj: Any) -> str:
    """Write ``obj`` as indented JSON atomically (temp file + rename); returns the path.

    The file gets the mode an ordinary ``open(path, "w")`` would give (``0o666 & ~umask``), not the
    private 0600 of the temporary file.
    """
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(to_jsonable(obj), f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def save_figure(fig: Any, path: str | os.PathLike, *, dpi: int = 110) -> str:
    """Save a matplotlib figure (creating folders) and close it; returns the path."""
    import matplotlib.pyplot as plt

    if isinstance(dpi, bool) or not isinstance(dpi, (int, float, np.number)) or not math.isfinite(dpi) or dpi <= 0:
        raise ValueError(f"dpi must be a finite number > 0, got {dpi!r}")
    if not callable(getattr(fig, "savefig", None)):
        raise TypeError(f"fig must be a matplotlib figure, got {type(fig).__name__}")
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path
