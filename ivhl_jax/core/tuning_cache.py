"""The per-machine tuning cache: settings measured on this machine, read before the backend table.

``ivhl tune`` (:mod:`ivhl_jax.run.tune`) times the candidates of every tunable setting on the machine it runs
on and stores the winners here; :func:`ivhl_jax.core.backend.defaults` reads them before the table, the way
FFTW reads its wisdom and Triton its autotune cache.

* One JSON file per machine fingerprint (:func:`fingerprint`): platform, device kind and count, CPU model and
  ISA flags (CPU) or compute capability (GPU), and the jax / jaxlib / ivhl_jax versions. The file name is a
  hash of the fingerprint, the fingerprint is stored inside, and a file whose stored fingerprint is not this
  machine's (copied from another host, written by another jax) is ignored with one warning naming it.
* Entries are keyed by op and problem-size bucket (:func:`bucket`): ``"fields.superpose|2^22"`` holds the
  settings that won for about 2**22 (point, source) pairs; bucket ``"all"`` holds size-independent choices
  (the CDT engine, the XLA compiler flags).
* Folder: ``$IVHL_CACHE_DIR/tuning`` (default: the platform's user cache folder, ``~/.cache/ivhl_jax`` on
  Linux). Writes take a lock file and merge with what is on disk, then rename a complete file over the old
  one, so two processes tuning at once keep both results and a reader never sees half a file.
* ``IVHL_TUNING``: ``cache`` (default: read the cache, never tune on the fly), ``frozen`` (the table alone:
  reproducible runs) or ``auto`` (tune an op the first time it meets a new size bucket; said on the console).

Reading this module, or ``import ivhl_jax``, reads no file and sets nothing: the cache is read when a default
is asked for. XLA compiler flags are read when a backend starts, so a measured flag
(``--xla_cpu_prefer_vector_width=512``, one of :data:`XLA_FLAG_CANDIDATES`) is applied by
:func:`ivhl_jax.run.tune.apply`, which the ``ivhl`` command calls first and a script calls before its first JAX
computation. A file that is not a well-formed cache (:func:`parse`: bounded size and nesting, a schema) is
ignored with one warning naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ivhl_jax.core import host

__all__ = [
    "FORMAT",
    "MODES",
    "TuningCacheWarning",
    "mode",
    "cache_dir",
    "fingerprint",
    "host_fingerprint",
    "cache_path",
    "bucket",
    "load",
    "lookup",
    "entries",
    "record",
    "atomic_write_text",
    "XLA_FLAG_CANDIDATES",
    "parse",
    "measured_xla_flags",
    "record_applied",
    "applied_xla_flags",
    "set_auto_tuner",
    "auto_tune",
    "reset",
]

FORMAT = "ivhl_jax.tuning/1"
#: The XLA flags ``ivhl tune`` times (its xla area's candidates): the only flags a cache file can bring into
#: ``XLA_FLAGS``.
XLA_FLAG_CANDIDATES = ("--xla_cpu_prefer_vector_width=512",)
MODES = ("cache", "frozen", "auto")
# ISA flags that change what XLA:CPU can emit (vector width, FMA, bf16/int8 dot units).
_ISA = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_bf16",
    "amx_tile",
    "asimd",
    "sve",
    "sve2",
)


class TuningCacheWarning(UserWarning):
    """A tuning cache file was ignored (corrupt, foreign, another jax version) or could not be written."""


_lock = threading.Lock()
_warned: set[str] = set()
_docs: dict[str, tuple[int, dict[str, Any] | None]] = {}  # path -> (mtime_ns, doc or None if unusable)
_fingerprints: dict[str, dict[str, Any]] = {}
_applied: dict[str, Any] = {}
_auto_tuner: Callable[[str, int, str], Mapping[str, Any] | None] | None = None
_auto_busy: set[tuple[str, str]] = set()
_stale_checked: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, TuningCacheWarning, stacklevel=3)


def reset() -> None:
    """Forget what this process has read, warned about and fingerprinted (tests; a changed environment)."""
    with _lock:
        _warned.clear()
        _docs.clear()
        _fingerprints.clear()
        _stale_checked.clear()


def mode() -> str:
    """``IVHL_TUNING``: ``"cache"`` (default), ``"frozen"`` or ``"auto"``; another value warns once and reads as
    ``"cache"``."""
    value = os.environ.get("IVHL_TUNING", "").strip().lower() or "cache"
    if value not in MODES:
        _warn_once(f"mode:{value}", f"IVHL_TUNING={value!r} is not one of {list(MODES)}; using 'cache'")
        return "cache"
    return value


def cache_dir() -> str:
    """The tuning folder: ``$IVHL_CACHE_DIR/tuning``, default the user cache folder of this platform."""
    root = os.environ.get("IVHL_CACHE_DIR")
    if not root:
        if sys.platform == "darwin":
            root = os.path.join(os.path.expanduser("~"), "Library", "Caches", "ivhl_jax")
        elif os.name == "nt":
            root = os.path.join(os.environ.get("LOCALAPPDATA") or os.path.expanduser("~"), "ivhl_jax", "Cache")
        else:
            root = os.path.join(
                os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ivhl_jax"
            )
    return os.path.join(os.path.abspath(os.path.expanduser(root)), "tuning")


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("jax", "jaxlib"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    pkg = sys.modules.get("ivhl_jax")
    out["ivhl_jax"] = str(getattr(pkg, "__version__", "")) or _own_version()
    return out


def _own_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ivhl_jax")
    except metadata.PackageNotFoundError:
        return "source"


def host_fingerprint() -> dict[str, Any]:
    """The CPU platform's fingerprint, computed without starting a JAX backend (so flags can still be set)."""
    if "cpu" not in _fingerprints:
        facts = host.facts()
        _fingerprints["cpu"] = {
            "platform": "cpu",
            "device_kind": facts.cpu_model,
            "device_count": facts.cores,
            "machine": facts.machine,
            "system": facts.system,
            "isa": sorted(f for f in _ISA if f in facts.cpu_flags),
            "versions": _versions(),
        }
    return dict(_fingerprints["cpu"])


def fingerprint(platform_name: str) -> dict[str, Any]:
    """What the measurements of ``platform_name`` depend on: for ``"cpu"`` :func:`host_fingerprint`; for an
    accelerator its device kind and count and compute capability (this starts the backend) and the versions."""
    if platform_name == "cpu":
        return host_fingerprint()
    if platform_name not in _fingerprints:
        import jax

        try:
            devs = jax.devices(platform_name)
        except RuntimeError:
            devs = []
        kind = devs[0].device_kind if devs else "none"
        cc = str(getattr(devs[0], "compute_capability", "")) if devs else ""
        _fingerprints[platform_name] = {
            "platform": platform_name,
            "device_kind": kind,
            "device_count": len(devs),
            "compute_capability": cc,
            "versions": _versions(),
        }
    return dict(_fingerprints[platform_name])


def _digest(fp: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(platform_name: str) -> str:
    """The cache file of this machine for ``platform_name``: ``<cache_dir>/<platform>-<hash>.json``."""
    return os.path.join(cache_dir(), f"{platform_name}-{_digest(fingerprint(platform_name))}.json")


def bucket(size: int | float | None) -> str:
    """Problem-size bucket of ``size`` work items: ``"2^k"`` with k = round(log2 size) (``"all"`` for None)."""
    if size is None:
        return "all"
    return f"2^{max(0, round(math.log2(max(float(size), 1.0))))}"


_MAX_BYTES = 16 << 20  # a cache of every area and bucket is ~1 MB; anything far larger is not one
_MAX_DEPTH = 12  # the deepest real path: entries / key / candidates / name / samples_s (5 brackets)
_SCALAR = (str, int, float, bool, type(None))


def _depth(text: str) -> int:
    """The deepest bracket nesting of JSON ``text`` (brackets inside strings do not count), read without
    recursion: a file of 10**5 nested brackets costs a linear scan, not Python's recursion limit."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse(text: str) -> dict[str, Any]:
    """A tuning cache document from ``text``, checked against the schema before anything reads it; ValueError
    saying what is wrong otherwise.

    Bounded: at most 16 MiB and 12 levels of brackets (checked before the JSON parser runs). Schema: an object
    with ``format`` = :data:`FORMAT`, a ``fingerprint`` object, an ``entries`` object mapping ``"op|bucket"`` to
    objects whose ``settings`` map names to scalars, and optionally a ``limits`` object."""
    if len(text) > _MAX_BYTES:
        raise ValueError(f"{len(text)} characters, more than a tuning cache holds ({_MAX_BYTES})")
    if _depth(text) > _MAX_DEPTH:
        raise ValueError(f"brackets nested deeper than a tuning cache's {_MAX_DEPTH} levels")
    try:
        doc = json.loads(text)
    except RecursionError as e:  # belt and braces: the depth check above should have refused it
        raise ValueError("nested too deeply") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f'not an ivhl_jax tuning cache (no "format": "{FORMAT}")')
    if not isinstance(doc.get("fingerprint"), dict) or not isinstance(doc.get("entries"), dict):
        raise ValueError("'fingerprint' and 'entries' must be objects")
    if not isinstance(doc.get("limits", {}), dict):
        raise ValueError("'limits' must be an object")
    for key, entry in doc["entries"].items():
        if "|" not in key or not isinstance(entry, dict) or not isinstance(entry.get("settings"), dict):
            raise ValueError(f"entry {key[:60]!r} is not keyed 'op|bucket' with a 'settings' object")
        bad = [k for k, v in entry["settings"].items() if not isinstance(v, _SCALAR)]
        if bad:
            raise ValueError(f"entry {key[:60]!r}: setting {bad[0][:60]!r} is not a number, string or boolean")
    return doc


def _read(path: str) -> dict[str, Any] | None:
    """The document at ``path`` if it is a tuning cache of this machine; None (one warning) otherwise."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    cached = _docs.get(path)
    if cached is not None and cached[0] == st.st_mtime_ns:
        return cached[1]
    doc: dict[str, Any] | None
    try:
        with open(path, encoding="utf-8", errors="strict") as f:
            doc = parse(f.read(_MAX_BYTES + 1))
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        _warn_once(
            path,
            f"tuning cache {path} is unreadable or corrupt ({type(e).__name__}: {str(e)[:120]}); "
            "ignored, the backend table is used (`ivhl tune` writes a new one)",
        )
        doc = None
    else:
        plat = str(doc["fingerprint"].get("platform", ""))
        mine = fingerprint(plat) if plat in ("cpu",) or plat in _fingerprints else None
        if mine is None or doc["fingerprint"] != mine:
            theirs = doc["fingerprint"].get("versions", {})
            why = (
                "it was measured with jax " + str(theirs.get("jax")) + f", this is jax {_versions()['jax']}"
                if mine is not None and theirs != mine.get("versions")
                else "it was measured on another machine"
            )
            _warn_once(
                path,
                f"tuning cache {path} is foreign ({why}); ignored, the backend table is used "
                "(`ivhl tune` measures this machine)",
            )
            doc = None
    _docs[path] = (st.st_mtime_ns, doc)
    return doc


def _stale_files(platform_name: str) -> None:
    """Warn once about a cache of this platform written by other versions (nothing for this one exists)."""
    folder = cache_dir()
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    mine = fingerprint(platform_name)
    for name in names:
        if name.startswith(f"{platform_name}-") and name.endswith(".json"):
            path = os.path.join(folder, name)
            try:
                with open(path, encoding="utf-8") as f:
                    fp = parse(f.read(_MAX_BYTES + 1))["fingerprint"]
            except (OSError, ValueError):
                continue
            if (
                isinstance(fp, dict)
                and {k: v for k, v in fp.items() if k != "versions"}
                == {k: v for k, v in mine.items() if k != "versions"}
                and fp.get("versions") != mine["versions"]
            ):
                _warn_once(
                    path,
                    f"tuning cache {path} was measured with jax {fp.get('versions', {}).get('jax')} "
                    f"(this is jax {mine['versions']['jax']}); ignored, the backend table is used "
                    "(`ivhl tune` measures again)",
                )


def load(platform_name: str) -> dict[str, Any] | None:
    """This machine's cache document for ``platform_name`` (None: none, unusable, or ``IVHL_TUNING=frozen``)."""
    if mode() == "frozen":
        return None
    path = cache_path(platform_name)
    with _lock:
        if not os.path.exists(path):
            if platform_name not in _stale_checked:
                _stale_checked.add(platform_name)
                _stale_files(platform_name)
            return None
        return _read(path)


def entries(platform_name: str) -> dict[str, dict[str, Any]]:
    """Every usable cache entry of ``platform_name`` (``{"op|bucket": entry}``).

    An entry whose race timed fewer than two candidates measured nothing (written before ``ivhl tune`` refused
    such races, e.g. the JAX engine alone where numba was missing), and one that left out candidates whose package
    (its ``unavailable``: candidate -> package) is installed now, are skipped with one warning each: the table's
    choice applies until a new ``ivhl tune`` measures every candidate."""
    doc = load(platform_name)
    if not doc:
        return {}
    out = {}
    for key, entry in doc["entries"].items():
        timed = [
            n
            for n, c in (entry.get("candidates") or {}).items()
            if isinstance(c, dict) and "error" not in c and "rejected" not in c
        ]
        now = sorted({str(p) for p in (entry.get("unavailable") or {}).values() if host.installed(str(p))})
        if now:
            _warn_once(
                f"now:{key}",
                f"tuning cache {cache_path(platform_name)}: {key} was measured without {', '.join(now)}, installed "
                "now; ignored, the backend table's choice applies (`ivhl tune` measures it with them)",
            )
            continue
        if isinstance(entry.get("candidates"), dict) and len(timed) < 2:
            _warn_once(
                f"one:{key}",
                f"tuning cache {cache_path(platform_name)}: {key} was a race of {len(timed)} candidate(s) "
                f"({', '.join(timed) or 'none'}); ignored, the backend table's choice applies (`ivhl tune` measures "
                "it again)",
            )
            continue
        out[key] = entry
    return out


def lookup(platform_name: str, op: str, size: int | float | None = None) -> dict[str, Any] | None:
    """The cache entry of ``op`` nearest to ``size`` (same bucket, else the nearest measured bucket at most a
    factor 16 away), or None. Under ``IVHL_TUNING=auto`` a miss tunes ``op`` at ``size`` first."""
    found = _nearest(entries(platform_name), op, size)
    if found is None and mode() == "auto" and size is not None:
        auto_tune(op, int(size), platform_name)
        found = _nearest(entries(platform_name), op, size)
    return found


def _nearest(table: Mapping[str, dict[str, Any]], op: str, size: int | float | None) -> dict[str, Any] | None:
    if size is None:
        return table.get(f"{op}|all")
    want = bucket(size)
    if f"{op}|{want}" in table:
        return table[f"{op}|{want}"]
    k = int(want[2:])
    best = None
    for key, entry in table.items():
        name, _, b = key.partition("|")
        if name == op and b.startswith("2^") and abs(int(b[2:]) - k) <= 4:
            if best is None or abs(int(b[2:]) - k) < best[0]:
                best = (abs(int(b[2:]) - k), entry)
    return None if best is None else best[1]


def atomic_write_text(path: str, text: str) -> None:
    """Write ``path`` all at once: a temporary file in the same folder, flushed, renamed over ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    """An exclusive lock on ``path + ".lock"`` (POSIX ``flock``; elsewhere the rename alone)."""
    try:
        import fcntl
    except ImportError:  # Windows: os.replace is still atomic; a simultaneous merge may drop one writer's entry
        yield
        return
    with open(path + ".lock", "a", encoding="utf-8") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def record(
    platform_name: str, new_entries: Mapping[str, Mapping[str, Any]], *, limits: Mapping[str, Any] | None = None
) -> str:
    """Merge ``{"op|bucket": entry}`` into this machine's cache file (locked, atomic); returns its path.

    Each entry holds ``settings`` (name -> value), ``measured_utc`` and whatever else the tuner records
    (candidates with timings and spread, the roofline fraction). Raises OSError naming the folder when it cannot
    be written."""
    path = cache_path(platform_name)
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise OSError(
            f"the tuning cache folder {folder} cannot be created ({e.strerror or e}); set IVHL_CACHE_DIR "
            "to a writable folder"
        ) from e
    if not os.access(folder, os.W_OK):
        raise OSError(f"the tuning cache folder {folder} is not writable; set IVHL_CACHE_DIR to a writable folder")
    with _file_lock(path):
        doc = None
        if os.path.exists(path):
            with _lock:
                _docs.pop(path, None)
                doc = _read(path)
        if doc is None:
            doc = {"format": FORMAT, "fingerprint": fingerprint(platform_name), "entries": {}}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for key, entry in new_entries.items():
            if "|" not in key or not isinstance(entry.get("settings"), Mapping):
                raise ValueError(f"a tuning entry is keyed 'op|bucket' and holds 'settings'; got {key!r}")
            doc["entries"][key] = {"measured_utc": stamp, **entry}
        if limits:
            doc["limits"] = {"measured_utc": stamp, **limits}
        atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    with _lock:
        _docs.pop(path, None)
    return path


def measured_xla_flags() -> dict[str, Any]:
    """The XLA flags this machine's cache measured as paying (read only: nothing is set; empty when none was
    measured or under ``IVHL_TUNING=frozen``): ``{"flags", "file", "measured_utc"}`` and ``"ignored"``, the flags
    of the file that are not among :data:`XLA_FLAG_CANDIDATES` (each warned about once, naming the file).

    Only the tuner's own candidates are ever returned: a cache file is data, and a flag such as ``--xla_dump_to``
    or one XLA does not know (which aborts every process at backend start) must not reach ``XLA_FLAGS`` from it."""
    if mode() == "frozen":
        return {}
    path = cache_path("cpu")
    if not os.path.exists(path):
        return {}
    with _lock:
        doc = _read(path)
    entry = (doc or {}).get("entries", {}).get("xla.flags|all")
    if entry is None:
        return {}
    flags = str(entry["settings"].get("xla_flags", "")).split()
    ignored = [f for f in flags if f not in XLA_FLAG_CANDIDATES]
    if ignored:
        _warn_once(
            f"flags:{path}",
            f"tuning cache {path} holds XLA flags that `ivhl tune` never measures ({' '.join(ignored)[:200]}); "
            f"ignored (the tuner's flags: {' '.join(XLA_FLAG_CANDIDATES)})",
        )
    return {
        "flags": [f for f in flags if f in XLA_FLAG_CANDIDATES],
        "file": path,
        "measured_utc": str(entry.get("measured_utc", "")),
        "ignored": ignored,
    }


def record_applied(what: Mapping[str, Any]) -> None:
    """Remember what :func:`ivhl_jax.run.tune.apply` did in this process (read back by :func:`applied_xla_flags`)."""
    _applied.clear()
    _applied.update(what)


def applied_xla_flags() -> dict[str, Any]:
    """What :func:`ivhl_jax.run.tune.apply` did with the measured XLA flags in this process (empty: not called,
    or no measured flag): ``{"flags", "file", "measured_utc", "applied", "why"}``."""
    return dict(_applied)


def set_auto_tuner(fn: Callable[[str, int, str], Mapping[str, Any] | None] | None) -> None:
    """Register ``fn(op, size, platform)``, which tunes ``op`` at ``size`` and records it (``IVHL_TUNING=auto``)."""
    global _auto_tuner
    _auto_tuner = fn


def auto_tune(op: str, size: int, platform_name: str) -> None:
    """Under ``IVHL_TUNING=auto``: tune ``op`` at ``size`` once per bucket and process (said on the console)."""
    key = (op, bucket(size))
    if _auto_tuner is None or key in _auto_busy:
        return
    _auto_busy.add(key)  # once per process, and no recursion from the tuner's own calls
    print(
        f"ivhl_jax: IVHL_TUNING=auto: tuning {op} for size bucket {key[1]} on this machine (once; stored in "
        f"{cache_dir()})",
        file=sys.stderr,
        flush=True,
    )
    try:
        _auto_tuner(op, size, platform_name)
    except Exception as e:  # noqa: BLE001 - tuning on the fly must never break the caller; the table is used
        _warn_once(
            f"auto:{key}",
            f"IVHL_TUNING=auto: tuning {op} failed ({type(e).__name__}: {str(e)[:120]}); the backend table is used",
        )
