"""`ivhl train lm`: deterministic stdlib byte corpus, unigram entropy, config errors; bit-exact resume
and generation (slow)."""

import os

import jax
import numpy as np
import pytest
from scipy.stats import entropy

from ivhl_jax.run.config import load_config
from ivhl_jax.sims import train_lm as T
from ivhl_jax.sims._common import TrainingRun
from ivhl_jax.train.checkpoint import Checkpointer


def test_corpus_is_deterministic_and_entropy_is_the_order0_one():
    a, info_a = T.load_corpus(200_000)
    b, info_b = T.load_corpus(200_000)
    assert info_a["sha256"] == info_b["sha256"] and len(a) == 200_000
    files = T.stdlib_python_files()
    assert files == sorted(files) and not any("site-packages" in f for f in files)
    h = T.unigram_entropy_bits(a)
    ref = entropy(np.bincount(a, minlength=256), base=2)
    assert abs(h - ref) < 1e-12 and 3.5 < h < 6.0
    w = T.make_windows(a, 64)
    assert w.shape == ((len(a) - 1) // 64, 65)
    np.testing.assert_array_equal(w[1, 0], w[0, 64])  # consecutive windows share one byte


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="unknown config key"):
        load_config(T.TrainLMConfig, None, ["model.d_modle=8"])
    with pytest.raises(ValueError, match="model.max_len"):
        load_config(T.TrainLMConfig, None, ["seq_len=256"])
    with pytest.raises(ValueError, match="vocab_size"):
        load_config(T.TrainLMConfig, None, ["model.vocab_size=100"])
    cfg = load_config(T.TrainLMConfig, None, ["model.d_model=64", "model.precision=bf16"])
    assert cfg.model.d_model == 64 and cfg.model.policy.compute_dtype == jax.numpy.bfloat16


TINY = [
    "model.d_model=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.max_len=32",
    "seq_len=32",
    "batch_size=4",
    "steps=4",
    "steps_per_chunk=2",
    "warmup_steps=1",
    "max_bytes=60000",
    "eval_batches=2",
    "model.attention=chunked",
    "model.attention_block=16",
]


def test_the_command_line_runs_generate_as_the_simulation_declares_it(tmp_path, capsys):
    """`ivhl train lm --generate` reaches generate_main through the simulation's commands (not the training
    driver): without a trained run in --out it is generation's one-line refusal, exit status 2."""
    from ivhl_jax import cli

    assert T.SIMULATION.commands["--generate"] is T.generate_main
    assert cli.main(["train", "lm", "--generate", "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ivhl train lm --generate: no config at") and len(err.splitlines()) == 1


@pytest.mark.slow
def test_interrupted_run_resumes_bit_exactly_and_generates(tmp_path):
    cfg = load_config(T.TrainLMConfig, None, TINY)
    full, part = os.fspath(tmp_path / "full"), os.fspath(tmp_path / "part")
    s_full = T.train(cfg, TrainingRun(full, progress=False, plots=False))
    s_part = T.train(cfg, TrainingRun(part, progress=False, plots=False, stop_after_chunks=1))
    assert s_part["steps"] == 2
    s_res = T.train(cfg, TrainingRun(part, progress=False))
    assert s_res["resumed_from"] == 2 and s_res["steps"] == 4
    assert s_res["val_bits_per_byte_curve"] == s_full["val_bits_per_byte_curve"]
    pa, _ = T.restore_params(cfg, full)
    pb, step = T.restore_params(cfg, part)
    assert step == 4
    jax.tree_util.tree_map(np.testing.assert_array_equal, pa, pb)
    assert os.path.isfile(os.path.join(part, "loss_curve.png"))
    text = T.sample_text(cfg, pa, "def ", 20, seed=1)
    assert text.startswith("def ") and len(text.encode("utf-8", errors="replace")) >= 20
    assert T.main(["--out", part, "--generate", "--length", "10"]) == 0


@pytest.mark.slow
def test_the_command_line_generates_from_a_run_that_streamed_its_records(tmp_path):
    """`ivhl train lm` streams its records to the run store and checkpoints the train state alone; `--generate`
    restores from that checkpoint (a template holding the history too would not fit it)."""
    from ivhl_jax import cli

    out = os.fspath(tmp_path / "lm")
    sets = [a for kv in TINY for a in ("--set", kv)]
    assert cli.main(["train", "lm", *sets, "--out", out, "--no-progress", "--no-plots"]) == 0
    with Checkpointer(os.path.join(out, "ckpt"), save_every=2) as ckpt:
        paths = ckpt.leaf_paths(4)
    assert paths and not any(p.startswith("['history']") for p in paths)
    assert cli.main(["train", "lm", "--generate", "--out", out, "--length", "8"]) == 0


# --- plots --------------------------------------------------------------------------------------------------------
def test_lm_loss_curve(tmp_path, is_png, loss_history):
    from ivhl_jax.sims import train_lm as tl

    hist = loss_history()
    hist.update(val_step=np.array([20, 40, 60]), val_loss=np.array([3.0, 2.5, 2.2]))
    path = tmp_path / "loss_curve.png"
    tl._plot(hist, {"unigram_entropy_bits": 4.9}, str(path))
    assert is_png(path)
