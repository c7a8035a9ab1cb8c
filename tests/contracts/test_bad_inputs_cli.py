"""Every ``ivhl sim``/``ivhl train`` turns a bad configuration value into one line on stderr and exit status 2.

Each simulation is run in-process through the CLI's ``main`` once per config key, with that key set to a value
the run cannot use (a negative count, a NaN, an unknown choice, a non-boolean, a list entry out of range) on top
of a small configuration (so a value that slipped through would run briefly and fail the test, not hang it).
Whether the value is refused by ``validate()`` or by a builder while the run sets up, the user sees one line.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing

import pytest

from ivhl_jax import cli

# Small, fast configurations: a bad key is set after these, so it wins.
SMALL: dict[str, list[str]] = {
    "sim holography": ["n_sources=4", "grid=[8, 8]", "steps=2", "steps_per_chunk=2", "checkpoint_every=2"],
    "sim bec": ["grid=16", "ground_steps=100", "steps=2", "steps_per_chunk=2", "save_every=1", "checkpoint_every=2"],
    "sim gft": ["rank=2", "grid=4", "steps=2", "steps_per_chunk=2", "save_every=1", "checkpoint_every=2"],
    "sim cdt": [
        "slices=4",
        "volume=48",
        "chains=1",
        "steps=2",
        "steps_per_chunk=2",
        "save_every=1",
        "thermalise_max=4",
        "engine=jax",
        "origins=1",
        "curvature_samples=1",
    ],
    "sim mera": [
        "chis=4",
        "chi_mids=4",
        "layers=1",
        "steps=2",
        "steps_per_chunk=2",
        "checkpoint_every=2",
        "stuck_after=0",
        "stuck_every=0",
    ],
    "train lm": [
        *(f"model.{k}={v}" for k, v in {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "max_len": 16}.items()),
        *("seq_len=16", "max_bytes=20000", "batch_size=2", "steps=1", "eval_batches=1"),
    ],
    "train adaptive": ["dataset=synthetic", "synthetic_samples=64", "batch_size=8", "steps=1", "steps_per_chunk=1"],
    "train vortex_gru": "n_train=8 n_test=4 length=8 grid=8 hidden=4 layers=1 batch_size=4".split()
    + ["steps=1", "steps_per_chunk=1"],
}

# Keys that matter only with another setting: that setting is added before the bad value.
_SPIN1 = ["system=spin1", "spin1.c0=10", "spin1.c2=-1"]
_DIPOLAR = ["system=dipolar", "dims=3", "dipolar.eps_dd=0.5"]
CONTEXT: dict[str, dict[str, list[str]]] = {
    "sim bec": {
        "mixture.g12": ["system=mixture"],
        "mixture.g22": ["system=mixture", "mixture.g12=1"],
        "mixture.couplings": ["system=mixture"],
        "mixture.norms": ["system=mixture", "mixture.g12=1"],
        "spin1.c0": ["system=spin1", "spin1.c2=-1"],
        "spin1.c2": ["system=spin1", "spin1.c0=10"],
        "spin1.p": _SPIN1,
        "spin1.q": _SPIN1,
        "spin1.magnetization": _SPIN1,
        "dipolar.eps_dd": ["system=dipolar", "dims=3"],
        "dipolar.axis": _DIPOLAR,
        "dipolar.cutoff": _DIPOLAR,
    }
}

# Keys for which every value of their type is meaningful (seeds): a value of the wrong type stands for "bad".
ANY_VALUE = {"seed", "data_seed"}

# A bad value chosen by hand where the rule by type would be a legal value.
BY_HAND: dict[str, dict[str, str]] = {
    "sim holography": {"grid": "[1, 8]", "vortex_charges": "[1.5, 1]", "vortex_centers": "[[nan, 0.0]]"},
    "sim bec": {"imprints": "[[0.0, 0.0, 1.5]]"},
    "sim mera": {"chi_mids": "[-5]", "precision": '["f16"]'},
}


# Values a simulation owned elsewhere still accepts or refuses only after work started (its owner fixes them):
# {command: {key: reason}}.
XFAIL: dict[str, dict[str, str]] = {}


def _module(command: str) -> types.ModuleType:
    kind, name = command.split()
    return importlib.import_module(f"ivhl_jax.sims.{'train_' if kind == 'train' else ''}{name}")


def _bad_by_type(tp: typing.Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _bad_by_type(next(a for a in args if a is not type(None)))
    if origin is typing.Literal or tp is str:
        return '"bogus"'
    if tp is bool:
        return '"maybe"'
    if tp is int:
        return "-5"
    if tp is float:
        return "nan"
    if origin in (tuple, list):
        inner = args[0] if args else int
        return f"[{_bad_by_type(inner)}]"
    raise AssertionError(f"no bad value by type for {tp}")


def _keys(cls: type, prefix: str = "") -> list[tuple[str, typing.Any]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += _keys(tp, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, tp))
    return out


def _cases() -> list[typing.Any]:
    cases = []
    for command in SMALL:
        try:
            config_type = _module(command).SIMULATION.config_type
        except Exception as e:  # a simulation that does not import is reported by its own tests
            cases.append(
                pytest.param(
                    command,
                    "<import>",
                    "",
                    id=f"{command}-import",
                    marks=pytest.mark.skip(reason=f"does not import: {e}"),
                )
            )
            continue
        for key, tp in _keys(config_type):
            leaf = key.rsplit(".", 1)[-1]
            value = BY_HAND.get(command, {}).get(key)
            if value is None:
                value = "1.5" if leaf in ANY_VALUE else _bad_by_type(tp)
            reason = XFAIL.get(command, {}).get(key)
            marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
            cases.append(pytest.param(command, key, value, id=f"{command.replace(' ', '-')}-{key}", marks=marks))
    return cases


@pytest.mark.parametrize("command, key, value", _cases())
def test_a_bad_config_value_is_one_line_and_exit_2(command, key, value, tmp_path, capsys):
    argv = [*command.split(), "--out", str(tmp_path / "run"), "--no-progress"]
    for kv in [*SMALL[command], *CONTEXT.get(command, {}).get(key, []), f"{key}={value}"]:
        argv += ["--set", kv]
    rc = cli.main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and "a run shorter than one chunk" not in ln]
    assert rc == 2, f"{command} --set {key}={value}: exit {rc}, accepted; stderr:\n{err}"
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"ivhl {command}:"), err


def test_a_text_term_file_is_one_line_naming_term_file_and_the_formats(tmp_path, capsys):
    text = tmp_path / "h.npy"
    text.write_text("-1 0 0 0\n0 1 0 0\n0 0 1 0\n0 0 0 -1\n")
    argv = ["sim", "mera", "--out", str(tmp_path / "run"), "--no-progress"]
    small = [
        "chis=4,",
        "chi_mids=4,",
        "layers=1,",
        "steps=2,",
        "steps_per_chunk=2",
        "checkpoint_every=2",
        "stuck_after=0",
        "stuck_every=0",
    ]
    for kv in [*small, "model=custom", f"term_file={text}", "e0=-0.5"]:
        argv += ["--set", kv]
    assert cli.main(argv) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ivhl sim mera: term_file:"), lines
    assert "allow_pickle" not in lines[0] and ".npy" in lines[0] and ".npz" in lines[0], lines


def test_fft_ducc_without_ducc0_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ducc0", None)  # as if the cpu-fft extra were not installed
    argv = ["sim", "bec", "--out", str(tmp_path / "run"), "--no-progress"]
    for kv in [*SMALL["sim bec"], "fft=ducc"]:
        argv += ["--set", kv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and "a run shorter than one chunk" not in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "ivhl_jax[cpu-fft]" in lines[0] and lines[0].startswith("ivhl sim bec:"), err


def test_resume_and_no_resume_together_are_refused(tmp_path, capsys):
    argv = ["sim", "bec", "--out", str(tmp_path / "run"), "--resume", "--no-resume"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--no-resume: not allowed with argument --resume" in err, err
    assert not (tmp_path / "run").exists()
