"""Typed run configurations: a frozen dataclass per simulation, filled from TOML/JSON and overrides.

Every simulation and training script declares its configuration as a dataclass with defaults (the
embedded default run). :func:`load_config` reads an optional TOML or JSON file and ``key=value``
overrides, rejects unknown keys and wrongly typed values by name, and calls the dataclass's
``validate()`` method if it has one::

    @dataclasses.dataclass(frozen=True)
    class HolographyConfig:
        n_sources: int = option(64, "number of point sources on the helix")
        grid: tuple[int, int] = option((128, 128), "points per axis")

    cfg = load_config(HolographyConfig, "run.toml", ["n_sources=128"])

Each field's meaning, shown by ``--help``, is the ``"help"`` entry of its metadata (:func:`option`). A value is
read as its field's type (``typing.get_type_hints``): a table maps each type, or each generic origin (union,
``Literal``, ``tuple``, ``list``, ``dict``), to the function that reads it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import tomllib
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from ivhl_jax.run.lock import check_not_link, check_out_dir, run_dir_lock

__all__ = [
    "T",
    "option",
    "read_config_file",
    "load_config",
    "clip_short_run",
    "config_dict",
    "config_defaults",
    "differing_keys",
    "add_run_arguments",
    "prepare_run_dir",
    "settings_in_force",
    "OneLineArgumentParser",
    "plain_text",
]

T = TypeVar("T")


def option(default: Any = dataclasses.MISSING, help: str = "", *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A config dataclass field with its meaning: ``dataclasses.field(default=default,
    metadata={"help": help})`` (or ``default_factory=``), the text ``--help`` shows beside the key."""
    if not isinstance(help, str) or not help.strip():
        raise ValueError(f"help must be a non-empty string saying what the key means, got {help!r}")
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def _to_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise TypeError(f"config key {key!r} must be true/false, got {value!r}")


def _to_int(value: Any, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
    raise TypeError(f"config key {key!r} must be an integer, got {value!r}")


def _to_float(value: Any, key: str) -> float:
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"config key {key!r} must be a number, got {value!r}") from e


def _to_str(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"config key {key!r} must be a string, got {value!r}")
    return value


#: a config field of one of these types is read by its function (``value, key -> value``)
_SCALARS: dict[Any, Callable[[Any, str], Any]] = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def _to_union(value: Any, tp: Any, key: str) -> Any:
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    for a in args:
        if a is not type(None):
            with contextlib.suppress(TypeError, ValueError):
                return _coerce(value, a, key)
    raise TypeError(f"config key {key!r}: {value!r} matches none of {tp}")


def _to_literal(value: Any, tp: Any, key: str) -> Any:
    if value not in typing.get_args(tp):
        raise ValueError(f"config key {key!r} must be one of {list(typing.get_args(tp))}, got {value!r}")
    return value


def _to_sequence(value: Any, tp: Any, key: str) -> Any:
    """A list or tuple field: a TOML array, or ``a,b,c`` from ``--set`` (brackets and parentheses ignored)."""
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
    if isinstance(value, str):
        value = [v for v in value.replace("(", "").replace(")", "").split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"config key {key!r} must be a list, got {value!r}: say --set {key}={value},{value} "
            f"(comma-separated; one entry: --set {key}={value},), or {key} = [{value}] in a file"
        )
    if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[int, int]: fixed length, a type per entry
        if len(value) != len(args):
            raise ValueError(f"config key {key!r} must have {len(args)} entries, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    inner = args[0] if args else Any
    out = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    return tuple(out) if origin is tuple else out


def _to_dict(value: Any, tp: Any, key: str) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"config key {key!r} must be a table/dict, got {value!r}")
    return dict(value)


#: a config field whose type is generic over one of these (``typing.get_origin``) is read by its function
_GENERICS: dict[Any, Callable[[Any, Any, str], Any]] = {
    typing.Union: _to_union,
    types.UnionType: _to_union,
    typing.Literal: _to_literal,
    tuple: _to_sequence,
    list: _to_sequence,
    dict: _to_dict,
}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` (from TOML, JSON or a ``--set`` override) as the field type ``tp``; a TypeError or ValueError
    naming the config key ``key`` when it is not one. Types outside the tables pass through unchanged."""
    if tp is Any:
        return value
    generic = _GENERICS.get(typing.get_origin(tp) or tp)
    if generic is not None:
        return generic(value, tp, key)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return _build(tp, _to_dict(value, dict, key), prefix=f"{key}.")
    scalar = _SCALARS.get(tp)
    return value if scalar is None else scalar(value, key)


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _build(cls: type[T], values: dict[str, Any], prefix: str = "", base: Any = None, validate: bool = True) -> T:
    """``cls`` from ``values``; keys not given keep ``base``'s values (or the class defaults).

    A nested table (``model.d_model=256``, a ``[model]`` TOML table) updates the *embedded default* of that
    field key by key (e.g. the LM's own small ``TransformerConfig``), not the nested class's defaults.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cast(Any, cls)) if f.init}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown config key(s) {[prefix + u for u in unknown]} for {cls.__name__}; "
            f"valid keys: {sorted(prefix + f for f in fields)}"
        )
    kwargs = {}
    for k, v in values.items():
        sub = getattr(base, k) if base is not None else (_field_default(fields[k]) if isinstance(v, dict) else None)
        if isinstance(v, dict) and dataclasses.is_dataclass(sub) and not isinstance(sub, type):
            kwargs[k] = _build(type(sub), v, prefix=f"{prefix}{k}.", base=sub)
        else:
            kwargs[k] = _coerce(v, hints[k], prefix + k)
    obj = dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    if validate and hasattr(obj, "validate"):
        obj.validate()
    return obj


def _parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r} must look like key=value (nested: section.key=value)")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # bare words are strings: `activation=gelu`
    return key.strip().split("."), value


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a ``.toml`` or ``.json`` configuration file into a dict."""
    path = os.fspath(path)
    if not path.endswith((".toml", ".json")):
        raise ValueError(f"config file {path!r} must end in .toml or .json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    from ivhl_jax.run.io import check_nesting

    kind = path.rsplit(".", 1)[-1].upper()
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f) if kind == "TOML" else json.loads(f.read().decode("utf-8"))
    except RecursionError:  # the parsers recurse per level: a file of nested brackets is refused, not a crash
        raise ValueError(f"config file {path!r} nests lists or tables too deeply to be a configuration") from None
    except ValueError as e:  # TOMLDecodeError, JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"config file {path!r} is not valid {kind}: {' '.join(str(e).split())}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"config file {path!r} holds a {kind} {type(doc).__name__}, not a table of config keys")
    return check_nesting(doc, f"config file {path!r}")


def load_config(
    cls: type[T], path: str | os.PathLike | None = None, overrides: Sequence[str] = (), *, validate: bool = True
) -> T:
    """Build ``cls`` from its defaults, then a config file, then ``key=value`` overrides.

    ``validate=False`` skips the top-level ``validate()`` (nested configs are still validated), for a caller
    that adjusts the config first (:func:`clip_short_run`) and validates after."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"cls must be a dataclass type, got {cls!r}")
    values: dict[str, Any] = read_config_file(path) if path is not None else {}
    for text in overrides:
        keys, value = _parse_override(text)
        node = values
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return _build(cls, values, validate=validate)


def _plain_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def clip_short_run(cfg: T) -> tuple[T, dict[str, tuple[int, int]]]:
    """``cfg`` with its chunking clipped to a run shorter than one chunk; returns ``(cfg, {key: (old, new)})``.

    A smoke run (``--set steps=1``) should run, not be refused because ``steps`` is below ``steps_per_chunk``
    or ``warmup_steps``. The keys are read by name, so every run configuration gets the same rule:

    * ``steps_per_chunk`` > ``steps`` becomes ``steps`` (for per-stage ``steps``, a list, the greatest common
      divisor of the stages when one of them is shorter than a chunk, so every stage is whole chunks);
    * ``save_every`` that no longer divides the chunk becomes ``gcd(steps_per_chunk, save_every)``;
    * ``checkpoint_every`` that is no longer a multiple of the chunk is rounded up to one (0 stays 0);
    * ``warmup_steps`` > ``steps`` becomes ``steps``.

    Nothing changes when ``steps`` is at least one chunk, or when a key holds something other than a positive
    integer (``validate()`` then reports it). The result is not validated.
    """
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"cfg must be a config dataclass instance, got {type(cfg).__name__}")
    names = {f.name for f in dataclasses.fields(cfg)}
    changes: dict[str, tuple[int, int]] = {}
    steps: Any = getattr(cfg, "steps", None)
    chunk: Any = getattr(cfg, "steps_per_chunk", None)
    short: int | None = None  # the chunk a run shorter than one chunk gets
    if (
        _plain_int(chunk)
        and isinstance(steps, (list, tuple))
        and steps
        and all(_plain_int(n) and n >= 1 for n in steps)
    ):
        short = math.gcd(*steps) if min(steps) < chunk else None
    elif _plain_int(chunk) and _plain_int(steps) and 1 <= steps < chunk:
        short = steps
    if short is not None and "steps_per_chunk" in names and _plain_int(chunk) and chunk > short:
        changes["steps_per_chunk"] = (chunk, short)
        chunk = short
        save: Any = getattr(cfg, "save_every", None)
        if "save_every" in names and _plain_int(save) and save >= 1 and chunk % save:
            changes["save_every"] = (save, math.gcd(chunk, save))
        ckpt: Any = getattr(cfg, "checkpoint_every", None)
        if "checkpoint_every" in names and _plain_int(ckpt) and ckpt >= 1 and ckpt % chunk:
            changes["checkpoint_every"] = (ckpt, -(-ckpt // chunk) * chunk)
    warm: Any = getattr(cfg, "warmup_steps", None)
    if "warmup_steps" in names and _plain_int(warm) and _plain_int(steps) and steps >= 1 and warm > steps:
        changes["warmup_steps"] = (warm, steps)
    if changes:
        cfg = dataclasses.replace(cast(Any, cfg), **{k: new for k, (_, new) in changes.items()})
    return cfg, changes


def config_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (for result files and checkpoint metadata)."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"cfg must be a config dataclass instance, got {type(cfg).__name__}")
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def config_defaults(cfg: Any) -> dict[str, Any]:
    """The JSON-ready default value of every field of the config dataclass ``cfg`` (an instance or the class)
    that has one; a section (a nested config dataclass) as the dict of its keys' defaults."""
    if not dataclasses.is_dataclass(cfg):
        raise TypeError(f"cfg must be a config dataclass, got {type(cfg).__name__}")
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        if dataclasses.is_dataclass(out.get(f.name)) and not isinstance(out[f.name], type):
            out[f.name] = dataclasses.asdict(out[f.name])
    return json.loads(json.dumps(out, default=str))


def differing_keys(
    old: dict[str, Any], new: dict[str, Any], *, defaults: dict[str, Any] | None = None, extendable: Sequence[str] = ()
) -> list[str]:
    """The keys whose values differ between a run's saved configuration ``old`` and ``new`` (both JSON-ready
    dicts), sorted; ``extendable`` keys are not compared. A key that ``old`` lacks (a setting added to the
    library after that run was written) is the same when ``new`` holds its default (``defaults``), so such a
    run still resumes; a section (a nested table with a table of defaults) is compared key by key the same way."""
    for name, d in (("old", old), ("new", new), ("defaults", defaults if defaults is not None else {})):
        if not isinstance(d, dict):
            raise TypeError(f"{name} must be a dict of config keys (config_dict of a config), got {type(d).__name__}")
    defaults = defaults or {}
    keys = (set(old) | set(new)) - set(extendable)
    missing = object()

    def same(k: str) -> bool:
        a, b = old.get(k, missing), new.get(k, missing)
        if a is missing and b is not missing and k in defaults:
            a = defaults[k]
        if isinstance(a, dict) and isinstance(b, dict) and isinstance(defaults.get(k), dict):
            return not differing_keys(a, b, defaults=defaults[k])
        return a == b

    return sorted(k for k in keys if not same(k))


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(?P<body>[^`]+)`")


def _role_text(m: re.Match) -> str:
    body = m["body"]
    if body.endswith(">") and " <" in body:  # :ref:`text <target>`
        return body[: body.rindex(" <")]
    if body.startswith("~"):  # :func:`~a.b.c` shows c
        return body[1:].rsplit(".", 1)[-1]
    return body


def plain_text(text: str) -> str:
    """``text`` (a docstring, a config comment) with its reStructuredText markup removed, for a terminal:
    a cross-reference role (func, class, mod, ...) around a dotted name shows the name, only its last part
    when the name starts with ``~``; a role with a title shows the title; a ``double-backticked`` literal loses
    its backticks; a ``::`` that opens a literal block becomes ``:``. Single backticks (a command quoted in a
    message) stay."""
    text = _ROLE.sub(_role_text, text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    return re.sub(r"(?<=\S)::(?=\s*$)", ":", text, flags=re.MULTILINE)


class OneLineArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose usage errors (an unknown option, a bad value, a missing argument) are
    one line on stderr naming the command and where its options are listed, exit status 2 — not the usage block
    followed by the error."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: {' '.join(message.split())} (`{self.prog} --help` lists the options)\n")


def add_run_arguments(
    parser: argparse.ArgumentParser,
    *,
    out: str | None,
    resume: bool | None = True,
    config_help: str = "TOML or JSON file with the run's config keys",
    out_help: str | None = None,
) -> argparse.ArgumentParser:
    """The options every ``ivhl sim``/``ivhl train`` command shares.

    ``--config FILE``, ``--set KEY=VALUE`` (repeatable, passed to :func:`load_config` as overrides),
    ``--out DIR`` (default ``out``), ``--resume/--no-resume`` (continue from ``DIR/ckpt`` if a checkpoint
    exists; default ``resume``) and ``--no-progress``.
    """
    parser.add_argument("--config", help=config_help)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (repeatable; nested keys as section.key)",
    )
    default_help = f"output folder (default {out})" if out else "output folder"
    parser.add_argument("--out", default=out, help=out_help or default_help)
    either = parser.add_mutually_exclusive_group()  # both at once is a one-line error, not "the last one wins"
    either.add_argument(
        "--resume", action="store_true", help="continue from the checkpoint in <out>/ckpt if there is one"
    )
    either.add_argument("--no-resume", dest="resume", action="store_false", help="start afresh (drops <out>/ckpt)")
    parser.set_defaults(resume=resume)
    parser.add_argument("--no-progress", action="store_true", help="do not show progress")
    return parser


def prepare_run_dir(out: str | os.PathLike, cfg: Any, *, resume: bool, extendable: Sequence[str] = ()) -> str:
    """Make ``out`` ready for a run of ``cfg``; return its checkpoint folder ``out/ckpt``.

    Without ``resume`` an existing checkpoint is deleted. With it, the checkpoint must come from the same
    configuration (``out/config.json``), except for the ``extendable`` keys (a larger step count extends a
    finished run) and for settings the saved configuration lacks that hold their defaults (a run written before
    the setting existed, :func:`differing_keys`); otherwise a ValueError names the keys that differ. ``cfg`` is
    then written to ``out/config.json``, and the backend settings in force with their sources to ``out/settings.json``
    (:func:`settings_in_force`). The folder's lock (:func:`ivhl_jax.run.lock.run_dir_lock`) is held while it is
    prepared (a caller that holds it for the whole run, like the driver, keeps it): a second run into it raises
    :class:`ivhl_jax.run.lock.RunDirLockedError` naming the folder. A checkpoint folder that is a symbolic link,
    or a ``config.json`` that is not a JSON object, is refused in one line naming it.
    """
    out = check_out_dir(out)
    os.makedirs(out, exist_ok=True)
    with run_dir_lock(out):  # before anything in it is deleted or compared
        return _prepare_locked(out, cfg, resume=resume, extendable=extendable)


def _prepare_locked(out: str, cfg: Any, *, resume: bool, extendable: Sequence[str]) -> str:
    from ivhl_jax.run.io import read_json, write_json

    ckpt_dir = check_not_link(os.path.join(out, "ckpt"), "checkpoint folder")
    cfg_path = os.path.join(out, "config.json")
    # A checkpoint folder with no step in it (a run that stopped at a configuration error before its first
    # checkpoint) holds nothing to resume, so it does not tie the folder to its configuration. Steps may sit one
    # level down (a simulation that keeps a checkpointer per stage: <out>/ckpt/stage<k>/<step>).
    holds_steps = os.path.isdir(ckpt_dir) and any(name.isdigit() for _, dirs, _ in os.walk(ckpt_dir) for name in dirs)
    if os.path.isdir(ckpt_dir):
        if not resume:
            shutil.rmtree(ckpt_dir)
        elif holds_steps and os.path.isfile(cfg_path):
            old = read_json(cfg_path, "the run's configuration", fix="use --no-resume to start over or another --out")
            diff = differing_keys(old, config_dict(cfg), defaults=config_defaults(cfg), extendable=extendable)
            if diff:
                raise ValueError(
                    f"{out} holds a checkpoint of a different configuration (differs in {diff}); "
                    "use --no-resume to start over or another --out"
                )
    os.makedirs(out, exist_ok=True)
    write_json(cfg_path, config_dict(cfg))
    write_json(os.path.join(out, "settings.json"), settings_in_force())
    return ckpt_dir


def settings_in_force() -> dict[str, Any]:
    """The backend settings a run uses, each with its source (the tuning cache file and when it was measured,
    or the table and its evidence), the tuning mode and the XLA flags: written to every run folder as
    ``settings.json`` beside ``config.json``."""
    from ivhl_jax.core import backend, tuning_cache

    return {
        "platform": backend.platform(),
        "tuning_mode": tuning_cache.mode(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "settings": backend.describe(),
    }
