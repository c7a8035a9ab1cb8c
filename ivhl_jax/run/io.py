"""Small output helpers shared by simulations, training scripts and benchmarks."""

from __future__ import annotations

import contextlib
import enum
import errno
import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from typing import IO, Any

import numpy as np

__all__ = [
    "to_jsonable",
    "write_json",
    "read_json",
    "check_nesting",
    "MAX_NESTING",
    "atomic_file",
    "save_figure",
    "save_npy",
    "load_array",
    "disk_full_message",
]

#: the deepest nesting of lists and tables a configuration or run-folder JSON file may hold (a run's own files
#: nest a few levels; a deeper one is refused in one line instead of exhausting the parser's recursion)
MAX_NESTING = 32

#: the file formats :func:`load_array` reads
ARRAY_FORMATS = ".npy (numpy.save) or .npz holding one array (numpy.savez)"


def to_jsonable(obj: Any) -> Any:
    """Convert numpy/JAX arrays and scalars, dataclasses, mappings, sequences, sets, paths, enums and dtypes
    into plain JSON types.

    Non-finite floats become None (JSON has no NaN), so a reader never chokes on the file. Anything else (a
    function, an open file, an arbitrary object) is a TypeError naming where in ``obj`` it sits, instead of
    being written as its ``str()`` and silently losing the value.
    """
    return _jsonable(obj, "obj")


def _dtype_name(obj: Any) -> str | None:
    """The dtype name of a dtype or scalar type (np.float32, jnp.bfloat16, np.dtype('complex64')), else None."""
    if isinstance(obj, np.dtype):
        return obj.name
    if isinstance(obj, type) or type(obj).__name__ == "_ScalarMeta":
        try:
            return np.dtype(obj).name
        except TypeError:
            return None
    return None


def _jsonable(obj: Any, where: str) -> Any:
    if hasattr(obj, "__dataclass_fields__") and not isinstance(obj, type):
        return {k: _jsonable(getattr(obj, k), f"{where}.{k}") for k in obj.__dataclass_fields__}
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, (set, frozenset)):
        return [_jsonable(v, f"{where}[...]") for v in sorted(obj, key=repr)]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, enum.Enum):
        return _jsonable(obj.value, f"{where}.value")
    name = _dtype_name(obj)
    if name is not None:
        return name
    if hasattr(obj, "__array__") and not isinstance(obj, (str, bytes)):
        arr = np.asarray(obj)
        if arr.ndim == 0:
            return _jsonable(arr.item(), where)
        if np.iscomplexobj(arr):
            return {
                "real": _jsonable(arr.real.tolist(), f"{where}.real"),
                "imag": _jsonable(arr.imag.tolist(), f"{where}.imag"),
            }
        return _jsonable(arr.tolist(), where)
    if isinstance(obj, complex):
        return {"real": _jsonable(obj.real, where), "imag": _jsonable(obj.imag, where)}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (np.generic,)):
        return _jsonable(obj.item(), where)
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    raise TypeError(
        f"{where} is a {type(obj).__name__}, which has no JSON form; convert it to numbers, strings, "
        "lists or dicts first"
    )


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
    doc = to_jsonable(obj)  # before any file is created: an object with no JSON form leaves nothing behind
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_file(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    return path


def _nesting_depth(obj: Any, limit: int = MAX_NESTING) -> int:
    """How deeply lists and dicts nest in ``obj`` (0 for a scalar, 1 for a flat list), counted level by level
    without recursion and no further than ``limit + 1``."""
    depth, level = 0, [obj]
    while True:
        containers = [x for x in level if isinstance(x, (list, dict))]
        if not containers or depth > limit:
            return depth
        depth += 1
        level = [c for x in containers for c in (x.values() if isinstance(x, dict) else x)]


def check_nesting(doc: Any, path: str) -> Any:
    """``doc`` (a parsed configuration or run-folder file ``path``) unless its lists and tables nest deeper than
    :data:`MAX_NESTING`: a ValueError naming the file."""
    if _nesting_depth(doc) > MAX_NESTING:
        raise ValueError(f"{path} nests lists or tables more than {MAX_NESTING} deep (no configuration does)")
    return doc


def read_json(path: str | os.PathLike, what: str, *, expect: type = dict, fix: str = "") -> Any:
    """The JSON document of the run-folder file ``path`` (``what`` names it in messages, e.g. ``"the run's
    configuration"``), which must be an ``expect`` (a dict by default).

    Anything else is one ValueError line naming the file: unreadable, not UTF-8, not JSON, nested more than
    :data:`MAX_NESTING` deep, or of another type; ``fix`` (e.g. ``"use --no-resume to start over"``) ends it. A
    symbolic link is read through (reading cannot harm its target)."""
    path = os.fspath(path)
    tail = f"; {fix}" if fix else ""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        doc = json.loads(text)
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        cause = "nested too deeply" if isinstance(e, RecursionError) else " ".join(str(e).split())[:120]
        raise ValueError(f"{what} {path} is not readable JSON ({cause}){tail}") from None
    try:
        check_nesting(doc, path)
    except ValueError as e:
        raise ValueError(f"{what} {e}{tail}") from None
    if not isinstance(doc, expect):
        raise ValueError(
            f"{what} {path} holds a JSON {type(doc).__name__}, not "
            f"{'an object' if expect is dict else 'a ' + expect.__name__}{tail}"
        )
    return doc


def disk_full_message(e: OSError, path: str | os.PathLike) -> str | None:
    """The one line for a write that failed because the disk (or the quota) is full: the path and that rerunning
    the same command resumes from the newest checkpoint; None for any other error."""
    if getattr(e, "errno", None) not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = getattr(e, "filename", None) or os.fspath(path)
    return (
        f"no space left on the device writing {where}; free some space (or use another --out) and rerun the same "
        "command: it resumes from the newest checkpoint"
    )


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """Write ``path`` all at once or not at all: the ``with`` block writes a temporary file in the same folder,
    which is flushed to disk, given an ordinary file's mode (``0o666 & ~umask``) and renamed over ``path``; an
    exception removes it and leaves ``path`` as it was."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_figure(fig: Any, path: str | os.PathLike, *, dpi: int = 110) -> str:
    """Save a matplotlib figure (creating folders) and close it; returns the path."""
    import matplotlib.pyplot as plt

    if isinstance(dpi, bool) or not isinstance(dpi, (int, float, np.number)) or not math.isfinite(dpi) or dpi <= 0:
        raise ValueError(f"dpi must be a finite number > 0, got {dpi!r}")
    if not callable(getattr(fig, "savefig", None)):
        raise TypeError(f"fig must be a matplotlib figure, got {type(fig).__name__}")
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fmt = os.path.splitext(path)[1].lstrip(".").lower() or None
    try:  # written under a temporary name and renamed: a link at ``path`` is replaced, never written through
        with atomic_file(path) as f:
            fig.savefig(f, dpi=dpi, bbox_inches="tight", format=fmt)
    finally:
        plt.close(fig)
    return path


def save_npy(path: str | os.PathLike, array: Any) -> str:
    """``numpy.save`` of ``array`` to ``path`` all at once (:func:`atomic_file`): a symbolic link at ``path`` is
    replaced by the file, never written through. Returns the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_file(path) as f:
        np.save(f, np.asarray(array), allow_pickle=False)
    return path


def load_array(path: str | os.PathLike, name: str) -> np.ndarray:
    """The array in the NumPy file ``path`` (``.npy``, or ``.npz`` holding exactly one array), for the config key
    or argument ``name``.

    Anything else is a ValueError of one line naming ``name``, the file and the accepted formats: a missing file,
    another extension, a text or pickled file, a truncated or corrupt one, an ``.npz`` with no or several arrays.
    Pickles are never loaded (``allow_pickle=False``).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{name}: no such file {path!r}; give a {ARRAY_FORMATS} file")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".npy", ".npz"):
        raise ValueError(f"{name}: {path!r} is not a NumPy array file; give a {ARRAY_FORMATS} file")
    unreadable = (
        f"{name}: {path!r} is not a readable {suffix} file (corrupt, truncated, text or pickled data); "
        f"give a {ARRAY_FORMATS} file"
    )
    try:
        if suffix == ".npy":
            return np.load(path, allow_pickle=False)
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
    except Exception:  # noqa: BLE001 - a text file, a pickle, a truncated or corrupt file: one message, no advice
        raise ValueError(unreadable) from None  # about allow_pickle, which would load untrusted code
    if len(arrays) != 1:
        raise ValueError(
            f"{name}: {path!r} holds {len(arrays)} arrays ({sorted(arrays)}); give a .npz with exactly "
            "one array, or a .npy file"
        )
    return next(iter(arrays.values()))
