"""The ``ivhl`` command line itself: --version, one-line usage errors, plain help text, and every ``ivhl ...``
command that the CLI's own output, the README and the guides cite parses."""

from __future__ import annotations

import glob
import importlib
import os
import re
import shlex
from importlib.metadata import version as dist_version

import pytest

import ivhl_jax
from ivhl_jax import cli
from ivhl_jax.run import driver
from ivhl_jax.run import launch as launch_module
from ivhl_jax.run.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _err_lines(capsys) -> tuple[str, list[str]]:
    cap = capsys.readouterr()
    return cap.out, [ln for ln in cap.err.splitlines() if ln.strip()]


def test_version_is_the_package_version(capsys):
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"ivhl_jax {ivhl_jax.__version__}" == f"ivhl_jax {dist_version('ivhl_jax')}"
    assert cli.main(["-V"]) == 0 and capsys.readouterr().out.strip() == out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["info", "--foo"], ["ivhl info:", "--foo"]),
        (["bench", "--op", "nosuchop"], ["ivhl bench:", "'nosuchop'", "valid ops:", "superpose", "gp_step"]),
        (["bench", "--size", "huge"], ["ivhl bench:", "huge"]),
        (["bench", "--bogus"], ["ivhl bench:", "--bogus"]),
        (["launch", "--nproc", "two", "--", "true"], ["ivhl launch:", "two"]),
        (["sim", "holography", "--bogus"], ["ivhl sim holography:", "--bogus"]),
        (["frobnicate"], ["ivhl: unknown command 'frobnicate'"]),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(argv, words, capsys):
    assert cli.main(argv) == 2
    out, err = _err_lines(capsys)
    assert len(err) == 1 and "Traceback" not in err[0], err
    for w in words:
        assert w in err[0], err


def _help_texts(capsys) -> dict[str, str]:
    """Every help text of the command line, as printed."""
    texts = {}
    argvs = [
        ["--help"],
        ["sim", "--help"],
        ["train", "--help"],
        ["bench", "--help"],
        ["tune", "--help"],
        ["launch", "--help"],
        ["info", "--help"],
    ]
    argvs += [["sim", n, "--help"] for n in cli._sim_modules()]
    argvs += [["train", n, "--help"] for n in cli._sim_modules("train_")]
    for argv in argvs:
        assert cli.main(argv) == 0, argv
        texts[" ".join(argv)] = capsys.readouterr().out
    return texts


def test_help_is_plain_complete_text(capsys):
    texts = _help_texts(capsys)
    for argv, text in texts.items():
        assert "``" not in text and not re.search(r":(func|class|mod|meth|attr|data|ref):`", text), (argv, text)
    # a simulation's description is the whole first paragraph of its docstring, not its first line
    for name in cli._sim_modules():
        module = importlib.import_module(f"ivhl_jax.sims.{name}")
        first = " ".join(module.__doc__.split("\n\n")[0].split())
        shown = " ".join(texts[f"sim {name} --help"].split())
        words = re.sub(r"``|:\w+:`~?|`", "", first).split()
        assert " ".join(words[-6:]) in shown, (name, words[-6:])


# --- every cited command parses ------------------------------------------------------------------------------------
_SPAN = re.compile(r"`{1,2}(ivhl [^`]+?)`{1,2}")
_LINE = re.compile(
    r"^\s*(?:\$ )?(ivhl (?:demo|info|sim|train|bench|tune|launch|--version|-V|--help)\b.*)$", re.MULTILINE
)
_AFTER_DASH = re.compile(r"— (ivhl [^()\n]+)")


def _commands_in(text: str, *, code_lines: bool) -> list[str]:
    """``ivhl ...`` commands cited in ``text``: in backticks, after an em dash (evidence lines), and (for code
    blocks and help screens) on lines of their own, cut at a comment or a two-space column gap."""
    found = [m.group(1) for m in _SPAN.finditer(text)] + [m.group(1) for m in _AFTER_DASH.finditer(text)]
    if code_lines:
        for m in _LINE.finditer(text):
            line = re.split(r"\s+#|\s{2,}", m.group(1).rstrip())[0]
            found.append(line.rstrip(" \\"))
    return [c.strip() for c in found]


def _is_template(argv: list[str]) -> bool:
    """A usage synopsis (``ivhl sim NAME [options]``), not a command: placeholders, brackets, ellipses."""
    return any(re.fullmatch(r"[A-Z][A-Z_]*(=[A-Z_.]+)?|.*\.\.\..*|\[.*|[^\[]*\]|<.*>", a) for a in argv)


def _check(argv: list[str]) -> None:
    """Parse ``ivhl`` ``argv`` as the command line would, without running it; AssertionError if it does not."""
    assert argv and argv[0] == "ivhl", argv
    cmd, rest = (argv[1], argv[2:]) if len(argv) > 1 else ("--help", [])
    if cmd in ("--version", "-V", "--help", "-h", "help"):
        assert not rest, argv
        return
    if not rest and cmd in ("demo", "info", "sim", "train", "bench", "tune", "launch"):
        return  # the command named in prose (`ivhl launch` starts ...)
    if "--help" in rest or "-h" in rest:
        assert cli.main([cmd, *rest]) == 0, argv
        return
    if cmd == "info":
        assert not rest, argv
    elif cmd == "bench":
        args = cli.bench_parser().parse_args(rest)
        from ivhl_jax.bench import harness

        assert set(args.op or []) <= set(harness.registry()), argv
    elif cmd == "tune":
        options = set(re.findall(r"--[\w-]+", _stdout_of_help(["tune"])))
        assert {a.split("=")[0] for a in rest if a.startswith("--")} <= options, argv
    elif cmd == "launch":
        split = rest.index("--") if "--" in rest else len(rest)
        launch_module.parser().parse_args(rest[:split])
        assert rest[split + 1 :], f"{argv}: no command after --"
        if rest[split + 1] == "ivhl":
            _check(rest[split + 1 :])
    elif cmd in ("demo", "sim", "train"):
        if cmd == "demo":
            name, rest, kind = "holography", ["--demo", *rest], "sim"
        else:
            assert rest, argv
            name, rest, kind = rest[0], rest[1:], cmd
        prefix = "train_" if kind == "train" else ""
        if name in ("--list", "-l") and not rest:
            return
        assert name in cli._sim_modules(prefix), f"{argv}: no {kind} named {name!r}"
        module = importlib.import_module(f"ivhl_jax.sims.{prefix}{name}")
        if "--generate" in rest:
            module.generate_parser().parse_args(rest)
            return
        sim = module.SIMULATION
        args = driver._parser(sim).parse_args(rest)
        overrides = list(args.set) + sim.overrides(args)
        load_config(sim.config_type, None, overrides, validate=False)  # every key known, every value typed
    else:
        raise AssertionError(f"{argv}: no command {cmd!r}")


def _stdout_of_help(command: list[str]) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main([*command, "--help"]) == 0, command
    return buf.getvalue()


def _cited(capsys) -> dict[str, set[str]]:
    """``{command: {where it is cited}}`` over the CLI's outputs, the sims' docstrings, the README and guides."""
    from ivhl_jax.run.device import format_report

    sources: dict[str, tuple[str, bool]] = {f"ivhl {k}": (v, True) for k, v in _help_texts(capsys).items()}
    sources["ivhl info"] = (format_report(), True)
    for name in cli._sim_modules() + ["train_" + n for n in cli._sim_modules("train_")]:
        sources[f"ivhl_jax.sims.{name}"] = (importlib.import_module(f"ivhl_jax.sims.{name}").__doc__ or "", True)
    docs = [
        os.path.join(ROOT, "README.md"),
        *sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)),
    ]
    for path in docs:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        blocks = "\n".join(re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.DOTALL))
        sources[os.path.relpath(path, ROOT)] = (text, False)
        sources[os.path.relpath(path, ROOT) + " (code)"] = (blocks, True)
    cited: dict[str, set[str]] = {}
    for where, (text, code_lines) in sources.items():
        for command in _commands_in(text, code_lines=code_lines):
            cited.setdefault(command, set()).add(where)
    return cited


def test_every_cited_command_parses(capsys):
    cited = _cited(capsys)
    checked, bad = 0, []
    for command, where in sorted(cited.items()):
        try:
            argv = shlex.split(command)
        except ValueError as e:
            bad.append(f"{command!r} (in {sorted(where)}): {e}")
            continue
        if _is_template(argv):
            continue
        try:
            _check(argv)
        except (AssertionError, SystemExit, ValueError, TypeError) as e:
            bad.append(f"{command!r} (in {sorted(where)}): {type(e).__name__}: {e}")
        else:
            checked += 1
        capsys.readouterr()
    assert not bad, "\n".join(bad)
    assert checked >= 40, checked  # the README and the guides cite dozens; a broken extraction would find none


def test_the_checker_refuses_what_is_not_a_command():
    for argv in (
        ["ivhl", "bench", "fields", "--size", "medium"],
        ["ivhl", "info", "--foo"],
        ["ivhl", "sim", "nosuch"],
        ["ivhl", "sim", "holography", "--set", "bogus=1"],
        ["ivhl", "bench", "--op", "nosuchop"],
        ["ivhl", "launch", "--nproc", "2"],
        ["ivhl", "tune2"],
        ["ivhl", "sim", "mera", "--set", "chis=4"],
    ):
        with pytest.raises((AssertionError, SystemExit, ValueError, TypeError)):
            _check(argv)
