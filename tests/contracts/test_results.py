"""Every file under bench/results/ says how to reproduce it: the provenance header of
``ivhl_jax.bench.harness.write_results`` (command, commit, dirty flag, date, machine, versions), and every module,
script, subcommand and bench op its command cites exists in this tree."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shlex

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
FILES = sorted(p for p in RESULTS.iterdir() if p.is_file()) if RESULTS.is_dir() else []
CLI_COMMANDS = ("demo", "info", "sim", "train", "bench", "launch", "tune")


def _module_exists(name: str) -> bool:
    if name.startswith("bench.studies."):  # run from the repository root, never installed
        return (REPO / (name.replace(".", "/") + ".py")).is_file()
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _bench_ops() -> set[str]:
    from ivhl_jax.bench import harness

    return set(harness.registry())


def _check_overrides(module: str, overrides: list[str]) -> list[str]:
    """The ``--set key=value`` overrides of one ``ivhl sim/train`` command, loaded into its config (a renamed or
    unknown key, or a value the config refuses, is a problem)."""
    if not overrides:
        return []
    from ivhl_jax.run.config import load_config

    sim = importlib.import_module(module).SIMULATION
    try:
        load_config(sim.config_type, None, overrides)
    except (TypeError, ValueError) as e:
        return [f"{module}: --set {' '.join(overrides)}: {e}"]
    return []


def _check_command(command: str) -> list[str]:
    """What a command cites that this tree does not have (one entry per missing piece)."""
    problems = []
    for part in command.split("&&"):
        words = shlex.split(part)
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value prefixes
            words.pop(0)
        if not words:
            problems.append(f"empty command in {command!r}")
        elif words[0] in ("python", "python3") and words[1:2] == ["-m"]:
            if len(words) < 3 or not _module_exists(words[2]):
                problems.append(f"no module {words[2] if len(words) > 2 else ''!r}")
        elif words[0] in ("python", "python3", "bash"):
            if len(words) < 2 or not (REPO / words[1]).is_file():
                problems.append(f"no script {words[1] if len(words) > 1 else ''!r}")
        elif words[0] == "ivhl":
            sub = words[1] if len(words) > 1 else ""
            if sub not in CLI_COMMANDS:
                problems.append(f"no ivhl subcommand {sub!r}")
            elif sub in ("sim", "train"):
                name = words[2] if len(words) > 2 else ""
                module = f"ivhl_jax.sims.{'train_' if sub == 'train' else ''}{name}"
                if not _module_exists(module):
                    problems.append(f"no `ivhl {sub} {name}` ({module})")
                else:
                    problems += _check_overrides(
                        module, [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]
                    )
            elif sub == "bench":
                ops = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--op"]
                problems += [f"no bench op {op!r}" for op in ops if op not in _bench_ops()]
        else:
            problems.append(f"not a command of this tree: {part.strip()!r}")
    return problems


def test_results_folder_has_files():
    assert FILES, "bench/results/ is empty or missing"


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_results_file_has_its_provenance_header(path):
    name = f"bench/results/{path.name}"
    assert path.suffix == ".json", f"{name}: results are JSON written by ivhl_jax.bench.harness.write_results"
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict) and next(iter(doc), None) == "provenance", (
        f"{name}: no provenance header (write it with ivhl_jax.bench.harness.write_results)"
    )
    h = doc["provenance"]
    missing = [k for k in ("command", "commit", "dirty", "date_utc", "machine", "versions") if k not in h]
    assert not missing, f"{name}: the provenance header lacks {missing}"
    assert isinstance(h["command"], str) and h["command"].strip(), f"{name}: empty command"
    assert isinstance(h["commit"], str) and re.fullmatch(r"[0-9a-f]{40}", h["commit"]), (
        f"{name}: commit must be a full git hash, got {h['commit']!r}"
    )
    assert isinstance(h["dirty"], bool) or (h["dirty"] is None and h.get("commit_note")), (
        f"{name}: dirty must be true/false (or null with a commit_note saying why it is unknown)"
    )
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d", h["date_utc"]), f"{name}: date_utc {h['date_utc']!r}"
    assert h["machine"] == "not recorded" or (isinstance(h["machine"], dict) and "platform" in h["machine"]), (
        f"{name}: machine must say the platform (or be 'not recorded')"
    )
    for lib in ("ivhl_jax", "jax", "jaxlib"):
        assert lib in h["versions"], f"{name}: versions lacks {lib}"
    problems = _check_command(h["command"])
    assert not problems, f"{name}: its command cites what this tree does not have: {problems}"


def _recorded_commands(obj) -> list[str]:
    """Every string under a key named ``command`` or ``commands`` (the commands of a file's individual runs)."""
    out: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("command", "commands"):
                out += (
                    [v]
                    if isinstance(v, str)
                    else [x for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, str)]
                )
            else:
                out += _recorded_commands(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _recorded_commands(v)
    return out


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_recorded_command_cites_modules_of_this_tree(path):
    doc = json.loads(path.read_text(encoding="utf-8"))
    cited = {m for c in _recorded_commands(doc) for m in re.findall(r"python3? -m ([A-Za-z_][\w.]*)", c)}
    missing = sorted(m for m in cited if not _module_exists(m))
    assert not missing, f"bench/results/{path.name} records commands of modules this tree does not have: {missing}"


def test_command_check_catches_what_is_missing():
    assert _check_command("python -m ivhl_jax.bench.mera_ladder --x 1") == ["no module 'ivhl_jax.bench.mera_ladder'"]
    assert _check_command("ivhl sim nosuchsim") == ["no `ivhl sim nosuchsim` (ivhl_jax.sims.nosuchsim)"]
    assert _check_command("XLA_FLAGS=--x=8 ivhl bench --op no_such_op --size small") == ["no bench op 'no_such_op'"]
    assert _check_command("python -m bench.studies.cdt_dimensions && ivhl train lm") == []
    assert _check_command("ivhl train adaptive --set preset=reference --set steps_per_chunk=500 --set steps=3000") == []
    assert _check_command("ivhl train adaptive --set chunk=500")[0].startswith(
        "ivhl_jax.sims.train_adaptive: --set chunk=500: unknown config key(s) ['chunk']"
    )
    assert _check_command("git show d695879:bench/x.py") == [
        "not a command of this tree: 'git show d695879:bench/x.py'"
    ]
