"""Train the adaptive-node classifier: ``ivhl train adaptive [--config F] [--set k=v] [--out DIR]``.

Datasets that need no download: ``digits`` (the 8x8 handwritten digits shipped with the package,
:func:`ivhl_jax.train.digits.load_digits`, the same data as scikit-learn's; 1797 samples, 64 features,
standardised with training-set statistics; deterministic split by ``ivhl_jax.train.data.train_test_split``)
and ``synthetic`` (a prototype set: 10 class prototypes ~ N(0, I_D); a sample is its
prototype plus 0.1 N(0, I) noise, 0.05 for the test set; 80/20 split; our own numpy seed).

The whole loop is jitted: one ``advance`` call runs ``steps_per_chunk`` optimiser steps under ``lax.scan``
(batch at step s = ``Batcher.batch(data, s)``, so the data cursor is the step stored in the train
state), then evaluates the test set. ``ivhl_jax.run.runner.run_chunked`` drives the chunks, shows
progress and writes Orbax checkpoints of the TrainState (params, Adam state, key, step, node state)
from which a run resumes bit-exactly.

Model presets (``preset``): ``reference`` (``AdaptiveConfig.reference``: the reference PyTorch model's batch-shared
scheduler, softmax-of-probabilities policy, activity readout, state carried across batches), ``improved`` (see
``AdaptiveConfig.improved``; explicit initial state per sample), ``plain`` (AdaptiveConfig defaults). Any
``model.*`` value that differs from the AdaptiveConfig default overrides the preset; ``input_dim``/``output_dim``
are set from the dataset.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_choice, check_scalar
from ivhl_jax.models.adaptive import AdaptiveModel, make_classification_loss, predict
from ivhl_jax.nn import adaptive
from ivhl_jax.nn.adaptive import AdaptiveConfig
from ivhl_jax.run.config import config_dict, option
from ivhl_jax.run.driver import RunContext
from ivhl_jax.run.io import save_figure, write_json
from ivhl_jax.run.runner import phase
from ivhl_jax.sims import entry_point
from ivhl_jax.sims._common import TrainingRun, TrainingSimulation, check_training_steps, shared_key, train_in_chunks
from ivhl_jax.train import training
from ivhl_jax.train.data import Batcher, train_test_split
from ivhl_jax.train.digits import load_digits


@dataclasses.dataclass(frozen=True)
class TrainAdaptiveConfig:
    dataset: str = option("digits", '"digits" (8x8 handwritten digits, shipped) or "synthetic" (prototypes + noise)')
    preset: str = option("improved", 'model preset: "reference", "improved" or "plain"')
    model: AdaptiveConfig = option(default_factory=AdaptiveConfig, help="the node model (--set model.X=...)")
    state_mode: str = option("auto", '"reset" | "carry" | "auto" (carry for the reference preset)')
    steps: int = shared_key("steps", 1500)
    steps_per_chunk: int = shared_key("steps_per_chunk", 250)
    batch_size: int = option(32, "examples per batch")
    learning_rate: float = option(1e-3, "Adam learning rate")
    warmup_steps: int = shared_key("warmup_steps", 0)
    cosine: bool = option(True, "cosine decay of the learning rate")
    clip_norm: float = shared_key("clip_norm", 1.0)
    seed: int = option(0, "seed of the initialisation and the dynamics")
    data_seed: int = option(0, "seed of the train/test split and batches")
    test_fraction: float = option(0.2, "held-out fraction")
    synthetic_samples: int = option(10000, "examples of the synthetic dataset")
    checkpoint_every: int = shared_key("checkpoint_every", 0)

    def validate(self) -> None:
        check_choice(self.dataset, "dataset", ("digits", "synthetic"))
        check_choice(self.preset, "preset", ("reference", "improved", "plain"))
        check_choice(self.state_mode, "state_mode", ("reset", "carry", "auto"))
        check_training_steps(self)
        check_scalar(self.batch_size, "batch_size", integer=True, minimum=1)
        check_scalar(self.learning_rate, "learning_rate", positive=True)
        check_scalar(self.clip_norm, "clip_norm", positive=True)
        check_scalar(self.synthetic_samples, "synthetic_samples", integer=True, minimum=1)
        check_scalar(self.test_fraction, "test_fraction", minimum=0.01, maximum=0.9)


def model_config(cfg: TrainAdaptiveConfig, input_dim: int, output_dim: int) -> AdaptiveConfig:
    """Preset + the ``model.*`` values that differ from the defaults + dataset dimensions."""
    base = AdaptiveConfig()
    changed = {
        f.name: getattr(cfg.model, f.name)
        for f in dataclasses.fields(AdaptiveConfig)
        if getattr(cfg.model, f.name) != getattr(base, f.name)
    }
    changed.update(input_dim=input_dim, output_dim=output_dim)
    if cfg.preset == "reference":
        return AdaptiveConfig.reference(**changed)
    if cfg.preset == "improved":
        return AdaptiveConfig.improved(**changed)
    return AdaptiveConfig(**changed)


def load_dataset(cfg: TrainAdaptiveConfig) -> dict[str, np.ndarray]:
    """x_train, y_train, x_test, y_test (float32 / int32), deterministic."""
    if cfg.dataset == "digits":
        x, y = load_digits()
        y = y.astype(np.int32)
        tr, te = train_test_split(len(y), cfg.test_fraction, cfg.data_seed)
        mu, sd = x[tr].mean(0), x[tr].std(0)
        x = (x - mu) / np.where(sd > 1e-8, sd, 1.0)
        return dict(x_train=x[tr].astype(np.float32), y_train=y[tr], x_test=x[te].astype(np.float32), y_test=y[te])
    rng = np.random.default_rng(cfg.data_seed)
    dim = cfg.model.input_dim
    protos = rng.standard_normal((10, dim))
    y = rng.integers(0, 10, cfg.synthetic_samples).astype(np.int32)
    tr, te = train_test_split(len(y), cfg.test_fraction, cfg.data_seed)
    noise = rng.standard_normal((len(y), dim))
    x = protos[y] + np.where(np.isin(np.arange(len(y)), te), 0.05, 0.1)[:, None] * noise
    return dict(x_train=x[tr].astype(np.float32), y_train=y[tr], x_test=x[te].astype(np.float32), y_test=y[te])


def _pad_batches(x: np.ndarray, y: np.ndarray, batch: int):
    m = -(-len(y) // batch)
    pad = m * batch - len(y)
    xp = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)]).reshape(m, batch, -1)
    yp = np.concatenate([y, np.full(pad, -1, y.dtype)]).reshape(m, batch)
    return jnp.asarray(xp), jnp.asarray(yp)


def build(cfg: TrainAdaptiveConfig, data: dict[str, np.ndarray]):
    """(model, initial TrainState, advance, evaluate) for a config and dataset."""
    mcfg = model_config(cfg, data["x_train"].shape[1], int(max(data["y_train"].max(), data["y_test"].max())) + 1)
    carry = cfg.state_mode == "carry" or (cfg.state_mode == "auto" and cfg.preset == "reference")
    model = AdaptiveModel(mcfg)
    key = jax.random.key(cfg.seed)
    k_init, k_train, k_eval = jax.random.split(key, 3)
    params = model.init_variables(k_init)["params"]
    opt = training.make_optimizer(
        name="adam",
        learning_rate=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        total_steps=cfg.steps if cfg.cosine else None,
        b1=0.9,
        b2=0.999,
        clip_norm=cfg.clip_norm,
    )
    node0 = adaptive.init_state(mcfg, cfg.batch_size)
    state = training.init_train_state(params, opt, key=k_train, extra=node0)
    loss_fn = make_classification_loss(model, carry_state=carry)
    train_step = training.make_train_step(loss_fn, opt)
    batcher = Batcher(len(data["y_train"]), cfg.batch_size, seed=cfg.data_seed)
    train_arrays = (jnp.asarray(data["x_train"]), jnp.asarray(data["y_train"]))
    xt, yt = _pad_batches(data["x_test"], data["y_test"], cfg.batch_size)

    def evaluate(ts: training.TrainState) -> dict[str, jax.Array]:
        init = ts.extra if carry else node0
        logits = predict(model, ts.params, xt, init, k_eval)
        valid = yt >= 0
        correct = (jnp.argmax(logits, -1) == yt) & valid
        return {"test_accuracy": jnp.sum(correct) / jnp.sum(valid)}

    def advance(ts: training.TrainState):
        def body(s, _):
            batch = batcher.batch(train_arrays, s.step)
            return train_step(s, batch)

        ts, metrics = jax.lax.scan(body, ts, None, length=cfg.steps_per_chunk)
        ev = evaluate(ts)
        obs = {k: v for k, v in metrics.items()}
        obs.update({k: v[None] for k, v in ev.items()})
        obs["chunk_end_step"] = ts.step[None]
        return ts, obs

    return model, mcfg, carry, state, jax.jit(advance), jax.jit(evaluate)


def _plots(out: str, hist: dict[str, np.ndarray], chunk: int) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    steps = np.arange(1, len(hist["loss"]) + 1)
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.8))
    w = max(1, min(50, len(steps) // 20))
    smooth = lambda v: np.convolve(v, np.ones(w) / w, mode="valid")
    ax[0].plot(steps[w - 1 :], smooth(hist["loss"]))
    ax[0].set(xlabel="optimiser step", ylabel=f"train cross-entropy (nats, {w}-step avg)", yscale="log", title="loss")
    ax[1].plot(steps[w - 1 :], smooth(hist["accuracy"]), label="train (moving avg)")
    ax[1].plot(hist["chunk_end_step"], hist["test_accuracy"], "o-", label="test")
    ax[1].set(xlabel="optimiser step", ylabel="accuracy (fraction of samples)", title="accuracy")
    ax[1].ticklabel_format(axis="y", useOffset=False)
    ax[1].legend()
    for p in adaptive.PHASES:
        ax[2].plot(steps[w - 1 :], smooth(hist[f"{p}_ratio"]), label=p)
    ax[2].set(xlabel="optimiser step", ylabel="node updates (fraction)", title="node phases")
    ax[2].legend()
    fig.suptitle("adaptive-node network training")
    paths.append(save_figure(fig, os.path.join(out, "training.png")))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(steps, hist["mean_energy"], label="mean energy")
    ax.plot(steps, hist["mean_anxiety"], label="mean anxiety")
    ax.set(xlabel="optimiser step", ylabel="mean over nodes (model units)", title="node energy and anxiety")
    ax.legend()
    paths.append(save_figure(fig, os.path.join(out, "energy.png")))
    return paths


def train(cfg: TrainAdaptiveConfig, run: TrainingRun) -> dict[str, Any]:
    """Run (or resume) a training run; writes ``summary.json``, ``metrics.json`` and (with ``run.plots``) the
    figures to ``run.out``."""
    out, progress = run.out, run.progress
    with phase("loading data", enabled=progress):
        data = load_dataset(cfg)
    with phase("building the model", enabled=progress):
        model, mcfg, carry, state, advance, evaluate = build(cfg, data)

    def metadata(step: int, ts: Any) -> dict[str, Any]:
        return {"step": int(step), "config": config_dict(cfg)}

    like = jax.eval_shape(advance, state)[1]  # the records of one chunk (all numbers: unit "1")
    units = dict.fromkeys(like, "1")
    res = train_in_chunks(cfg, run, advance, state, "train adaptive", metadata=metadata, units=units)
    hist = {k: np.asarray(v) for k, v in res.history.items()}
    ts = res.state
    final = {k: float(v) for k, v in evaluate(ts).items()}
    n_new = res.steps_run
    summary = {
        "dataset": cfg.dataset,
        "preset": cfg.preset,
        "state_mode": "carry" if carry else "reset",
        "model_config": config_dict(mcfg),
        "train_config": config_dict(cfg),
        "n_params": adaptive.count_params(ts.params),
        "n_train": int(len(data["y_train"])),
        "n_test": int(len(data["y_test"])),
        "steps": int(ts.step),
        "resumed_from": res.resumed_from,
        "test_accuracy": final["test_accuracy"],
        "best_test_accuracy": float(np.max(hist["test_accuracy"])),
        "final_train_loss_avg100": float(np.mean(hist["loss"][-100:])),
        "final_train_accuracy_avg100": float(np.mean(hist["accuracy"][-100:])),
        "phase_ratios_last100": {p: float(np.mean(hist[f"{p}_ratio"][-100:])) for p in adaptive.PHASES},
        "mean_energy_last": float(hist["mean_energy"][-1]),
        "wall_time_s": res.wall_time_s,
        "steps_this_run": n_new,
        "samples_per_s_incl_compile": n_new * cfg.batch_size / max(res.wall_time_s, 1e-9),
        "device": jax.devices()[0].device_kind,
        "jax_version": jax.__version__,
    }
    write_json(os.path.join(out, "summary.json"), summary)
    write_json(os.path.join(out, "metrics.json"), {k: v.tolist() for k, v in hist.items()})
    if run.plots:
        summary["plots"] = _plots(out, hist, cfg.steps_per_chunk)
    return summary


def profile(cfg: TrainAdaptiveConfig, out: str) -> str:
    """``--profile``: per-piece timing of the configured model on data of its dataset's shape."""
    from ivhl_jax.bench.workloads import adaptive_workload
    from ivhl_jax.run import profiling

    data = load_dataset(cfg)
    mcfg = model_config(cfg, data["x_train"].shape[1], 10)
    loss_fn, params, opt, get_batch, _ = adaptive_workload(mcfg, batch_size=cfg.batch_size)
    run = profiling.profile_training(
        loss_fn,
        params,
        opt,
        get_batch,
        batch_size=cfg.batch_size,
        key=jax.random.key(0),
        fused_chunk=cfg.steps_per_chunk,
        label=f"{cfg.preset} on {cfg.dataset}-shaped data",
    )
    return write_json(os.path.join(out, "baseline.json"), profiling.baseline_document([run]))


class TrainAdaptiveSimulation(TrainingSimulation):
    """``ivhl train adaptive`` (``--profile``: profile the train step instead of training)."""

    prog = "ivhl train adaptive"
    config_type = TrainAdaptiveConfig
    out_folder = "adaptive"
    switches = {"--profile": "instead of training, profile the train step and write baseline.json to --out"}

    def run(self, cfg: TrainAdaptiveConfig, ctx: RunContext) -> dict[str, str]:
        if ctx.args.profile:
            return {"baseline": profile(cfg, ctx.out)}
        t0 = time.perf_counter()
        s = train(cfg, TrainingRun.of(ctx))
        print(f"test accuracy {s['test_accuracy']:.4f} after {s['steps']} steps ({time.perf_counter() - t0:.1f} s)")
        paths = {"summary": os.path.join(ctx.out, "summary.json"), "metrics": os.path.join(ctx.out, "metrics.json")}
        return {**paths, **{os.path.splitext(os.path.basename(p))[0]: p for p in s.get("plots", [])}}


SIMULATION = TrainAdaptiveSimulation()
main = entry_point(SIMULATION, __name__)  # the command line as a function; python -m runs it
