"""A smoke run of every ``ivhl sim``/``ivhl train``: ``--set steps=1`` (shorter than one chunk and than the
warm-up) runs to the end with the chunk and the warm-up clipped, said once on the console."""

from __future__ import annotations

import os

import pytest

from ivhl_jax import cli

# Small problems, with the chunking and warm-up keys left at their defaults (so the clipping is what is tested).
SMALL: dict[str, list[str]] = {
    "sim holography": ["n_sources=4", "grid=[8, 8]", "steps=1"],
    "sim bec": ["grid=16", "ground_steps=100", "steps=1"],
    "sim gft": ["rank=2", "grid=8", "steps=1"],
    "sim cdt": [
        "slices=4",
        "volume=48",
        "chains=1",
        "thermalise_max=4",
        "engine=jax",
        "origins=1",
        "curvature_samples=1",
        "steps=1",
    ],
    "sim mera": ["chis=4,", "chi_mids=4,", "layers=1,", "stuck_after=0", "stuck_every=0", "steps=1,"],
    "train lm": [
        "model.d_model=16",
        "model.n_layers=1",
        "model.n_heads=2",
        "model.d_ff=32",
        "model.max_len=16",
        "seq_len=16",
        "max_bytes=20000",
        "batch_size=2",
        "eval_batches=1",
        "steps=1",
    ],
    "train adaptive": ["dataset=synthetic", "synthetic_samples=64", "batch_size=8", "warmup_steps=10", "steps=1"],
    "train vortex_gru": [
        "n_train=8",
        "n_test=4",
        "length=8",
        "grid=8",
        "hidden=4",
        "layers=1",
        "batch_size=4",
        "steps=1",
    ],
}
SLOW = set(SMALL) - {"sim holography"}  # each over ~20 s on a busy 2-core host


@pytest.mark.parametrize("command", [pytest.param(c, marks=[pytest.mark.slow] if c in SLOW else []) for c in SMALL])
def test_a_run_of_one_step_runs_with_the_chunk_clipped(command, tmp_path, capsys):
    out = str(tmp_path / "run")
    argv = [*command.split(), "--out", out, "--no-progress"]
    if command == "train lm":
        argv.append("--no-plots")
    for kv in SMALL[command]:
        argv += ["--set", kv]
    rc = cli.main(argv)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    said = [ln for ln in cap.err.splitlines() if "a run shorter than one chunk" in ln]
    assert len(said) == 1 and "steps_per_chunk" in said[0], cap.err
    if command in ("train lm", "train adaptive"):
        assert "warmup_steps" in said[0]
    assert os.path.isfile(os.path.join(out, "config.json"))
