"""Benchmarks of adaptive-model training: a jitted ``lax.scan`` chunk of fused train steps (data gather,
forward, backward, clipped Adam) vs vectorised PyTorch eager and ``torch.compile`` implementations of the
same equations and the same sampling algorithm (per-sample scheduler, proper log-probability policy, one
uniform per node + inverse CDF for the phase draw, explicit initial state per batch),
plus an MLP baseline (128-256-128-10, Adam).

One call = ``steps`` optimiser steps at batch 32, so throughput = steps x 32 / median time per call.
Sizes: small 20 steps, medium 100, large 400, extreme 1000 (the default configuration N=100, H=64,
D=784, C=10 at every size; only the chunk length changes).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ivhl_jax.bench.harness import BenchCase
from ivhl_jax.bench.workloads import adaptive_workload, mlp_workload
from ivhl_jax.nn import adaptive
from ivhl_jax.run.profiling import fused_train_chunk

STEPS = {"small": 20, "medium": 100, "large": 400, "extreme": 1000}
BATCH = 32
# The peers get their best thread setting: on a quiet 2-core host two torch intra-op threads are faster than
# one; on a heavily oversubscribed host they spin against each other, so on such a host set this to 1.
TORCH_THREADS = 2


def _scan_case(op: str, size: str, workload: tuple, peers: dict, params_doc: dict, notes: str) -> BenchCase:
    """``STEPS[size]`` training steps of ``workload`` ((loss_fn, params, opt, get_batch, ...) of
    :mod:`ivhl_jax.bench.workloads`) fused into one scanned call, against ``peers`` (samples/s)."""
    loss_fn, params, opt, get_batch = workload[:4]
    steps = STEPS[size]
    chunk, carry = fused_train_chunk(loss_fn, params, opt, get_batch, steps, jax.random.key(1))
    return BenchCase(
        op=op,
        size=size,
        fn=chunk,
        args=(carry,),
        params={"steps": steps, "batch": BATCH, **params_doc},
        peers=peers,
        op_by_op=False,
        items_per_call=steps * BATCH,
        items_name="samples",
        notes=notes,
    )


# ------------------------------------------------------------------------------------------ torch peers


def _torch_adaptive_loss(torch, cfg: adaptive.AdaptiveConfig):
    """The per-sample adaptive model's loss in PyTorch, ``loss_fn(x, y, params, unif)``: the equations of
    :mod:`ivhl_jax.nn.adaptive` (per-sample scheduler, proper policy, T = 1) vectorised over batch and nodes,
    one uniform per node (``unif``) drawing the phase."""
    n, hd = cfg.num_nodes, cfg.hidden_dim
    trans = torch.tensor(
        [[0.80, 0.04, 0.15, 0.01], [0.15, 0.80, 0.04, 0.01], [0.15, 0.04, 0.80, 0.01], [0.10, 0.05, 0.05, 0.80]]
    )
    tw = lambda *v: torch.tensor(v)
    w_exp, w_r2 = tw(0.6, 0.1, 0.25, 0.05), tw(0.0, 0.8, 0.2, 0.0)
    w_r4c, w_r4, w_r5a, w_r5 = tw(0.1, 0, 0.3, 0.6), tw(0.3, 0, 0.7, 0), tw(0.2, 0, 0.8, 0), tw(0.7, 0, 0.3, 0)
    circ = float(np.sin(2 * np.pi / cfg.circadian_period))
    below_one = float(np.nextafter(np.float32(1), np.float32(0)))

    def loss_fn(x, y, p, unif):
        b = x.shape[0]
        h = torch.zeros(b, n, hd)
        energy = torch.full((b, n), cfg.initial_energy)
        act = torch.zeros(b, n)
        phase = torch.zeros(b, n, dtype=torch.long)
        r = torch.zeros(b, n)
        u = x @ p["W_in"] + p["b_in"]
        anx = torch.clamp(5.0 - energy, min=0) + 2 * act + h.var(-1)
        abar = 0.3 * anx
        e = lambda m: m.unsqueeze(-1)
        w = trans[phase]
        w = w * torch.where(e(abar > 2.5), tw(0.7, 1.5, 1.3, 1.0), torch.ones(4))
        w = w * torch.where(e(r > 0.4), tw(1.0, 1.4, 1.0, 0.6), torch.ones(4))
        w = torch.where(e(act > 0.7), torch.where(e(abar > 2), w_r5a, w_r5), w)
        calm = (abar < 1.5) & (circ > 0.5)
        w = torch.where(e((energy > 20) & (act < 0.3)), torch.where(e(calm), w_r4c, w_r4), w)
        rho = torch.where(abar > 2.5, 0.9, 0.7)
        r3 = torch.stack([torch.zeros_like(rho), rho, 1 - rho, torch.zeros_like(rho)], -1)
        w = torch.where(e(energy < 2), r3, w)
        w = torch.where(e((r > 0.6) & (phase != 1)), w_r2, w)
        sev = torch.clamp(abar / (2 * cfg.anxiety_threshold), max=1.0)
        r1 = torch.stack([(1 - sev) * 0.1, 0.6 * sev, 0.3 * sev, torch.zeros_like(sev)], -1)
        w = torch.where(e(abar > cfg.anxiety_threshold), r1, w)
        # The same sampling as ivhl_jax.nn.adaptive.scheduler._decide: one uniform per node decides R0 and, rescaled
        # within its branch, the phase by inverse CDF over the masses (= w for the proper policy at T = 1).
        eps = cfg.exploration_rate
        explore = unif < eps
        w = torch.where(e(explore), w_exp, w)
        v = torch.where(explore, unif * (1.0 / eps), (unif - eps) * (1.0 / (1.0 - eps))).clamp(max=below_one)
        cdf = torch.cumsum(w, -1)
        phase = (v.unsqueeze(-1) * cdf[..., 3:] >= cdf[..., :3]).sum(-1)
        scale = 1 + p["phase_scales"][phase]
        awake = (phase != 1).float()
        delta = e(scale) * (h @ p["W_s"] + p["b_s"])
        h2 = torch.tanh(h + e(awake) * (delta + cfg.input_gain * u[:, None, :]))
        d_e = (h2 @ p["w_e"] + p["b_e"]) * (1 - 0.1 * torch.clamp(anx / 10, 0, 1)) * awake
        _ = torch.clamp((1 - cfg.energy_decay) * energy + d_e, 0, 50)  # state output; not read out
        a2 = torch.sigmoid(p["alpha"][0] * h2.mean(-1) + p["alpha"][1] * u.mean(-1)[:, None] + p["beta"])
        out = a2.clamp(0, 1) @ p["W_out"] + p["b_out"]
        return torch.nn.functional.cross_entropy(out, y)

    return loss_fn


def _torch_adaptive(steps: int, compiled: bool, cfg: adaptive.AdaptiveConfig, seed: int = 0):
    """Builder of a PyTorch training loop of the same equations (vectorised over batch and nodes)."""
    if (
        cfg.softmax_of_probabilities
        or cfg.temperature != 1.0
        or not 0.0 < cfg.exploration_rate < 1.0
        or cfg.scheduler != "per_sample"
    ):
        raise ValueError("the torch peer implements the per-sample scheduler, proper policy, T = 1, 0 < eps < 1")

    def build():
        import torch

        torch.set_num_threads(TORCH_THREADS)
        torch.manual_seed(seed)
        d, c = cfg.input_dim, cfg.output_dim
        rng = np.random.default_rng(seed)
        protos = rng.standard_normal((c, d)).astype(np.float32)
        y_all = rng.integers(0, c, 8000)
        x_all = torch.tensor(protos[y_all] + 0.1 * rng.standard_normal((8000, d)).astype(np.float32))
        y_all = torch.tensor(y_all)
        p0 = jax.tree_util.tree_map(np.asarray, adaptive.init_params(jax.random.key(seed), cfg))
        params = {k: torch.tensor(np.array(v), requires_grad=True) for k, v in p0.items()}
        opt = torch.optim.Adam(list(params.values()), lr=1e-3)
        loss_fn = _torch_adaptive_loss(torch, cfg)

        fn = torch.compile(loss_fn) if compiled else loss_fn
        plist = list(params.values())

        def run():
            perm = torch.randperm(8000)
            for s in range(steps):
                idx = perm[(s * BATCH) % 7968 : (s * BATCH) % 7968 + BATCH]
                unif = torch.rand(BATCH, cfg.num_nodes)
                loss = fn(x_all[idx], y_all[idx], params, unif)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(plist, 1.0)
                opt.step()
            return float(loss.detach())

        return run

    return build


def _torch_mlp(steps: int, compiled: bool):
    def build():
        import torch

        torch.set_num_threads(TORCH_THREADS)
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(128, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, 10),
        )
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        lossf = torch.nn.CrossEntropyLoss()
        f = torch.compile(model) if compiled else model

        def run():
            for _ in range(steps):
                x = torch.randn(BATCH, 128)
                y = torch.randint(0, 10, (BATCH,))
                loss = lossf(f(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            return float(loss.detach())

        return run

    return build


# ------------------------------------------------------------------------------------------ cases


def adaptive_train(size: str) -> BenchCase:
    cfg = adaptive.AdaptiveConfig()
    steps = STEPS[size]
    peers = {"torch_eager": _torch_adaptive(steps, False, cfg), "torch_compile": _torch_adaptive(steps, True, cfg)}
    return _scan_case(
        "adaptive_train",
        size,
        adaptive_workload(cfg, batch_size=BATCH),
        peers,
        {"N": 100, "H": 64, "D": 784, "C": 10, "scheduler": "per_sample", "optimizer": "adam+clip1"},
        "N=100, H=64, D=784; each batch starts from the explicit initial state (h=0, E=10); "
        "the reference PyTorch model: 246 ms/step = 130 samples/s (Python scheduler loop)",
    )


def adaptive_train_reference(size: str) -> BenchCase:
    cfg = adaptive.AdaptiveConfig.reference()
    return _scan_case(
        "adaptive_train_reference",
        size,
        adaptive_workload(cfg, batch_size=BATCH),
        {},
        {"N": 100, "H": 64, "D": 784, "C": 10, "scheduler": "shared (decision chain)", "optimizer": "adam+clip1"},
        "AdaptiveConfig.reference(): the batch-shared decision chain (lax.scan over rows)",
    )


def mlp_train(size: str) -> BenchCase:
    steps = STEPS[size]
    peers = {"torch_eager": _torch_mlp(steps, False), "torch_compile": _torch_mlp(steps, True)}
    return _scan_case(
        "mlp_train",
        size,
        mlp_workload(BATCH),
        peers,
        {"layers": [128, 256, 128, 10], "optimizer": "adam"},
        "the reference PyTorch MLP baseline: 1.595 ms/batch, 20,240 samples/s (4-CPU runner)",
    )


OPS: dict[str, Any] = {
    "adaptive_train": adaptive_train,
    "adaptive_train_reference": adaptive_train_reference,
    "mlp_train": mlp_train,
}


def gpu_check(quick: bool) -> dict[str, Any]:
    """The adaptive section of ``bench/gpu_checks.py``: the fused training chunk at N=100, H=64, D=784, no peers.

    ``quick``: size ``small`` (20 steps per call), 3 repeats, seconds on a CPU; otherwise ``large`` (400 steps),
    7 repeats. Returns ``{"record": <harness record>, "summary": {"size", "samples_per_s", "compile_s"}}``.
    """
    from ivhl_jax.bench.harness import run_case

    size = "small" if quick else "large"
    case = OPS["adaptive_train"](size)
    case.peers = {}
    rec = run_case(case, repeats=3 if quick else 7)
    return {
        "record": rec,
        "summary": {"size": size, "samples_per_s": rec["throughput"]["per_s"], "compile_s": rec["compile_s"]},
    }
