"""Holographic interference of point sources on a helix, with optional optical-vortex imprint.

    ivhl demo                                    # the embedded default, pictures in runs/demo
    ivhl sim holography --out runs/holo --set n_sources=128 --set "grid=[256, 256]"
    ivhl sim holography --config run.toml --no-resume

Model (see :mod:`ivhl_jax.physics.fields`): ``n_sources`` point sources on a helix about the z axis emit
outgoing waves A e^{i(k_j r − ω_j t + φ_j)}/(r + ε) with ω_j = k_j (c = 1); the wavenumbers
spread by ±``frequency_spread`` (relative, fixed by ``seed``) around k0 = 2π/``wavelength``, so
the interference pattern beats in time. The field is optionally multiplied by straight vortex
lines along z (``vortex_centers`` (x, y), integer ``vortex_charges``). It is evaluated on a 2-D
slice (``plane`` "xy", "xz" or "yz" at ``plane_offset``) or, for a 3-entry ``grid``, on a 3-D grid
over [−extent, extent]^D, for ``steps`` time steps of ``dt`` inside ``lax.scan``: the stepper
:func:`ivhl_jax.physics.fields.superposition`, driven chunk by chunk (:func:`ivhl_jax.numerics.rollout.chunked`,
:func:`ivhl_jax.run.runner.run_chunked`) with checkpoints in ``<out>/ckpt``; a run resumes bit-exactly, and
can be extended by raising ``steps``.

Outputs in ``--out`` (default ``runs/holography``; ``--demo``: ``runs/demo``): ``intensity.png``
(last frame, log scale), ``phase.png`` (last frame, with the plaquette vortex charges of
:func:`ivhl_jax.physics.fields.vortex_map`), ``mean_intensity.png`` (time average), ``summary.json``.
The per-step observations go to the run store ``<out>/run.zarr`` (:func:`ivhl_jax.run.open_run`), not into
memory nor ``summary.json``; the store also holds the last frame's field ``final_field`` over the grid axes (the
plane's two, or x, y, z) with their coordinates.
Image axes: horizontal = first coordinate of the plane, vertical = second; for a 3-D grid the
pictures show the z = middle slice.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.numerics.rollout import Stepper, chunked
from ivhl_jax.physics import fields
from ivhl_jax.run.config import config_dict, option
from ivhl_jax.run.driver import RunContext, Simulation
from ivhl_jax.run.io import save_figure, write_json
from ivhl_jax.run.runner import RunResult, run_chunked
from ivhl_jax.run.store import RunStore
from ivhl_jax.sims import entry_point
from ivhl_jax.sims._common import shared_key
from ivhl_jax.train.checkpoint import Checkpointer

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

_PLANES = {"xy": (0, 1, 2), "xz": (0, 2, 1), "yz": (1, 2, 0)}  # (first axis, second axis, normal)
#: the largest source phase k·t (rad) a run may reach: float32 resolves a phase of 2^20 rad to 2^-3 rad
MAX_PHASE = float(2**20)


@dataclasses.dataclass(frozen=True)
class HolographyConfig:
    """Configuration of the holography run; the defaults are the embedded demo.

    Lengths in units L, time in L/c with c = 1. The default covers one period of the base
    frequency (16 × 0.03125 = 0.5 = λ/c) on a 128 × 128 slice through the helix.
    """

    n_sources: int = option(64, "number of point sources on the helix")
    helix_radius: float = option(1.0, "helix radius (L)")
    helix_pitch: float = option(0.5, "rise of the helix per turn (L)")
    helix_turns: float = option(3.0, "number of helix turns")
    wavelength: float = option(0.5, "base wavelength λ = 2π/k0 (L)")
    frequency_spread: float = option(0.05, "relative spread ± of the source wavenumbers (fixed by seed)")
    phase_pattern: str = option("alternating", 'source phases: "zero", "alternating" (0, π, 0, ...) or "random"')
    amplitude: float = option(1.0, "source amplitude A")
    softening: float = option(0.05, "ε in 1/(r + ε): regularises the field at a source (L)")
    grid: tuple[int, ...] = option((128, 128), "points per axis: 2 entries for a slice, 3 for a volume")
    extent: float = option(2.0, "the grid spans [-extent, extent] on each axis (L)")
    plane: str = option("xy", 'slice plane for a 2-entry grid: "xy", "xz" or "yz"')
    plane_offset: float = option(0.0, "position of the slice along the plane's normal (L)")
    vortex_centers: tuple[tuple[float, float], ...] = option(
        ((0.45, 0.35), (-0.5, -0.3)), "(x, y) of vortex lines || z (L)"
    )
    vortex_charges: tuple[int, ...] = option((1, -2), "integer charge of each vortex line (empty: no imprint)")
    vortex_core: float = option(0.15, "vortex core size (L)")
    steps: int = option(16, "time steps (raise it to extend a finished run)")
    dt: float = option(0.03125, "time step (L/c)")
    steps_per_chunk: int = shared_key("steps_per_chunk", 4)
    checkpoint_every: int = option(8, "steps between checkpoints (a multiple of steps_per_chunk)")
    seed: int = option(0, "seed of the wavenumber spread and random phases")

    def validate(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"HolographyConfig: {msg}")

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            need(not isinstance(value, float) or bool(np.isfinite(value)), f"{f.name} must be finite, got {value}")
        need(self.n_sources >= 1, f"n_sources must be >= 1, got {self.n_sources}")
        need(self.helix_radius >= 0, f"helix_radius must be >= 0, got {self.helix_radius}")
        need(self.wavelength > 0, f"wavelength must be > 0, got {self.wavelength}")
        need(0 <= self.frequency_spread < 1, f"frequency_spread must be in [0, 1), got {self.frequency_spread}")
        need(
            self.phase_pattern in ("zero", "alternating", "random"),
            f"phase_pattern must be zero, alternating or random, got {self.phase_pattern!r}",
        )
        need(self.softening > 0, f"softening must be > 0, got {self.softening}")
        need(
            len(self.grid) in (2, 3) and all(g >= 2 for g in self.grid),
            f"grid must be [H, W] (a slice) or [H, W, L] (3-D) with entries >= 2, got {list(self.grid)}",
        )
        need(self.extent > 0, f"extent must be > 0, got {self.extent}")
        need(self.plane in _PLANES, f"plane must be one of {list(_PLANES)}, got {self.plane!r}")
        need(
            len(self.vortex_centers) == len(self.vortex_charges),
            f"vortex_centers ({len(self.vortex_centers)}) and vortex_charges ({len(self.vortex_charges)}) "
            "must have the same length",
        )
        need(self.vortex_core > 0, f"vortex_core must be > 0, got {self.vortex_core}")
        need(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        need(self.dt > 0, f"dt must be > 0, got {self.dt}")
        # The field is evaluated in float32 at t = steps·dt: past a phase of 2^20 rad (ω_max·t, ω = k) float32
        # resolves the phase no better than ±0.06 rad, and far beyond it not at all (a field of noise).
        k_max = 2 * np.pi / self.wavelength * (1 + self.frequency_spread)
        need(
            k_max * self.steps * self.dt <= MAX_PHASE,
            f"dt ({self.dt:g}) x steps ({self.steps}) = t_end {self.steps * self.dt:.3g} L/c reaches a phase "
            f"k_max·t_end = {k_max * self.steps * self.dt:.3g} rad, beyond the {MAX_PHASE:.3g} rad that float32 "
            f"resolves; lower dt (at most {MAX_PHASE / (k_max * self.steps):.3g} for {self.steps} steps) or steps",
        )
        need(
            self.steps_per_chunk >= 1 and self.steps % self.steps_per_chunk == 0,
            f"steps ({self.steps}) must be a positive multiple of steps_per_chunk ({self.steps_per_chunk})",
        )
        need(
            self.checkpoint_every >= 1 and self.checkpoint_every % self.steps_per_chunk == 0,
            f"checkpoint_every ({self.checkpoint_every}) must be a multiple of steps_per_chunk "
            f"({self.steps_per_chunk})",
        )


def build_stepper(cfg: HolographyConfig) -> Stepper[fields.WaveState, fields.SuperpositionParams]:
    """The wave-field stepper of ``cfg``: its sources, grid points and (time-independent) vortex imprint."""
    src = fields.helix_sources(cfg.n_sources, cfg.helix_radius, cfg.helix_pitch, cfg.helix_turns)
    rng = np.random.default_rng(cfg.seed)
    k0 = 2 * np.pi / cfg.wavelength
    k = k0 * (1.0 + cfg.frequency_spread * rng.uniform(-1.0, 1.0, cfg.n_sources))
    ph: np.ndarray
    if cfg.phase_pattern == "zero":
        ph = np.zeros(cfg.n_sources)
    elif cfg.phase_pattern == "alternating":  # alternating π "polarity": sources 0, π, 0, π, ...
        ph = np.pi * (np.arange(cfg.n_sources) % 2)
    else:
        ph = rng.uniform(-np.pi, np.pi, cfg.n_sources)
    e = cfg.extent
    if len(cfg.grid) == 2:
        a, b, normal = _PLANES[cfg.plane]
        plane_pts = np.asarray(fields.grid_points(cfg.grid, -e, e, dtype=jnp.float32))
        pts_host = np.zeros((plane_pts.shape[0], 3), np.float32)
        pts_host[:, a], pts_host[:, b], pts_host[:, normal] = plane_pts[:, 0], plane_pts[:, 1], cfg.plane_offset
    else:
        pts_host = np.asarray(fields.grid_points(cfg.grid, -e, e, dtype=jnp.float32))
    pts = jnp.asarray(pts_host)
    if cfg.vortex_charges:
        centers = np.array([[x, y, 0.0] for x, y in cfg.vortex_centers], np.float32)
        imprint = fields.vortex(pts, centers, np.asarray(cfg.vortex_charges, np.int32), core_size=cfg.vortex_core)
    else:
        imprint = jnp.ones(pts.shape[0], jnp.complex64)
    return fields.superposition(
        pts,
        src,
        amplitudes=np.full(cfg.n_sources, cfg.amplitude, np.float32),
        wavenumbers=np.float32(k),
        phases=np.float32(ph),
        imprint=imprint,
        softening=cfg.softening,
        dt=cfg.dt,
    )


def _slice_2d(grid: tuple[int, ...], flat: jax.Array) -> jax.Array:
    """The displayed 2-D slice of a flat grid quantity (the z = middle slice of a 3-D grid)."""
    g = flat.reshape(grid)
    return g if len(grid) == 2 else g[:, :, grid[2] // 2]


@functools.lru_cache(maxsize=8)
def make_observe(grid: tuple[int, ...]):
    """Per-step observations: time, intensity statistics and vortex counts on the displayed slice."""

    def observe(state: fields.WaveState, params: fields.SuperpositionParams) -> dict[str, jax.Array]:
        i = fields.intensity(state.field)
        vm = fields.vortex_map(_slice_2d(grid, state.field))
        return {
            "t": state.t,
            "max_intensity": jnp.max(i),
            "mean_intensity": jnp.mean(i),
            "vortices_positive": jnp.sum(vm > 0),
            "vortices_negative": jnp.sum(vm < 0),
            "net_charge": jnp.sum(vm),
        }

    return observe


def simulate(
    cfg: HolographyConfig,
    *,
    checkpointer: Checkpointer | None = None,
    progress: bool = True,
    sink: RunStore | None = None,
) -> tuple[RunResult, fields.SuperpositionParams]:
    """Run ``cfg`` (resuming from ``checkpointer`` if it holds a checkpoint); returns (result, params). With a
    ``sink`` the per-step observations go to disk and ``result.history`` holds none."""
    stepper = build_stepper(cfg)
    # make_observe is cached per grid, so repeated runs in one process (resume, tests, notebooks) hash to
    # the same compiled chunk
    observe = make_observe(tuple(cfg.grid))
    advance = chunked(stepper, cfg.steps_per_chunk, save_every=1, observe=observe)
    if sink is not None:  # model units (lengths in L, time in L/c with c = 1): every record is a pure number
        like = jax.eval_shape(lambda: observe(stepper.init(), stepper.params))
        sink.describe(time_unit="1", units={name: "1" for name in like})
    result = run_chunked(
        advance,
        stepper.init(),
        n_chunks=cfg.steps // cfg.steps_per_chunk,
        steps_per_chunk=cfg.steps_per_chunk,
        checkpointer=checkpointer,
        metadata=lambda s, _: {"config": config_dict(cfg), "step": s},
        progress=progress,
        description="holography",
        sink=sink,
    )
    return result, stepper.params


def _extent_labels(cfg: HolographyConfig) -> tuple[tuple[float, float, float, float], str, str]:
    """The picture's ``imshow`` extent (left, right, bottom, top) and the names of its horizontal and vertical axes."""
    e = cfg.extent
    a, b = (0, 1) if len(cfg.grid) == 3 else _PLANES[cfg.plane][:2]
    return (-e, e, -e, e), "xyz"[a], "xyz"[b]


def _title(cfg: HolographyConfig) -> str:
    if len(cfg.grid) == 3:
        z = np.linspace(-cfg.extent, cfg.extent, cfg.grid[2])[cfg.grid[2] // 2]
        return f"3-D grid {tuple(cfg.grid)}, slice z = {z:.3g}"
    normal = "xyz"[_PLANES[cfg.plane][2]]
    return f"{cfg.plane} slice at {normal} = {cfg.plane_offset:g}"


def _image(cfg: HolographyConfig, data: np.ndarray, label: str, **kw: Any) -> tuple[Figure, Axes]:
    """A figure of the slice ``data`` (non-finite pixels left blank) with a colour bar named ``label``; its axes."""
    from matplotlib.figure import Figure

    ext, xa, xb = _extent_labels(cfg)
    fig = Figure(figsize=(6.2, 5.2))
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(data.T), origin="lower", extent=ext, **kw)
    fig.colorbar(im, ax=ax, label=label)
    # lengths are in the model's unit L (the helix radius is 1 L by default); t in L/c
    ax.set_xlabel(f"{xa} (L)")
    ax.set_ylabel(f"{xb} (L)")
    return fig, ax


def _log_norm(data: np.ndarray) -> LogNorm:
    """A logarithmic colour scale over four decades below the largest finite value of ``data``."""
    from matplotlib.colors import LogNorm

    finite = data[np.isfinite(data)]  # non-finite pixels are left blank (masked), never the scale
    top = float(np.max(finite)) if finite.size else 1.0
    return LogNorm(vmin=max(top * 1e-4, 1e-30), vmax=max(top, 2e-30))


def _phase_picture(cfg: HolographyConfig, psi: np.ndarray, vm: np.ndarray, title: str, out: str) -> str:
    """``phase.png``: arg ψ of the slice with the plaquette vortex charges ``vm`` marked (+ red, − cyan)."""
    fig, ax = _image(cfg, np.angle(psi), "arg ψ (rad)", cmap="twilight", vmin=-np.pi, vmax=np.pi)
    h, w = psi.shape
    xs = np.linspace(-cfg.extent, cfg.extent, h)
    ys = np.linspace(-cfg.extent, cfg.extent, w)
    xc, yc = 0.5 * (xs[1:] + xs[:-1]), 0.5 * (ys[1:] + ys[:-1])
    for sign, color, marker in ((1, "red", "+"), (-1, "cyan", "x")):
        ii, jj = np.nonzero(np.sign(vm) == sign)
        ax.scatter(
            xc[ii],
            yc[jj],
            s=14,
            c=color,
            marker=marker,
            linewidths=0.8,
            label=f"charge {'+' if sign > 0 else '−'} ({len(ii)})",
        )
    ax.legend(loc="upper right", fontsize=7, framealpha=0.6)
    ax.set_title(f"phase and plaquette vortex charges (net {int(vm.sum())})\n{title}")
    return save_figure(fig, os.path.join(out, "phase.png"))


def write_outputs(
    cfg: HolographyConfig,
    result: RunResult,
    params: fields.SuperpositionParams,
    out: str,
    observations: RunStore | None = None,
) -> dict[str, str]:
    """Write intensity.png, phase.png, mean_intensity.png and summary.json; returns their paths. With
    ``observations`` (the run store that holds them) the summary names it instead of holding them."""
    st = result.state
    psi = np.asarray(_slice_2d(cfg.grid, st.field))
    inten = np.abs(psi) ** 2
    mean_i = np.asarray(_slice_2d(cfg.grid, st.intensity_sum)) / max(int(st.step), 1)
    vm = np.asarray(fields.vortex_map(psi))
    title = _title(cfg)
    paths = {}
    fig, ax = _image(cfg, inten, "|ψ|² (A²/L²)", norm=_log_norm(inten), cmap="inferno")
    ax.set_title(f"intensity at t = {float(st.t):.4g} L/c\n{title}")
    paths["intensity"] = save_figure(fig, os.path.join(out, "intensity.png"))
    paths["phase"] = _phase_picture(cfg, psi, vm, title, out)
    fig, ax = _image(cfg, mean_i, "⟨|ψ|²⟩_t (A²/L²)", norm=_log_norm(mean_i), cmap="magma")
    ax.set_title(f"time-averaged intensity over {int(st.step)} frames\n{title}")
    paths["mean_intensity"] = save_figure(fig, os.path.join(out, "mean_intensity.png"))

    hist = jax.tree_util.tree_map(np.asarray, result.history)
    full_i = np.abs(np.asarray(st.field)) ** 2
    summary = {
        "config": config_dict(cfg),
        "steps": result.steps,
        "resumed_from": result.resumed_from,
        "wall_time_s": result.wall_time_s,
        "final_time": float(st.t),
        "t_convention": "t = steps done when the record was taken x dt (from t = 0); first record at dt",
        "final": {
            "max_intensity": float(full_i.max()),
            "mean_intensity": float(full_i.mean()),
            "slice_vortices_positive": int((vm > 0).sum()),
            "slice_vortices_negative": int((vm < 0).sum()),
            "slice_net_charge": int(vm.sum()),
        },
        "time_averaged_max_intensity": float(np.max(np.asarray(st.intensity_sum)) / max(int(st.step), 1)),
        "imprinted_net_charge": int(sum(cfg.vortex_charges)),
        **({"history": hist} if observations is None else {"observations": observations.path}),
        "devices": [str(d) for d in jax.devices()[:1]],
        "pictures": dict(paths),
    }
    paths["summary"] = write_json(os.path.join(out, "summary.json"), summary)
    return {k: os.path.abspath(v) for k, v in paths.items()}


class HolographySimulation(Simulation):
    """``ivhl sim holography`` (and ``ivhl demo``: ``--demo``, the embedded default written to runs/demo)."""

    prog = "ivhl sim holography"
    config_type = HolographyConfig
    extendable = ("steps",)  # resuming is only meaningful for the same physics; steps may grow
    streams = True

    def run(self, cfg: HolographyConfig, ctx: RunContext) -> dict[str, str]:
        if ctx.args.demo:
            print(
                f"ivhl demo: {cfg.n_sources} sources on a helix, {'x'.join(map(str, cfg.grid))} {cfg.plane} "
                f"grid, {cfg.steps} time steps, vortices {list(cfg.vortex_charges)}"
            )
        result, params = simulate(cfg, checkpointer=ctx.checkpointer, progress=ctx.progress, sink=ctx.sink)
        if ctx.sink is not None:  # the final field over its grid axes (x_i = -extent + i·2 extent/(n - 1), in L)
            axes = tuple("xyz"[i] for i in _PLANES[cfg.plane][:2]) if len(cfg.grid) == 2 else ("x", "y", "z")
            coords = {d: np.linspace(-cfg.extent, cfg.extent, n) for d, n in zip(axes, cfg.grid)}
            ctx.sink.write_field(
                "final_field",
                np.asarray(result.state.field).reshape(tuple(cfg.grid)),
                axes,
                coords=coords,
                units={"final_field": "1", **{d: "1" for d in axes}},
                attrs={"step": result.steps},
            )
        paths = write_outputs(cfg, result, params, ctx.out, observations=ctx.sink)
        print(result.rate_line())
        if ctx.args.demo:
            print(f"open the pictures below (PNG); the run's numbers are in {paths['summary']}")
        return {name: paths[name] for name in ("intensity", "phase", "mean_intensity", "summary")}

    def default_out(self, cfg: HolographyConfig, args: argparse.Namespace) -> str:
        return "runs/demo" if args.demo else "runs/holography"

    def default_resume(self, args: argparse.Namespace) -> bool:
        return not args.demo  # the demo always starts fresh

    def checkpoint_every(self, cfg: HolographyConfig) -> int:
        return cfg.checkpoint_every

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--demo", action="store_true", help="the embedded default run, written to runs/demo")


SIMULATION = HolographySimulation()
main = entry_point(SIMULATION, __name__)  # the command line as a function; python -m runs it
