"""Every example of README.md, docs/index.md, docs/design.md and docs/guide/*.md runs as printed.

Python. Every ```python block is executed as its exact text (dedented when it sits in a list item), in a fresh
namespace, with a fresh empty folder as the working directory. Two marks, written in the page on the line before
a block's opening fence, change that, and nothing else does:

* ``<!-- fragment: REASON -->`` — the block is deliberately incomplete (an API sketch on the reader's data, the
  pattern of a hand-written loop); it is not run, and REASON says why;
* ``<!-- continues -->`` — the block continues the page's previous block (it runs in that block's namespace,
  after it, in the same test).

Markdown renders neither mark. Some blocks are then checked against an exact or stated answer (``CHECKS``); the
heavy ones run in the slow step (``SLOW``).

Commands. Every line of every ```bash block is collected. Each ``ivhl sim``/``ivhl train`` command is parsed
with its own command-line options and its configuration built and validated as the command would (a ```toml
block whose first line is ``# NAME.toml`` is the file a command's ``--config NAME.toml`` reads); ``ivhl bench``
commands are parsed and their ops looked up. Commands of one page that write the same output folder must be
one run (equal configurations, or only a larger step count: a resume that extends it) or start over with
``--no-resume``: otherwise the second would stop at "holds a checkpoint of a different configuration". The slow
test runs each page's ``ivhl sim``/``ivhl train`` commands as printed, one process each, in a fresh folder, with
only their step counts cut (``TINY``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import adaptive, gru, trajectory

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/index.md", "docs/design.md"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "guide").glob("*.md")
)
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[^`\s]*)\s*$")
MARK = re.compile(r"^\s*<!--\s*(?P<kind>fragment|continues)\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    mark: str | None = None  # "fragment", "continues" or None
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str, lang: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` (of language ``lang``), each with the mark on the line before its fence."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m["info"]:
            start, body = i, []
            i += 1
            while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i])
                i += 1
            prev = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
            mk = MARK.match(prev)
            if lang is None or m["info"] == lang:
                text = textwrap.dedent("\n".join(body)) + "\n"
                kind, reason = (mk["kind"], mk["reason"] or "") if mk else (None, "")
                out.append(Block(page, start + 1, m["info"], text, kind, reason))
        i += 1
    return out


def units(page: str) -> list[list[Block]]:
    """The runnable python blocks of ``page`` grouped into runs: a block and the blocks that continue it."""
    groups: list[list[Block]] = []
    for b in blocks(page, "python"):
        if b.mark == "fragment":
            continue
        if b.mark == "continues":
            assert groups, f"{b.id}: marked <!-- continues --> but no runnable block comes before it"
            groups[-1].append(b)
        else:
            groups.append([b])
    return groups


ALL_UNITS = [u for page in PAGES for u in units(page)]


@contextlib.contextmanager
def _fresh_folder(path: Path):
    """Run in ``path`` (the examples write relative paths) and restore the global JAX precision after (an example
    may switch float64 on for the rest of the session, as a user's script would)."""
    here, x64 = os.getcwd(), bool(jax.config.jax_enable_x64)
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(here)
        jax.config.update("jax_enable_x64", x64)


def run_unit(unit: list[Block], folder: Path) -> dict:
    """Execute the blocks of ``unit`` as printed, in order, in one fresh namespace, in ``folder``."""
    ns: dict = {"__name__": "__main__"}
    with _fresh_folder(folder):
        for b in unit:
            exec(compile(b.text, b.id, "exec"), ns)  # noqa: S102 - the project's own documented example
    return ns


def find_unit(page: str, marker: str) -> list[Block]:
    found = [u for u in ALL_UNITS if u[0].page == page and marker in u[0].text]
    assert len(found) == 1, f"{page}: expected one runnable python block containing {marker!r}, found {len(found)}"
    return found[0]


# ------------------------------------------------------------------------------------------------ the checks


def _check_adaptive(ns: dict, out: str) -> None:
    """obs["phase_fractions"] is [10, 4] (rows sum to 1) and hs is [T, B, H], the GRU cell stepped by hand."""
    fr = np.asarray(ns["obs"]["phase_fractions"])
    assert fr.shape == (10, 4)
    np.testing.assert_allclose(fr.sum(-1), 1.0, rtol=1e-6)
    hs = np.asarray(ns["hs"])
    assert hs.shape == (5, 2, 16)
    h, by_hand = ns["h0"], []
    for x in ns["xs"]:
        h = gru.cell(ns["gru_weights"], h, x)
        by_hand.append(h)
    np.testing.assert_allclose(hs, np.stack(by_hand), rtol=1e-6, atol=1e-6)


def _check_checkpoints(ns: dict, out: str) -> None:
    """Prints "100 100 200" (two chunks, then a resume at step 100 to 200), and the resumed chain is
    bit-identical to four chunks run straight through without checkpoints."""
    from ivhl_jax.run.runner import run_chunked

    assert out.split() == ["100", "100", "200"]
    straight = run_chunked(ns["advance"], ns["chain"], n_chunks=4, steps_per_chunk=50, progress=False)
    assert straight.steps == 200
    for a, b in zip(jax.tree_util.tree_leaves(ns["more"].state), jax.tree_util.tree_leaves(straight.state)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _check_precision(ns: dict, out: str) -> None:
    """fp16 compute with loss scaling, float32 master weights; at w = 0 the loss of the batch (x = 1, y = 1) is
    exactly mean((0 - 1)²) = 1, and the scale finite and positive."""
    assert out.splitlines()[0].endswith("True")  # needs_loss_scaling
    m = ns["metrics"]
    assert float(m["loss"]) == 1.0
    assert np.isfinite(float(m["loss_scale"])) and float(m["loss_scale"]) > 0
    assert ns["state"].params["w"].dtype == jnp.float32
    w = np.asarray(ns["state"].params["w"])
    if bool(m["skipped"]):
        assert np.all(w == 0)  # a skipped step leaves the master weights untouched
    else:
        assert np.all(np.isfinite(w)) and np.all(w > 0)  # Adam's first step moves every w by +lr toward y


def _check_parallel_training(ns: dict, out: str) -> None:
    """The sharded step over every device gives the single-device step's loss (exactly 1 at w = 0 on ones) and
    parameters."""
    from ivhl_jax import training

    assert ns["mesh"].shape["data"] == jax.device_count()
    ref = training.init_train_state(ns["params"], ns["opt"], key=jax.random.key(0))
    ref, ref_m = jax.jit(training.make_train_step(ns["loss_fn"], ns["opt"]))(ref, ns["my_rows"])
    assert float(ns["metrics"]["loss"]) == float(ref_m["loss"]) == 1.0
    np.testing.assert_allclose(np.asarray(ns["state"].params["w"]), np.asarray(ref.params["w"]), rtol=1e-6, atol=1e-7)


def _check_parallel_fft(ns: dict, out: str) -> None:
    """The pencil-decomposed run keeps the layout P("x", "y", None) and equals the same system run on one device."""
    from jax.sharding import PartitionSpec as P

    from ivhl_jax.physics import condensate as C

    psi = ns["psi"]
    assert psi.sharding.spec == P("x", "y", None)
    grid = ns["grid"]
    one = C.strang(C.GPSystem.create(grid, C.harmonic(grid), 500.0), 1e-3)
    ref, _ = trajectory(one, one.init(ns["psi0"]), 100)
    ref = np.asarray(ref)
    assert np.max(np.abs(np.asarray(psi) - ref)) <= 1e-5 * np.max(np.abs(ref))


def _check_bogoliubov(ns: dict, out: str) -> None:
    """The 7 lowest ω (in ω₀) are the stated 1, 1 (Kohn: exact for a harmonic trap), 1.464 ×2, 1.900 ×2, 2.000
    (breathing: exactly 2 in 2D), each to the 3 decimals quoted; u, v are (8, 40, 40) real, ∫(u² − v²) dV = 1."""
    modes, grid = ns["modes"], ns["grid"]
    omega = np.asarray(modes.omega, np.float64)
    assert np.all(np.diff(omega) >= -1e-12)  # ascending (degenerate pairs to rounding)
    np.testing.assert_allclose(omega[:7], [1.0, 1.0, 1.464, 1.464, 1.900, 1.900, 2.000], atol=6e-4)
    u, v = np.asarray(modes.u), np.asarray(modes.v)
    assert u.shape == v.shape == (8, 40, 40) and np.isrealobj(u) and np.isrealobj(v)
    np.testing.assert_allclose(((u**2 - v**2).sum((1, 2))) * grid.cell_volume, 1.0, rtol=1e-6)


def _check_mera_dense(ns: dict, out: str) -> None:
    """Energy above the exact −4/π (the MERA is variational) and below a stalled start's 2e-3; Δσ = 1/8."""
    from ivhl_jax import mera

    err = float(np.asarray(ns["energies"])[-1]) - mera.E0_CRITICAL_ISING
    assert 0 < err < 1e-4, err
    printed = [float(w) for w in re.findall(r"[-+]?\d+\.\d+(?:e[-+]?\d+)?", out)]
    assert abs(printed[0] - err) <= 1e-6 * max(1.0, abs(err)) + 1e-12, (printed, err)


def _check_mera_symmetric(ns: dict, out: str) -> None:
    """Z2 MERA at χ = 6: energy above −4/π and below the 2e-3 of a stalled start; the Ising CFT's charges of the
    lowest scaling dimensions, 1 (Δ = 0, charge 0), σ (1/8, charge 1), ε (1, charge 0); after the ladder step
    (χ 6 → 8, sectors from the spectra) exact isometries and an energy between −4/π and the χ = 6 stage's."""
    from ivhl_jax import mera

    err6 = float(np.asarray(ns["energies"])[-1]) - mera.E0_CRITICAL_ISING
    assert 0 < err6 < 1e-3, err6
    dims, charges = np.asarray(ns["dims"]), np.asarray(ns["charges"])
    assert abs(dims[0]) < 1e-8 and charges[0] == 0
    assert abs(dims[charges == 1].min() - 0.125) < 0.01, (dims, charges)
    assert abs(np.sort(dims[charges == 0])[1] - 1.0) < 0.1, (dims, charges)
    err8 = float(np.asarray(ns["energies8"])[-1]) - mera.E0_CRITICAL_ISING
    assert ns["big"].chis == (8, 8)
    assert all(sum(d for _, d in sec) == 8 for sec in ns["cfg8"].symmetry.sectors)
    with jax.enable_x64(True):
        assert max(mera.isometry_errors(mera.to_dense(ns["state8"].mera)).values()) < 1e-12
    assert 0 < err8 < err6, (err6, err8)


def _check_happy(ns: dict, out: str) -> None:
    """V†V = 1 (the 2048 × 2048 identity) and S(8 legs) = 8 bits = the minimal cut."""
    from ivhl_jax.physics.tensornet import happy

    np.testing.assert_allclose(np.asarray(ns["gram"]), np.eye(2048), atol=1e-12)
    with jax.enable_x64(True):  # the block's precision (it switched float64 on; the runner switched it back)
        assert abs(float(happy.region_entropy(ns["net"], ns["region"], base=2)) - 8.0) < 1e-9
    assert happy.min_cut(ns["net"], ns["region"]) == 8


def _check_first_cdt_run(ns: dict, out: str) -> None:
    """It prints N2 after every 10 sweeps: 10 triangle counts, each even (N2 = 2 N0 on a torus) and positive."""
    printed = [int(v) for v in re.findall(r"-?\d+", out)]
    assert out.strip().startswith("[") and len(printed) == 10, out
    assert all(n > 0 and n % 2 == 0 for n in printed), printed


# (page, a string of the unit's first block) -> check(namespace, printed output)
CHECKS = {
    **{
        (page, "ivhl.trajectory(st, chain"): _check_first_cdt_run
        for page in ("README.md", "docs/index.md", "docs/design.md")
    },
    ("docs/guide/adaptive.md", "adaptive.dynamics(weights, x, cfg)"): _check_adaptive,
    ("docs/guide/checkpoints.md", "ckpt_dir = tempfile.mkdtemp()"): _check_checkpoints,
    ("docs/guide/precision.md", 'precision.get_policy("fp16")'): _check_precision,
    ("docs/guide/parallel.md", "parallel.jit_train_step("): _check_parallel_training,
    ("docs/guide/parallel.md", "distributed_fft.parse_mesh("): _check_parallel_fft,
    ("docs/guide/condensates.md", "C.bogoliubov(jax.random.key(0), sys, psi, 8)"): _check_bogoliubov,
    ("docs/guide/tensor-networks.md", "mera.MERAConfig(chi=6, chi_mid=4, layers=1))"): _check_mera_dense,
    ("docs/guide/tensor-networks.md", 'mera.Symmetry("Z2"'): _check_mera_symmetric,
    ("docs/guide/tensor-networks.md", "happy.perfect_tensor()"): _check_happy,
}

# Units that take more than a few seconds on a 2-core CPU: they run in the slow step.
SLOW = {
    ("docs/guide/condensates.md", "omega_rot=0.8"),
    ("docs/guide/condensates.md", "C.bogoliubov(jax.random.key(0), sys, psi, 8)"),
    ("docs/guide/tensor-networks.md", 'mera.Symmetry("Z2"'),
    ("docs/guide/parallel.md", "distributed_fft.parse_mesh("),
    ("docs/guide/cdt.md", "lams = jnp.array([0.8, 0.9, 1.0])"),
    # run as printed in the default suite by tests/contracts/test_defaults_{cdt,fields_gp}.py (_run_block,
    # _python_blocks: the page's text, with their checks), so here only in the slow step
    ("docs/guide/cdt.md", "target=512"),
    ("docs/guide/cdt.md", 'engine="jax")'),
    ("docs/guide/fields.md", "F.helix_sources(64"),
}


def _key_of(unit: list[Block], keys) -> tuple[str, str] | None:
    hits = [k for k in keys if k[0] == unit[0].page and k[1] in unit[0].text]
    assert len(hits) <= 1, hits
    return hits[0] if hits else None


def _params():
    return [
        pytest.param(u, id=u[0].id, marks=[pytest.mark.slow] if _key_of(u, SLOW) else [])  # type: ignore[list-item]
        for u in ALL_UNITS
    ]


def test_marks_are_explained_and_every_registration_names_one_block():
    """A fragment says why in its mark; a mark stands only before a python block; every key of CHECKS and SLOW
    names exactly one runnable unit."""
    for page in PAGES:
        for b in blocks(page):
            if b.mark == "fragment":
                assert b.lang == "python" and len(b.reason.split()) >= 4, f"{b.id}: say why it is a fragment"
            elif b.mark is not None:
                assert b.lang == "python", f"{b.id}: <!-- {b.mark} --> marks python blocks only"
        text = (ROOT / page).read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(text):
            if MARK.match(line):
                nxt = next((ln for ln in text[i + 1 :] if ln.strip()), "")
                assert re.match(r"^\s*```python\s*$", nxt), f"{page}:{i + 1}: a mark not followed by a python block"
    for page, marker in {*CHECKS, *SLOW}:
        find_unit(page, marker)
    assert ALL_UNITS and all(u[0].mark is None for u in ALL_UNITS)


@pytest.mark.parametrize("unit", _params())
def test_python_example_runs_as_printed(unit, tmp_path, capsys):
    """The block (with the blocks that continue it) runs as printed in a fresh namespace and folder; where the page
    states an answer, it checks out."""
    ns = run_unit(unit, tmp_path)
    out = capsys.readouterr().out
    key = _key_of(unit, CHECKS)
    if key is not None:
        CHECKS[key](ns, out)


# ------------------------------------------------------------------------- the builders with their defaults


def _adaptive_inputs(batch: int = 2, T: int = 5, **cfg_overrides) -> dict:
    """The names the adaptive guide's block leaves to the reader (``AdaptiveConfig(**cfg_overrides)``)."""
    cfg = adaptive.AdaptiveConfig(**cfg_overrides)
    k = jax.random.split(jax.random.key(7), 5)
    return {
        "weights": adaptive.init_params(k[0], cfg),
        "x": jax.random.normal(k[1], (batch, cfg.input_dim)),
        "cfg": cfg,
        "key": k[2],
        "gru_weights": gru.init_params(k[3], 3, 16),
        "xs": jax.random.normal(k[4], (T, batch, 3)),
        "h0": jnp.zeros((batch, 16)),
    }


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def test_adaptive_dynamics_defaults_first_step_matches_the_equations():
    """``adaptive.dynamics(weights, x, AdaptiveConfig())`` for 4 steps: finite, shaped, phases in 0..3, E in [0, 50],
    a in [0, 1], bit-identical for the same key; and the first step equals the module docstring's equations in
    float64 NumPy given the phases it drew (start h = 0, E = 10, a = 0: A = 0, D = 2 b_s, h' = tanh(m (2 b_s + g u)),
    E' = 0.99·10 + m (w_e·h' + b_e), a' = σ(α₁ mean h' + α₂ mean u + β), logits = a' W_out + b_out)."""
    ns = _adaptive_inputs(batch=3)
    cfg, w, x = ns["cfg"], ns["weights"], ns["x"]
    st = adaptive.dynamics(w, x, cfg)
    run = jax.jit(lambda k: trajectory(st, st.init(k), 4, observe=adaptive.observe))
    final, obs = run(ns["key"])
    _, again = run(ns["key"])
    for name in obs:
        np.testing.assert_array_equal(np.asarray(obs[name]), np.asarray(again[name]), err_msg=name)
    b, n, c = 3, cfg.num_nodes, cfg.output_dim
    assert obs["logits"].shape == (4, b, c) and obs["phase"].shape == (4, b, n) and final.nodes.h.shape == (b, n, 64)
    for name in ("logits", "anxiety", "energy", "activity", "phase_fractions"):
        assert np.all(np.isfinite(np.asarray(obs[name]))), name
    ph = np.asarray(obs["phase"])
    assert ph.min() >= 0 and ph.max() <= 3
    e, a = np.asarray(obs["energy"]), np.asarray(obs["activity"])
    assert e.min() >= 0 and e.max() <= 50 and a.min() >= 0 and a.max() <= 1
    np.testing.assert_allclose(np.asarray(obs["phase_fractions"]).sum(-1), 1.0, rtol=1e-6)

    p = {k: np.asarray(v, np.float64) for k, v in w.items()}
    x64 = np.asarray(x, np.float64)
    u = x64 @ p["W_in"] + p["b_in"]  # [B, H]
    awake = (ph[0] != adaptive.SLEEP).astype(np.float64)  # [B, N]
    h1 = np.tanh(awake[..., None] * (2.0 * p["b_s"] + cfg.input_gain * u[:, None, :]))
    e1 = np.clip(0.99 * 10.0 + awake * (h1 @ p["w_e"] + p["b_e"]), 0.0, 50.0)
    a1 = np.clip(_sigmoid(p["alpha"][0] * h1.mean(-1) + p["alpha"][1] * u.mean(-1)[:, None] + p["beta"]), 0, 1)
    np.testing.assert_allclose(np.asarray(obs["anxiety"][0]), 0.0, atol=0)
    np.testing.assert_allclose(np.asarray(obs["energy"][0]), e1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(obs["activity"][0]), a1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(obs["logits"][0]), a1 @ p["W_out"] + p["b_out"], rtol=1e-4, atol=1e-5)


def _gru_numpy(w: dict, h: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """The module docstring's "torch" GRU in float64 NumPy: hs [T, ..., H]."""
    p = {k: np.asarray(v, np.float64) for k, v in w.items()}
    out = []
    for x in np.asarray(xs, np.float64):
        i_r, i_z, i_n = np.split(x @ p["W_i"] + p["b_i"], 3, axis=-1)
        h_r, h_z, h_n = np.split(h @ p["W_h"] + p["b_h"], 3, axis=-1)
        r, z = _sigmoid(i_r + h_r), _sigmoid(i_z + h_z)
        h = (1 - z) * np.tanh(i_n + r * h_n) + z * h
        out.append(h)
    return np.stack(out)


def test_gru_recurrence_defaults_matches_the_equations_and_flax():
    """``gru.recurrence(weights, xs)`` (default variant "torch") from h0 = 0 for T = 6: finite, [T, B, H], |h| < 1
    (a convex blend of tanh and the previous h), bit-identical when rerun, equal to the docstring's equations in
    float64 NumPy, and with b_h = 0 equal to ``flax.nnx.GRUCell`` (the stated identity)."""
    from flax import nnx

    T, B, D, H = 6, 4, 3, 8
    k = jax.random.split(jax.random.key(3), 2)
    w = gru.init_params(k[0], D, H)
    xs = jax.random.normal(k[1], (T, B, D))
    h0 = jnp.zeros((B, H))
    rnn = gru.recurrence(w, xs)
    final, hs = trajectory(rnn, rnn.init(h0), T, observe=gru.observe)
    _, hs2 = trajectory(rnn, rnn.init(h0), T, observe=gru.observe)
    hs = np.asarray(hs)
    assert hs.shape == (T, B, H) and np.all(np.isfinite(hs)) and np.abs(hs).max() < 1
    np.testing.assert_array_equal(hs, np.asarray(hs2))
    np.testing.assert_array_equal(np.asarray(final.h), hs[-1])
    np.testing.assert_allclose(hs, _gru_numpy(w, np.zeros((B, H)), xs), rtol=1e-5, atol=1e-6)

    cell = nnx.GRUCell(D, H, rngs=nnx.Rngs(0))
    wc = gru.params_from_nnx(cell)
    rnn = gru.recurrence(wc, xs)
    _, hs_ours = trajectory(rnn, rnn.init(h0), T, observe=gru.observe)
    h, ref = h0, []
    for t in range(T):
        h, _ = cell(h, xs[t])
        ref.append(np.asarray(h))
    np.testing.assert_allclose(np.asarray(hs_ours), np.stack(ref), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------ the commands


@dataclasses.dataclass(frozen=True)
class Command:
    page: str
    line: int
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {shlex.join(self.words)}"


def commands(page: str) -> list[Command]:
    """The commands of the ```bash blocks of ``page`` (continuation lines joined, comments dropped)."""
    out = []
    for b in blocks(page, "bash"):
        lines = b.text.replace("\\\n", " ").splitlines()
        for offset, line in enumerate(lines):
            words = shlex.split(line, comments=True)
            if words:
                out.append(Command(page, b.line + 1 + offset, tuple(words)))
    return out


def config_files(page: str) -> dict[str, str]:
    """``{name: text}`` of the ```toml blocks of ``page`` whose first line is ``# NAME.toml``."""
    files = {}
    for b in blocks(page, "toml"):
        m = re.match(r"#\s*(\S+\.toml)\s*$", b.text.splitlines()[0])
        if m:
            files[m[1]] = b.text
    return files


def input_files(c: Command) -> list[str]:
    """The files a command reads: its ``--config FILE`` and the ``--set key=FILE`` values that name a data file."""
    w = c.words
    named = [v for a, v in zip(w, w[1:]) if a == "--config"]
    named += [v.split("=", 1)[1] for a, v in zip(w, w[1:]) if a == "--set" and re.search(r"=\S+\.(npy|npz)$", v)]
    return named


def prepare_inputs(page: str, folder: Path) -> None:
    """Write into ``folder`` what the page's commands read, as the page shows it: the ```toml blocks named
    ``# NAME.toml``, and for any other file, the page's python block that names it (run as printed there)."""
    for name, text in config_files(page).items():
        (folder / name).write_text(text, encoding="utf-8")
    for c in commands(page):
        for name in input_files(c):
            if (folder / name).exists():
                continue
            makers = [u for u in units(page) if f'"{name}"' in u[0].text or f"'{name}'" in u[0].text]
            assert makers, f"{c}: reads {name}, and the page shows no ```python block that writes it"
            run_unit(makers[0], folder)
            assert (folder / name).exists(), f"{makers[0][0].id} names {name} but does not write it"


ALL_COMMANDS = [c for page in PAGES for c in commands(page)]
# Commands that are not `ivhl`: what each is, and where it is exercised.
OTHER_COMMANDS = {
    "make": "the repository's Makefile targets (make demo, make test): CI runs them",
    "python": "bench and study scripts with their own argparse (tests/bench, bench/studies/tests)",
}


@dataclasses.dataclass
class Parsed:
    command: Command
    sim: Any  # the Simulation (None for other ivhl commands)
    args: argparse.Namespace | None
    cfg: Any
    out: str | None


def parse_command(c: Command, folder: Path) -> Parsed:
    """Parse ``c`` as its command would and build its validated configuration (``--config`` files relative to
    ``folder``); raises what the command would report."""
    from ivhl_jax import cli
    from ivhl_jax.run.config import OneLineArgumentParser, add_run_arguments, clip_short_run, load_config

    w = list(c.words)
    assert w[0] == "ivhl", c
    if w[1] in ("sim", "train", "demo"):
        kind, name, argv = ("sim", "holography", ["--demo", *w[2:]]) if w[1] == "demo" else (w[1], w[2], w[3:])
        module = importlib.import_module(f"ivhl_jax.sims.{'train_' if kind == 'train' else ''}{name}")
        sim = module.SIMULATION
        if kind == "train" and name == "lm" and "--generate" in argv:
            args = module.generate_parser().parse_args(argv)
            return Parsed(c, sim, args, None, args.out)
        p = OneLineArgumentParser(prog=sim.prog)
        add_run_arguments(p, out=None, resume=None)
        sim.add_arguments(p)
        args = p.parse_args(argv)
        config = str(folder / args.config) if args.config else None
        cfg = load_config(sim.config_type, config, list(args.set) + sim.overrides(args), validate=False)
        cfg, _ = clip_short_run(cfg)
        if hasattr(cfg, "validate"):
            cfg.validate()
        return Parsed(c, sim, args, cfg, args.out or sim.default_out(cfg, args))
    if w[1] == "bench":
        from ivhl_jax.bench import harness

        a = cli.bench_parser().parse_args(w[2:])
        unknown = [op for op in a.op or [] if op not in harness.registry()]
        assert not unknown, f"{c}: unknown ops {unknown}"
        return Parsed(c, None, a, None, None)
    assert w[1] in ("tune", "info", "launch"), f"{c}: an ivhl command this test does not know"
    return Parsed(c, None, None, None, None)


# Pages whose commands do not yet run as printed, with the reason (strict: a fix makes the test fail until the
# entry is removed).
COMMANDS_PENDING: dict[str, str] = {}


def _pages_with_commands(only_runnable: bool = False):
    return [
        pytest.param(
            p,
            id=p,
            marks=[pytest.mark.xfail(strict=True, reason=COMMANDS_PENDING[p])] if p in COMMANDS_PENDING else [],
        )
        for p in PAGES
        if commands(p) and (not only_runnable or any(_tiny(c) for c in commands(p)))
    ]


@pytest.mark.parametrize("page", _pages_with_commands())
def test_guide_commands_parse_and_do_not_collide(page, tmp_path, monkeypatch):
    """Every `ivhl` command of the page parses and its configuration validates; every other command is a known
    kind; two commands writing one folder are one run (the later extends it) or the later starts over. The
    commands run in the folder the page's inputs are written to, as a reader's shell would."""
    from ivhl_jax.run.config import config_dict, differing_keys

    prepare_inputs(page, tmp_path)
    monkeypatch.chdir(tmp_path)
    by_out: dict[str, Parsed] = {}
    for c in commands(page):
        if c.words[0] != "ivhl":
            assert c.words[0] in OTHER_COMMANDS, f"{c}: a command this test does not know"
            continue
        parsed = parse_command(c, tmp_path)
        if parsed.out is None or parsed.cfg is None:
            continue
        out = os.path.normpath(parsed.out)
        earlier = by_out.get(out)
        resume = parsed.args.resume if parsed.args.resume is not None else parsed.sim.default_resume(parsed.args)
        if earlier is not None and resume and earlier.cfg is not None:
            diff = differing_keys(config_dict(earlier.cfg), config_dict(parsed.cfg), extendable=parsed.sim.extendable)
            assert not diff, (
                f"{c} writes {out}, which {earlier.command} wrote with another configuration (differs in {diff}): "
                "give it its own --out"
            )
        by_out[out] = parsed


# The settings that cut a command's run short (appended after the page's own --set): the step counts only, and
# for cdt the geometry measurement's extent (no further blocks of sweeps, radius 8, one curvature distance: the
# full measurement of the guide's 16 chains at N2 = 4096 takes longer than the command's time limit on 2 cores).
TINY = {
    "ivhl sim holography": ["steps=2"],
    "ivhl sim bec": ["steps=4", "ground_steps=20"],
    "ivhl sim gft": ["steps=4"],
    "ivhl sim cdt": ["steps=4", "thermalise_max=20", "geometry_times=0", "r_max=8", "curvature_deltas=1"],
    "ivhl sim mera": [],  # per command: as many stages as the command's --set steps names, 4 sweeps each
    "ivhl train adaptive": ["steps=4"],
    "ivhl train vortex_gru": ["steps=4"],
    "ivhl train lm": ["steps=4", "warmup_steps=0"],
}


def _tiny(c: Command) -> list[str] | None:
    w = list(c.words)
    if w[:2] == ["ivhl", "demo"]:
        return w
    key = " ".join(w[:3])
    if key not in TINY:
        return None
    extra = TINY[key]
    if key == "ivhl sim mera":
        given = [v for a, v in zip(w, w[1:]) if a == "--set" and v.startswith("steps=")]
        n = len([s for s in given[-1].split("=", 1)[1].split(",") if s]) if given else 2
        extra = ["steps=" + ",".join(["4"] * n) + ("," if n == 1 else "")]
    if key == "ivhl sim cdt" and "dims=3" in w:  # the geometry keys are 1+1D ones: a 2+1D run refuses them
        extra = [s for s in extra if s.split("=", 1)[0] in ("steps", "thermalise_max")]
    if "--generate" in w:
        return w + ["--length", "8"]
    return w + [a for s in extra for a in ("--set", s)] + ["--no-progress"]


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with_commands(only_runnable=True))
def test_guide_commands_run_as_printed(page, tmp_path):
    """Each `ivhl sim`/`ivhl train` command of the page runs, in order, in one fresh folder, as printed but for
    its step counts (``TINY``), and exits 0."""
    prepare_inputs(page, tmp_path)
    env = {**os.environ, "MPLBACKEND": "Agg", "IVHL_COMPILATION_CACHE": "0"}
    for c in commands(page):
        argv = _tiny(c)
        if argv is None:
            continue
        r = subprocess.run(
            [sys.executable, "-m", "ivhl_jax.cli", *argv[1:]],  # the `ivhl` script's entry point
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, f"{c} (run as {shlex.join(argv)}) exited {r.returncode}:\n{r.stderr[-3000:]}"
