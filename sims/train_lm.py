"""Byte-level transformer language model trained on the Python standard library's own source.

``ivhl train lm`` needs no download: the corpus is the ``.py`` files under
``sysconfig.get_paths()["stdlib"]`` (site-/dist-packages excluded), read in sorted path order and
concatenated (separated by a newline) up to ``max_bytes``. The last ``val_fraction`` of the bytes
is the validation set (later files, never seen in training). Vocabulary: the 256 byte values.

Training examples are non-overlapping windows of ``seq_len + 1`` bytes; the batch at step ``s`` is
``ivhl_jax.train.data.Batcher(...).batch(windows, s)``, a pure function of (seed, s), so the data cursor
is the step stored in the train state and resuming from an Orbax checkpoint is bit-exact. The train
step is ``ivhl_jax.train.training.make_train_step`` (AdamW, warm-up + cosine, global-norm clipping,
gradient accumulation, precision policy with dynamic loss scaling for fp16); ``steps_per_chunk``
steps run inside one jitted ``lax.scan`` (``ivhl_jax.run.runner.run_chunked``), followed by a
validation evaluation on ``eval_batches`` fixed batches.

The yardstick is the unigram (order-0) entropy ``H = −Σ p_b log2 p_b`` of the training bytes: a
model that ignores context cannot do better than H bits/byte; the transformer must get well below.

Outputs in ``--out`` (default ``runs/lm``): ``summary.json``, ``loss_curve.png``, ``config.json``,
``ckpt/`` and, with ``--generate``, ``sample.txt``.

  ivhl train lm                                   # the default run
  ivhl train lm --set steps=1                     # a smoke run: the chunk and the warm-up are clipped to it
  ivhl train lm --set steps=2000 --set model.d_model=256 --out runs/lm_big
  ivhl train lm --generate --prompt "def " --length 300 --temperature 0.8
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.models.transformer import (
    TransformerConfig,
    count_params,
    flops_per_token,
    generate,
    init_params,
    lm_loss_fn,
)
from ivhl_jax.run.config import OneLineArgumentParser, add_run_arguments, config_dict, load_config, option
from ivhl_jax.run.driver import RunContext
from ivhl_jax.run.io import save_figure, write_json
from ivhl_jax.run.runner import phase, restore_chunked
from ivhl_jax.run.store import leaf_names
from ivhl_jax.sims import entry_point
from ivhl_jax.sims._common import TrainingRun, TrainingSimulation, check_training_steps, shared_key, train_in_chunks
from ivhl_jax.train import training
from ivhl_jax.train.checkpoint import Checkpointer
from ivhl_jax.train.data import Batcher

LN2 = math.log(2.0)


def _default_model() -> TransformerConfig:
    return TransformerConfig(
        vocab_size=256, d_model=128, n_layers=3, n_heads=4, d_ff=384, max_len=128, activation="swiglu", norm="rmsnorm"
    )


@dataclasses.dataclass(frozen=True)
class TrainLMConfig:
    """Run configuration; the model is a nested :class:`TransformerConfig` (``--set model.d_model=256``)."""

    model: TransformerConfig = option(default_factory=_default_model, help="--set model.X=...")
    # data
    seq_len: int = option(128, "bytes per training window")
    max_bytes: int = option(3_000_000, "bytes of the standard library's .py files used as text")
    val_fraction: float = option(0.1, "held-out fraction of the text")
    # optimisation
    batch_size: int = option(16, "windows per batch")
    steps: int = shared_key("steps", 600)
    steps_per_chunk: int = shared_key("steps_per_chunk", 50)
    learning_rate: float = option(3e-3, "peak AdamW learning rate")
    warmup_steps: int = shared_key("warmup_steps", 50)
    min_lr_ratio: float = option(0.1, "final learning rate / peak (cosine decay)")
    weight_decay: float = option(0.01, "AdamW weight decay")
    clip_norm: float = shared_key("clip_norm", 1.0)
    accumulate: int = option(1, "micro-batches accumulated per step")
    eval_batches: int = option(8, "validation batches per evaluation")
    seed: int = option(0, "seed of the initialisation and the batches")
    keep_checkpoints: int = shared_key("keep_checkpoints", 2)

    def validate(self) -> TrainLMConfig:
        self.model.validate()
        if self.model.vocab_size != 256:
            raise ValueError(f"model.vocab_size must be 256 (the model reads bytes), got {self.model.vocab_size}")
        for name in ("seq_len", "max_bytes", "batch_size", "eval_batches", "accumulate"):
            check_scalar(getattr(self, name), name, integer=True, minimum=1)
        check_training_steps(self)
        if self.model.max_len < self.seq_len:
            raise ValueError(
                f"model.max_len ({self.model.max_len}) must be >= seq_len ({self.seq_len}); "
                f"set model.max_len={self.seq_len}"
            )
        check_scalar(self.val_fraction, "val_fraction", minimum=0.001, maximum=0.5)
        if self.steps % self.accumulate:
            raise ValueError(f"steps ({self.steps}) must be a multiple of accumulate ({self.accumulate})")
        return self


# --------------------------------------------------------------------------- data


def stdlib_python_files() -> list[str]:
    """Sorted paths (relative to the stdlib directory) of its ``.py`` files, third-party dirs excluded."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for f in filenames:
            if f.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def load_corpus(max_bytes: int) -> tuple[np.ndarray, dict]:
    """The first ``max_bytes`` bytes of the concatenated stdlib sources, as uint8, plus provenance."""
    check_scalar(max_bytes, "max_bytes", integer=True, minimum=1024)
    root = sysconfig.get_paths()["stdlib"]
    chunks, total, used = [], 0, 0
    for rel in stdlib_python_files():
        with open(os.path.join(root, rel), "rb") as fh:
            data = fh.read() + b"\n"
        chunks.append(data)
        total += len(data)
        used += 1
        if total >= max_bytes:
            break
    blob = b"".join(chunks)[:max_bytes]
    if len(blob) < max_bytes:
        raise ValueError(f"the stdlib at {root} has only {len(blob)} bytes of .py source; lower max_bytes")
    info = {
        "root": root,
        "files": used,
        "bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "python": sys.version.split()[0],
    }
    return np.frombuffer(blob, dtype=np.uint8), info


def unigram_entropy_bits(data: np.ndarray) -> float:
    """Order-0 entropy ``−Σ p_b log2 p_b`` of a byte array (bits/byte)."""
    counts = np.bincount(np.asarray(data, np.uint8), minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


def make_windows(data: np.ndarray, seq_len: int) -> np.ndarray:
    """Non-overlapping windows ``[n, seq_len + 1]`` (each shares its last byte with the next's first)."""
    n = (len(data) - 1) // seq_len
    if n < 1:
        raise ValueError(f"{len(data)} bytes are too few for seq_len={seq_len}")
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    return data[idx]


def prepare_data(cfg: TrainLMConfig) -> dict:
    data, info = load_corpus(cfg.max_bytes)
    n_val = int(round(len(data) * cfg.val_fraction))
    train, val = data[:-n_val], data[-n_val:]
    tw, vw = make_windows(train, cfg.seq_len), make_windows(val, cfg.seq_len)
    n_eval = cfg.eval_batches * cfg.batch_size
    if len(vw) < n_eval:
        raise ValueError(
            f"validation set has {len(vw)} windows < eval_batches*batch_size = {n_eval}; "
            "raise max_bytes or val_fraction, or lower eval_batches"
        )
    if len(tw) < cfg.batch_size:
        raise ValueError(f"training set has {len(tw)} windows < batch_size {cfg.batch_size}")
    return {
        "train": tw,
        "val": vw[:n_eval].reshape(cfg.eval_batches, cfg.batch_size, cfg.seq_len + 1),
        "info": info,
        "unigram_entropy_bits": unigram_entropy_bits(train),
        "val_unigram_cross_entropy_bits": _unigram_cross_entropy(train, val),
    }


def _unigram_cross_entropy(train, val) -> float:
    """Bits/byte of the validation set under the (add-one smoothed) training byte frequencies."""
    counts = np.bincount(train, minlength=256).astype(np.float64) + 1.0
    logp = np.log2(counts / counts.sum())
    return float(-logp[val].mean())


# --------------------------------------------------------------------------- training


def build(cfg: TrainLMConfig, data: dict):
    """(initial TrainState, advance(state) -> (state, obs), optimizer)."""
    mcfg = cfg.model
    opt = training.make_optimizer(
        name="adamw",
        learning_rate=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps // cfg.accumulate,
        total_steps=cfg.steps // cfg.accumulate,
        min_lr_ratio=cfg.min_lr_ratio,
        weight_decay=cfg.weight_decay,
        clip_norm=cfg.clip_norm,
        accumulate=cfg.accumulate,
    )
    key = jax.random.key(cfg.seed)
    params = init_params(mcfg, jax.random.fold_in(key, 1), cfg.seq_len)
    state = training.init_train_state(params, opt, key=jax.random.fold_in(key, 2), policy=mcfg.precision)
    loss_fn = lm_loss_fn(mcfg)
    train_step = training.make_train_step(loss_fn, opt, mcfg.precision)
    eval_step = training.make_eval_step(loss_fn, mcfg.precision)
    batcher = Batcher(len(data["train"]), cfg.batch_size, seed=cfg.seed)

    @jax.jit
    def chunk(state, train_windows, val_batches):
        def body(st, _):
            st, m = train_step(st, batcher.batch(train_windows, st.step))
            return st, {"loss": m["loss"], "grad_norm": m["grad_norm"], "skipped": m["skipped"]}

        state, obs = jax.lax.scan(body, state, None, length=cfg.steps_per_chunk)
        val = jax.lax.map(lambda b: eval_step(state, b)["loss"], val_batches)
        obs["val_loss"] = jnp.mean(val)[None]
        obs["val_step"] = state.step[None]
        return state, obs

    train_windows = jnp.asarray(data["train"])
    val_batches = jnp.asarray(data["val"])
    return state, (lambda st: chunk(st, train_windows, val_batches)), opt


def train(cfg: TrainLMConfig, run: TrainingRun) -> dict:
    """Train (or resume), write summary/plot/checkpoints to ``run.out``, return the summary dict (``run``'s
    ``stop_after_chunks`` ends this invocation early; the same config resumes and finishes bit-identically)."""
    out, progress = run.out, run.progress
    cfg.validate()
    with phase("loading data", detail=f"up to {cfg.max_bytes} bytes of the Python stdlib", enabled=progress):
        data = prepare_data(cfg)
    with phase("building the model", enabled=progress):
        state, advance, _ = build(cfg, data)
    # The cosine schedule depends on steps, so no key is extendable: another configuration is refused.
    metadata = {"config": config_dict(cfg)}
    like = jax.eval_shape(advance, state)[1]  # the records of one chunk (losses and rates: unit "1")
    units = dict.fromkeys(leaf_names(like), "1")
    res = train_in_chunks(cfg, run, advance, state, "train lm", metadata=metadata, units=units)
    hist = jax.tree_util.tree_map(np.asarray, res.history)
    mcfg = cfg.model
    n_params = count_params(res.state.params)
    tokens = cfg.batch_size * cfg.seq_len
    train_bits = hist["loss"] / LN2
    val_bits = hist["val_loss"] / LN2
    tail = max(1, min(cfg.steps_per_chunk, len(train_bits)))
    summary = {
        "config": config_dict(cfg),
        "corpus": data["info"],
        "n_params": n_params,
        "steps": int(res.state.step),
        "resumed_from": res.resumed_from,
        "wall_time_s_this_invocation": res.wall_time_s,
        "tokens_per_step": tokens,
        "model_flops_per_token": flops_per_token(mcfg, cfg.seq_len),
        "unigram_entropy_bits_per_byte": data["unigram_entropy_bits"],
        "val_unigram_cross_entropy_bits_per_byte": data["val_unigram_cross_entropy_bits"],
        "final_train_bits_per_byte_last_chunk_mean": float(train_bits[-tail:].mean()),
        "final_val_bits_per_byte": float(val_bits[-1]),
        "val_bits_per_byte_curve": {"step": hist["val_step"].tolist(), "bits": val_bits.tolist()},
        "skipped_steps": int(hist["skipped"].sum()),
    }
    summary["val_over_unigram"] = summary["final_val_bits_per_byte"] / summary["unigram_entropy_bits_per_byte"]
    if res.steps_run:
        summary["tokens_per_s_this_invocation"] = res.steps_run * tokens / res.wall_time_s
    write_json(os.path.join(out, "summary.json"), summary)
    if run.plots:
        _plot(hist, data, os.path.join(out, "loss_curve.png"))
    return summary


def _plot(hist, data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = np.arange(1, len(hist["loss"]) + 1)
    ax.plot(steps, hist["loss"] / LN2, lw=0.8, label="train (per step)")
    ax.plot(hist["val_step"], hist["val_loss"] / LN2, "o-", label="validation")
    ax.axhline(data["unigram_entropy_bits"], color="k", ls="--", label="unigram entropy (train bytes)")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss (bits/byte)")
    ax.set_ylim(0, max(8.5, float(np.max(hist["loss"][: max(1, len(steps) // 20)] / LN2))))
    ax.legend()
    ax.set_title("byte-level LM on the Python stdlib")
    save_figure(fig, path)
    plt.close(fig)


# --------------------------------------------------------------------------- generation


def restore_params(cfg: TrainLMConfig, out: str):
    """Parameters of the latest checkpoint in ``out/ckpt`` (and its step), from a streamed run (the command line's,
    which checkpoints the train state alone) or one that checkpointed its history too
    (:func:`~ivhl_jax.run.runner.restore_chunked`)."""
    ckpt_dir = os.path.join(out, "ckpt")
    data = prepare_data(cfg)
    state, advance, _ = build(cfg, data)
    with Checkpointer(ckpt_dir, save_every=cfg.steps_per_chunk) as ckpt:
        _, obs = jax.eval_shape(advance, state)
        restored = restore_chunked(ckpt, state, obs, steps_per_chunk=cfg.steps_per_chunk)
    if restored is None:
        raise FileNotFoundError(f"no checkpoint in {ckpt_dir}; run `ivhl train lm --out {out}` first")
    return restored.state.params, restored.step


def sample_text(
    cfg: TrainLMConfig,
    params,
    prompt: str,
    length: int,
    *,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 0,
) -> str:
    """Sample ``length`` bytes after ``prompt`` (UTF-8), decoded with replacement of invalid bytes."""
    mcfg = cfg.model
    p = np.frombuffer(prompt.encode("utf-8"), np.uint8)
    if len(p) == 0:
        p = np.frombuffer(b"\n", np.uint8)
    out = list(p.tolist())
    key = jax.random.key(seed)
    # Generate in pieces of n_new bytes, each conditioned on the last ctx_len = max_len - n_new bytes,
    # so every call has the same shapes (one compilation).
    n_new = min(length, max(1, mcfg.max_len // 2))
    ctx_len = mcfg.max_len - n_new
    fn = jax.jit(lambda prm, ctx, k: generate(mcfg, prm, ctx, n_new, k, temperature=temperature, top_k=top_k))
    while len(out) - len(p) < length:
        ctx = np.asarray(out[-ctx_len:], np.int32)
        if len(ctx) < ctx_len:  # left-pad with newlines
            ctx = np.concatenate([np.full(ctx_len - len(ctx), 10, np.int32), ctx])
        key, sub = jax.random.split(key)
        buf = np.asarray(fn(params, jnp.asarray(ctx), sub))
        out.extend(buf[ctx_len:].tolist())
    return bytes(out[: len(p) + length]).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- CLI


def generate_parser() -> argparse.ArgumentParser:
    """The options of ``ivhl train lm --generate`` (a usage error is one line)."""
    p = OneLineArgumentParser(prog="ivhl train lm --generate", description="sample from a trained byte LM")
    add_run_arguments(p, out=os.path.join("runs", "lm"))
    p.add_argument("--generate", action="store_true")
    p.add_argument("--prompt", default="def ", help="generation prompt (UTF-8)")
    p.add_argument("--length", type=int, default=300, help="bytes to generate")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    return p


def generate_main(argv: Sequence[str]) -> int:
    """``ivhl train lm --generate``: sample text from the run in ``--out`` (its own config.json)."""
    p = generate_parser()
    a = p.parse_args(list(argv))
    cfg_path = a.config or os.path.join(a.out, "config.json")
    if not os.path.isfile(cfg_path):
        p.error(f"no config at {cfg_path}; train first or pass --config")
    cfg = load_config(TrainLMConfig, cfg_path, a.set)
    check_scalar(a.length, "--length", integer=True, minimum=1)
    params, step = restore_params(cfg, a.out)
    t0 = time.perf_counter()
    text = sample_text(cfg, params, a.prompt, a.length, temperature=a.temperature, top_k=a.top_k, seed=a.seed)
    dt = time.perf_counter() - t0
    path = os.path.join(a.out, "sample.txt")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"--- sample (checkpoint step {step}, T={a.temperature}, {a.length} bytes in {dt:.1f} s) ---")
    print(text)
    print(f"--- written to {path}")
    return 0


class TrainLMSimulation(TrainingSimulation):
    """``ivhl train lm`` (``--generate``: :func:`generate_main` samples from a trained run instead)."""

    prog = "ivhl train lm"
    config_type = TrainLMConfig
    out_folder = "lm"
    switches = {"--generate": "sample from the latest checkpoint in --out (see `ivhl train lm --generate --help`)"}
    commands: ClassVar[dict[str, Callable[[list[str]], int]]] = {"--generate": generate_main}

    def run(self, cfg: TrainLMConfig, ctx: RunContext) -> dict[str, str]:
        s = train(cfg, TrainingRun.of(ctx))
        print(
            json.dumps(
                {
                    k: s[k]
                    for k in (
                        "n_params",
                        "steps",
                        "unigram_entropy_bits_per_byte",
                        "final_train_bits_per_byte_last_chunk_mean",
                        "final_val_bits_per_byte",
                        "val_over_unigram",
                    )
                },
                indent=1,
            )
        )
        paths = {"summary": os.path.join(ctx.out, "summary.json")}
        if not ctx.args.no_plots:
            paths["loss_curve"] = os.path.join(ctx.out, "loss_curve.png")
        return paths


SIMULATION = TrainLMSimulation()
main = entry_point(SIMULATION, __name__)  # the command line as a function; python -m runs it
