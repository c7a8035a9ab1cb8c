"""Train a GRU to predict vortex trajectories detected in wave fields: ``ivhl train vortex_gru``.

Data (no download). Each trajectory is a random Fourier path:
``c(t) = sum_{n=1..3} (A_n cos(n w t + phi_n), B_n sin(n w t + psi_n))`` with amplitudes scaled so
that ``|c| <= 0.5``. At every time step a charge-1 optical vortex is imprinted at ``c(t)`` on a
``grid x grid`` window of [-1, 1]^2 with :func:`ivhl_jax.physics.fields.vortex`, and the vortex is *detected*
from the field: :func:`ivhl_jax.physics.fields.vortex_map` gives the plaquette with winding +1, and the
zero of the least-squares linear fit ``psi ~ a + b x + c y`` over its four corners gives the
sub-grid position. The GRU sees the detected positions ``p_0..p_t`` and predicts ``p_{t+1}``
(teacher forcing, MSE, Adam + clipping). Reported on held-out trajectories: one-step
RMSE against persistence (``p_{t+1} = p_t``) and constant velocity (``2 p_t - p_{t-1}``), and the
detection error against the true centre.

Outputs in ``--out`` (default ``runs/vortex_gru``): ``summary.json``, ``metrics.json``, ``vortex_gru.png``
(test trajectories and the train loss) and ``loss_curve.png`` (train MSE; held-out RMSE after each chunk
against the baselines); ``--no-plots`` skips the pictures.
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
from ivhl_jax.models.gru import TrajectoryGRU
from ivhl_jax.physics import fields
from ivhl_jax.run.config import config_dict, option
from ivhl_jax.run.driver import RunContext
from ivhl_jax.run.io import save_figure, write_json
from ivhl_jax.run.runner import phase
from ivhl_jax.sims import entry_point
from ivhl_jax.sims._common import TrainingRun, TrainingSimulation, check_training_steps, shared_key, train_in_chunks
from ivhl_jax.train import training
from ivhl_jax.train.data import Batcher


@dataclasses.dataclass(frozen=True)
class VortexGRUConfig:
    n_train: int = option(256, "number of training trajectories")
    n_test: int = option(64, "held-out trajectories")
    length: int = option(48, "time steps per trajectory (one period of the path)")
    grid: int = option(48, "points per axis of the detection window [-1, 1]^2 (>= 8)")
    harmonics: int = option(3, "Fourier harmonics of the random paths")
    hidden: int = option(64, "GRU hidden width")
    layers: int = option(2, "stacked GRU layers")
    variant: str = option("torch", 'GRU equations: "torch" (PyTorch/nnx) or "cho" (Cho et al. 2014)')
    steps: int = shared_key("steps", 1500)
    steps_per_chunk: int = shared_key("steps_per_chunk", 250)
    batch_size: int = option(32, "trajectories per batch")
    learning_rate: float = option(2e-3, "Adam learning rate (cosine schedule, clip 1.0)")
    seed: int = option(0, "seed of the data and the initialisation")

    def validate(self) -> None:
        for k in (
            "n_train",
            "n_test",
            "length",
            "grid",
            "harmonics",
            "hidden",
            "layers",
            "batch_size",
        ):
            check_scalar(getattr(self, k), k, integer=True, minimum=1)
        check_training_steps(self)
        if self.batch_size > self.n_train:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be <= n_train ({self.n_train}): lower batch_size or raise n_train"
            )
        if self.grid < 8:
            raise ValueError("grid must be >= 8 to resolve the vortex core")
        check_choice(self.variant, "variant", ("torch", "cho"))
        check_scalar(self.learning_rate, "learning_rate", positive=True)


def fourier_paths(key: jax.Array, n: int, length: int, harmonics: int) -> jax.Array:
    """True centres ``[n, length, 2]``, ``|c| <= 0.5``, one period over the sequence."""
    ka, kp = jax.random.split(key)
    amp = jax.random.normal(ka, (n, 2, harmonics)) / jnp.arange(1, harmonics + 1)
    ph = jax.random.uniform(kp, (n, 2, harmonics), maxval=2 * jnp.pi)
    t = jnp.arange(length) * 2 * jnp.pi / length
    k = jnp.arange(1, harmonics + 1)
    arg = k[None, None, :, None] * t + ph[..., None]  # [n, 2, K, T]
    xy = jnp.stack(
        [jnp.sum(amp[:, 0, :, None] * jnp.cos(arg[:, 0]), 1), jnp.sum(amp[:, 1, :, None] * jnp.sin(arg[:, 1]), 1)], -1
    )  # [n, T, 2]
    scale = 0.5 / jnp.max(jnp.linalg.norm(xy, axis=-1), axis=1)
    return xy * scale[:, None, None]


def detect(center: jax.Array, grid: int) -> jax.Array:
    """Imprint a charge-1 vortex at ``center`` on the grid and locate it from the field alone."""
    pts = fields.grid_points((grid, grid), -1.0, 1.0)
    psi = fields.vortex(pts, center[None], jnp.array([1]), core_size=0.1).reshape(grid, grid)
    q = fields.vortex_map(psi)
    ij = jnp.argmax(q.reshape(-1))
    i, j = ij // (grid - 1), ij % (grid - 1)
    h = 2.0 / (grid - 1)
    corners = jnp.array([[0, 0], [1, 0], [1, 1], [0, 1]])
    vals = psi[i + corners[:, 0], j + corners[:, 1]]
    xy = -1.0 + h * (jnp.stack([i, j]) + corners)  # [4, 2]
    a = jnp.concatenate([jnp.ones((4, 1)), xy], axis=1)  # psi = a0 + b x + c y
    coef_re = jnp.linalg.lstsq(a, vals.real)[0]
    coef_im = jnp.linalg.lstsq(a, vals.imag)[0]
    m = jnp.array([[coef_re[1], coef_re[2]], [coef_im[1], coef_im[2]]])
    return jnp.linalg.solve(m, -jnp.array([coef_re[0], coef_im[0]]))


@jax.jit
def _detect_all(c: jax.Array, grid_template: jax.Array) -> jax.Array:
    grid = grid_template.shape[0]
    return jax.vmap(jax.vmap(lambda x: detect(x, grid)))(c)


def make_data(cfg: VortexGRUConfig) -> dict[str, Any]:
    """The detected centres ``train [n_train, length, 2]`` and ``test``, the true centres of the test paths
    ``true_test``, and the detection's RMSE against the true centres ``detect_rmse`` (a float)."""
    key = jax.random.key(cfg.seed + 1000)
    paths = fourier_paths(key, cfg.n_train + cfg.n_test, cfg.length, cfg.harmonics)
    true, det = np.asarray(paths), np.asarray(_detect_all(paths, jnp.zeros((cfg.grid,))))
    return {
        "train": det[: cfg.n_train],
        "test": det[cfg.n_train :],
        "true_test": true[cfg.n_train :],
        "detect_rmse": float(np.sqrt(np.mean(np.sum((det - true) ** 2, -1)))),
    }


def baselines(p: np.ndarray) -> dict[str, float]:
    """One-step RMSE of persistence and constant velocity on ``p [n, T, 2]`` (targets t = 2..T-1)."""
    tgt = p[:, 2:]
    pers = p[:, 1:-1]
    cv = 2 * p[:, 1:-1] - p[:, :-2]
    r = lambda a: float(np.sqrt(np.mean(np.sum((a - tgt) ** 2, -1))))
    return {"persistence_rmse": r(pers), "constant_velocity_rmse": r(cv)}


def train(cfg: VortexGRUConfig, run: TrainingRun) -> dict:
    """Train (or resume) into ``run.out``: writes ``summary.json``, ``metrics.json`` and (with ``run.plots``)
    ``vortex_gru.png`` and ``loss_curve.png``."""
    out, progress = run.out, run.progress
    with phase(
        "making data",
        detail=f"{cfg.n_train + cfg.n_test} trajectories, vortices detected on a {cfg.grid}x{cfg.grid} window",
        enabled=progress,
    ):
        data = make_data(cfg)
    model = TrajectoryGRU(hidden=cfg.hidden, layers=cfg.layers, variant=cfg.variant)
    train_arr = jnp.asarray(data["train"])
    test_arr = jnp.asarray(data["test"])
    params = model.init(jax.random.key(cfg.seed), jnp.swapaxes(train_arr[:2], 0, 1))["params"]
    opt = training.make_optimizer(
        name="adam", learning_rate=cfg.learning_rate, total_steps=cfg.steps, b2=0.999, clip_norm=1.0
    )

    def predict(p, seqs):  # seqs [B, T, 2] -> one-step predictions for t = 1..T-1
        pred = model.apply({"params": p}, jnp.swapaxes(seqs[:, :-1], 0, 1))
        return jnp.swapaxes(pred, 0, 1)

    def loss_fn(p, batch, key, extra):
        err = predict(p, batch) - batch[:, 1:]
        loss = jnp.mean(jnp.sum(err**2, -1))
        return loss, ({}, extra)

    step = training.make_train_step(loss_fn, opt)
    batcher = Batcher(cfg.n_train, cfg.batch_size, seed=cfg.seed)

    def test_rmse(p):
        err = predict(p, test_arr)[:, 1:] - test_arr[:, 2:]  # same targets as the baselines
        return jnp.sqrt(jnp.mean(jnp.sum(err**2, -1)))

    per_chunk = cfg.steps_per_chunk

    def advance(ts):
        ts, m = jax.lax.scan(lambda s, _: step(s, batcher.batch(train_arr, s.step)), ts, None, length=per_chunk)
        return ts, {"loss": m["loss"], "test_rmse": test_rmse(ts.params)[None]}

    state = training.init_train_state(params, opt, key=jax.random.key(cfg.seed + 1))
    # numbers: the loss, and the RMSE in the window's coordinates (half-width 1)
    units, rmse = {"loss": "1", "test_rmse": "1"}, "one-step test RMSE of the vortex positions"
    res = train_in_chunks(
        cfg, run, jax.jit(advance), state, "train vortex_gru", units=units, long_names={"test_rmse": rmse}
    )
    hist = {k: np.asarray(v) for k, v in res.history.items()}
    final = float(jax.jit(test_rmse)(res.state.params))
    base = baselines(data["test"])
    summary: dict[str, Any] = {
        "config": config_dict(cfg),
        "gru_test_rmse": final,
        **base,
        "gru_over_constant_velocity": final / base["constant_velocity_rmse"],
        "detection_rmse_vs_true_centre": data["detect_rmse"],
        "grid_spacing": 2.0 / (cfg.grid - 1),
        "steps": int(res.state.step),
        "resumed_from": res.resumed_from,
        "wall_time_s": res.wall_time_s,
    }
    write_json(os.path.join(out, "summary.json"), summary)
    write_json(os.path.join(out, "metrics.json"), {k: v.tolist() for k, v in hist.items()})
    if run.plots:
        pred = np.asarray(jax.jit(predict)(res.state.params, test_arr[:3]))
        summary["plot"], summary["loss_curve"] = write_plots(out, hist, data, pred, base, cfg.steps_per_chunk)
    return summary


def write_plots(
    out: str,
    hist: dict[str, np.ndarray],
    data: dict[str, np.ndarray],
    pred: np.ndarray,
    base: dict[str, float],
    chunk: int,
) -> tuple[str, str]:
    """``vortex_gru.png`` (three test trajectories: true centre, detected, GRU one-step, and the train loss) and
    ``loss_curve.png`` (train MSE per step with its moving average; test RMSE after each chunk against the
    persistence and constant-velocity baselines). Positions are in units of the [-1, 1]² detection window.

    Returns the two paths.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4.2))
    for i in range(len(pred)):
        ax[0].plot(*data["true_test"][i].T, "k-", lw=0.8, label="true centre" if i == 0 else None)
        ax[0].plot(*data["test"][i].T, ".", ms=3, label="detected" if i == 0 else None)
        ax[0].plot(*pred[i].T, "x", ms=3, label="GRU one-step" if i == 0 else None)
    ax[0].set(aspect="equal", title="vortex trajectories (test)", xlabel="x (window units)", ylabel="y (window units)")
    ax[0].legend(fontsize=8)
    ax[1].semilogy(np.arange(1, len(hist["loss"]) + 1), hist["loss"])
    ax[1].set(xlabel="optimiser step", ylabel="train MSE (window units²)", title="training loss")
    plot = save_figure(fig, os.path.join(out, "vortex_gru.png"))

    steps = np.arange(1, len(hist["loss"]) + 1)
    w = max(1, min(50, len(steps) // 20))
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].semilogy(steps, hist["loss"], lw=0.6, alpha=0.5, label="per step")
    ax[0].semilogy(
        steps[w - 1 :], np.convolve(hist["loss"], np.ones(w) / w, mode="valid"), label=f"moving average ({w} steps)"
    )
    ax[0].set(xlabel="optimiser step", ylabel="train MSE (window units²)", title="train loss")
    ax[0].legend(fontsize=8)
    chunk_end = chunk * np.arange(1, len(hist["test_rmse"]) + 1)
    ax[1].plot(chunk_end, hist["test_rmse"], "o-", label="GRU (test)")
    ax[1].axhline(base["constant_velocity_rmse"], color="k", ls="--", label="constant velocity")
    ax[1].axhline(base["persistence_rmse"], color="0.5", ls=":", label="persistence")
    ax[1].set(xlabel="optimiser step", ylabel="one-step RMSE (window units)", title="held-out error")
    ax[1].ticklabel_format(axis="y", useOffset=False)
    ax[1].legend(fontsize=8)
    fig.suptitle("vortex GRU training")
    return plot, save_figure(fig, os.path.join(out, "loss_curve.png"))


class VortexGRUSimulation(TrainingSimulation):
    """``ivhl train vortex_gru``."""

    prog = "ivhl train vortex_gru"
    config_type = VortexGRUConfig
    out_folder = "vortex_gru"

    def run(self, cfg: VortexGRUConfig, ctx: RunContext) -> dict[str, str]:
        t0 = time.perf_counter()
        s = train(cfg, TrainingRun.of(ctx))
        print(
            f"GRU one-step RMSE {s['gru_test_rmse']:.4g} (constant velocity {s['constant_velocity_rmse']:.4g}, "
            f"persistence {s['persistence_rmse']:.4g}) in {time.perf_counter() - t0:.1f} s"
        )
        paths = {"summary": os.path.join(ctx.out, "summary.json"), "metrics": os.path.join(ctx.out, "metrics.json")}
        if "plot" in s:
            paths.update(plot=s["plot"], loss_curve=s["loss_curve"])
        return paths


SIMULATION = VortexGRUSimulation()
main = entry_point(SIMULATION, __name__)  # the command line as a function; python -m runs it
