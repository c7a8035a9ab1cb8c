"""The physics families' tunable kernels, registered for ``ivhl tune`` (:mod:`ivhl_jax.core.tunables`).

* ``fields`` — ``fields.superpose``: kernel (``loop``/``reduce``; ``pallas`` on GPUs), block size (pair budget)
  and whether a block runs on one thread (the ``fields_serial_pairs`` threshold), per pair-count bucket.
* ``gp`` — the GP Strang step: merged potential half-steps vs one step at a time, and the host FFT (``ducc``,
  CPU, where installed) vs XLA's FFT; with several devices, one device vs every slab / pencil layout of the
  distributed FFT over all of them (:func:`gp_layout_meshes`; a measurement, keyed by device count and grid).
* ``cdt`` — the CDT engine (``host`` numba kernel, pure ``jax``; ``pallas`` only where it compiles: GPU). In
  ``--quick`` the host engine is left out (said in ``notes``) when numba's disk cache lacks its kernels.

The field kernel and a GP run are also the workloads the XLA-flag area times under each flag configuration.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ivhl_jax.core import backend, host, tunables
from ivhl_jax.core.tunables import Candidate, Tuner

__all__ = [
    "fields_candidates",
    "pallas_candidate",
    "tune_fields",
    "tune_gp",
    "gp_layout_meshes",
    "tune_gp_layouts",
    "host_kernels_cached",
    "tune_cdt",
]


# ------------------------------------------------------------------------------------------ fields
def _fields_sizes(quick: bool, tiny: bool) -> list[tuple[int, int]]:
    if tiny:
        return [(512, 8)]
    if backend.platform() != "cpu":
        return [(65536, 256), (1048576, 512)] if quick else [(65536, 256), (262144, 256), (1048576, 512)]
    return [(8192, 50), (65536, 256)] if quick else [(8192, 50), (65536, 256), (262144, 256), (32768, 1024)]


def _fields_inputs(n: int, m: int):
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    pts = jnp.asarray(rng.uniform(-10, 10, (n, 3)), jnp.float32)
    src = jnp.asarray(rng.uniform(-10, 10, (m, 3)), jnp.float32)
    amp = jnp.asarray(rng.uniform(0.5, 1.5, m), jnp.float32)
    k = jnp.asarray(rng.uniform(0.5, 2.0, m), jnp.float32)
    ph = jnp.asarray(rng.uniform(0, 2 * np.pi, m), jnp.float32)
    return pts, src, amp, k, ph


def _superpose(p, s, a, k, ph):
    from ivhl_jax.physics import fields

    return fields.superpose(p, s, amplitudes=a, wavenumbers=k, phases=ph, softening=0.1)


def fields_candidates(t: Tuner, n: int, m: int) -> list[Candidate]:
    """``fields.superpose`` at n points x m sources: the table default, then every distinct (kernel, block,
    one-thread) combination of pair budgets 2**18 … 2**26, and on a GPU the Pallas kernel
    (:func:`pallas_candidate`)."""
    args = _fields_inputs(n, m)
    row = backend.TABLE.get(backend.platform(), backend.TABLE["portable"])
    # the table's own values, stated: a measured choice stays what was measured if the table changes later
    table = {
        k: getattr(row, k) for k in ("fields_chunking", "fields_pair_budget", "fields_method", "fields_serial_pairs")
    }
    cands = [Candidate("table", table, lambda: t.aot(_superpose, *args), default=True)]
    seen = set()
    on_cpu = backend.platform() == "cpu"
    for budget in (1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26):
        chunk = max(1, min(n, budget // m))
        for method, serial in (("loop", True), ("loop", False), ("reduce", False)):
            key = (method, chunk, serial)
            # blocks below 1024 points cost a loop step per block for nothing; on a CPU the reduce kernel is one
            # candidate (all points at once), on an accelerator the loop kernel's one-thread variant means nothing
            # (on an accelerator a loop over many small blocks serialises the device: blocks of >= n/8 points only)
            if (
                key in seen
                or (chunk < min(n, 1024))
                or (method == "reduce" and on_cpu and chunk < n)
                or (serial and not on_cpu)
                or (not on_cpu and chunk < n // 8)
            ):
                continue
            seen.add(key)
            pairs = chunk * m
            settings = {
                "fields_chunking": "pair_budget",
                "fields_pair_budget": max(budget, m),
                "fields_method": method,
                "fields_serial_pairs": int(2 ** np.ceil(np.log2(pairs))) if serial else 0,
            }
            if method == "reduce":
                settings["fields_serial_pairs"] = row.fields_serial_pairs
            name = f"{method}{'_1thread' if serial else ''}_chunk{chunk}"
            cands.append(Candidate(name, settings, functools.partial(t.aot, _superpose, *args, settings=settings)))
    if pallas_candidate(backend.platform()):
        # the Pallas tile kernel (ivhl_jax.physics.fields_pallas): compiled on a CUDA GPU only (on a CPU it would
        # run in Pallas's interpreter, orders of magnitude slower); a compile failure there fails this candidate
        settings = {**table, "fields_method": "pallas"}
        cands.append(Candidate("pallas", settings, functools.partial(t.aot, _superpose, *args, settings=settings)))
    if t.verify:
        cands.append(Candidate("no_settings_with_cache", {}, lambda: t.aot(_superpose, *args, cached=True)))
    return cands


def pallas_candidate(platform: str) -> bool:
    """Whether the fields area races the Pallas kernel on ``platform``: on GPUs only (it is compiled there; on
    every other platform it runs in Pallas's interpreter)."""
    return platform == "gpu"


def tune_fields(t: Tuner, sizes: Sequence[tuple[int, int]] | None = None) -> dict[str, dict[str, Any]]:
    """The ``fields`` area: :func:`fields_candidates` at each size, one entry per pair-count bucket."""
    out = {}
    for n, m in sizes or _fields_sizes(t.quick, t.tiny):
        t.log(f"fields.superpose {n} x {m} ...")
        rounds = 5 if t.tiny else (15 if n * m < 1 << 22 else 9)
        entry = t.choose(
            "fields.superpose",
            n * m,
            fields_candidates(t, n, m),
            rounds=rounds,
            rtol=2e-5,
            params={"points": n, "sources": m, "dtype": "float32"},
        )
        out[f"fields.superpose|{entry['bucket']}"] = entry
    return out


def _fields_at_size(t: Tuner, op: str, size: int) -> dict[str, dict[str, Any]]:
    # a square-ish problem with the same pair count: points x 64 sources
    m = 64 if size >= 64 * 64 else max(1, int(np.sqrt(size)))
    return tune_fields(t, sizes=[(max(1, size // m), m)])


# ------------------------------------------------------------------------------------------ gp
def _gp_sizes(quick: bool, tiny: bool) -> list[tuple[int, ...]]:
    if tiny:
        return [(8, 8, 8)]
    if backend.platform() != "cpu":
        return [(256, 256, 256)]
    return [(64, 64, 64)] if quick else [(64, 64, 64), (128, 128, 128)]


def _observe_nothing(state, params):
    return None


def _gp_run(shape: tuple[int, ...], steps: int, every: int, fft: str = "xla", layout: Any = None):
    """``(fn, (psi,))``: ``steps`` GP Strang steps (harmonic trap, g = 100, dt = 1e-3, complex64) observed every
    ``every`` steps, returning the final field."""
    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.physics import condensate as C

    grid = C.Grid.uniform(shape, [0.1 * n for n in shape])
    system = C.GPSystem.create(grid, C.harmonic(grid), 100.0, fft=fft, layout=layout)
    stepper = C.strang(system, 1e-3)
    psi = stepper.init(C.gaussian(grid))
    return (lambda p: trajectory(stepper, p, steps, save_every=every, observe=_observe_nothing)[0]), (psi,)


def tune_gp(t: Tuner) -> dict[str, dict[str, Any]]:
    """The GP Strang step (harmonic trap, g = 100, dt = 1e-3, complex64): K steps merged into one run (the
    default of a trajectory observed every K steps) vs K single steps, and XLA's FFT vs the host FFT."""
    out = {}
    for shape in _gp_sizes(t.quick, t.tiny):
        steps = 4 if t.tiny else 10
        t.log(f"gp step {'x'.join(map(str, shape))} ({steps} steps per call) ...")

        def build(fft: str, merged: bool, shape=shape, steps=steps, cached=False):
            fn, args = _gp_run(shape, steps, steps if merged else 1, fft=fft)
            return t.aot(fn, *args, cached=cached)

        cands = [
            Candidate("xla_merged", {"gp_fft": "xla", "gp_merged": True}, lambda: build("xla", True), True),
            Candidate("xla_step_by_step", {"gp_fft": "xla", "gp_merged": False}, lambda: build("xla", False)),
        ]
        unavailable = {}
        if backend.defaults().host_fft:
            if host.installed("ducc0"):
                cands.append(
                    Candidate("ducc_merged", {"gp_fft": "ducc", "gp_merged": True}, lambda: build("ducc", True))
                )
            else:
                unavailable["ducc_merged"] = "ducc0"  # a later install makes this entry stale (tuning_cache.entries)
                t.note("ducc0 not installed: the host FFT is not a candidate here (pip install 'ivhl_jax[cpu-fft]')")
        if t.verify:
            cands.append(Candidate("no_settings_with_cache", {}, lambda: build("xla", True, cached=True)))
        size = int(np.prod(shape))
        entry = t.choose(
            "condensate.strang",
            size,
            cands,
            rounds=5 if t.tiny else 9,
            rtol=1e-4,
            params={"shape": list(shape), "steps_per_call": steps, "dtype": "complex64"},
        )
        if unavailable:
            entry["unavailable"] = unavailable
        entry["ideal_bytes_per_step"] = 3 * 2 * 8 * size
        entry["fraction_of_bandwidth_ideal"] = (
            steps * 3 * 2 * 8 * size / entry["median_s"] / 1e9 / t.limits["copy_gbps"]
        )
        out[f"condensate.strang|{entry['bucket']}"] = entry
    out.update(tune_gp_layouts(t))
    return out


def gp_layout_meshes(devices: int) -> list[str]:
    """The mesh settings (:func:`ivhl_jax.numerics.distributed_fft.parse_mesh`) over all ``devices``: the slab
    ``"n"`` and every pencil ``"a x b"`` with a, b > 1 (none for one device)."""
    if devices < 2:
        return []
    return [str(devices)] + [f"{a}x{devices // a}" for a in range(2, devices) if devices % a == 0]


def tune_gp_layouts(t: Tuner) -> dict[str, dict[str, Any]]:
    """With more than one device: the GP Strang step on a 3-D grid with ψ on one device against every
    distributed-FFT layout over all devices (slab, pencils; :func:`gp_layout_meshes`), each output checked
    against the one-device run. The winner is stored as ``condensate.layout|<n>dev,<grid>``: a measurement (the
    mesh is the caller's choice, ``GPSystem.create(layout=...)`` / ``--mesh``; no default reads it)."""
    import jax

    from ivhl_jax.numerics import distributed_fft

    ndev = jax.device_count()
    meshes = gp_layout_meshes(ndev)
    if not meshes:
        t.note("one device visible: no slab/pencil layout to time (the layouts need a mesh of >= 2 devices)")
        return {}
    out = {}
    for shape in _gp_sizes(t.quick, t.tiny):
        steps = 4 if t.tiny else 10
        t.log(f"gp layouts {'x'.join(map(str, shape))} on {ndev} devices: one device, {', '.join(meshes)} ...")

        def build(mesh: str | None, shape=shape, steps=steps):
            layout = None if mesh is None else distributed_fft.parse_mesh(mesh, len(shape))
            fn, args = _gp_run(shape, steps, steps, layout=layout)
            return t.aot(fn, *args)

        cands = [Candidate("one_device", {"gp_layout": "none", "mesh": "1"}, lambda: build(None), default=True)]
        cands += [
            Candidate(
                f"{'slab' if 'x' not in m else 'pencil'}_{m}",
                {"gp_layout": "slab" if "x" not in m else "pencil", "mesh": m},
                functools.partial(build, m),
            )
            for m in meshes
        ]
        entry = t.choose(
            "condensate.layout",
            int(np.prod(shape)),
            cands,
            rounds=5 if t.tiny else 9,
            rtol=1e-4,
            params={"shape": list(shape), "devices": ndev, "steps_per_call": steps, "dtype": "complex64"},
        )
        entry["bucket"] = f"{ndev}dev,{'x'.join(map(str, shape))}"
        entry["note"] = (
            "a measurement: the layout is the caller's choice (GPSystem.create(layout=...), --mesh); no default "
            "reads this entry"
        )
        out[f"condensate.layout|{entry['bucket']}"] = entry
    return out


# ------------------------------------------------------------------------------------------ cdt
def host_kernels_cached() -> bool:
    """Whether numba's disk cache holds a compiled, current version of the CDT host engine's kernel (its index
    file exists and matches the source file); False when it cannot be read or numba is missing. Reads files
    only: nothing is compiled."""
    try:
        from ivhl_jax.physics.cdt import host_kernels
    except Exception:  # noqa: BLE001 - numba missing or broken: nothing cached
        return False
    return _numba_cached(host_kernels.run_stream)


def _numba_cached(dispatcher: Any) -> bool:
    """Whether numba's disk cache has an entry for a ``cache=True`` dispatcher that matches its current source
    (numba's own index check: file stamp and numba version), without compiling anything."""
    try:
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - numba internals differ between versions: treat as not cached
        return False


def _cdt_check(volume: int):
    def check(out) -> str | None:
        import jax

        st = jax.tree.map(lambda x: np.asarray(x)[0], out.geometry)  # the one chain
        n0 = int(st.n0)
        if bool(st.overflow):
            return "the vertex buffer overflowed"
        if int(np.sum(st.lengths)) != n0:
            return f"slice lengths sum to {int(np.sum(st.lengths))}, not N0 = {n0}"
        live = np.asarray(st.vperm)[:n0]
        right = np.asarray(st.vright)[live]
        vtime = np.asarray(st.vtime)
        if not np.isin(right, live).all() or not np.array_equal(vtime[right], vtime[live]):
            return "a live vertex's right neighbour is dead or on another slice"
        if abs(2 * n0 - volume) > 0.5 * volume or int(np.sum(st.accepts)) == 0:
            return f"N2 = {2 * n0} far from the target {volume}, or no move accepted"
        return None

    return check


def tune_cdt(t: Tuner) -> dict[str, dict[str, Any]]:
    """The CDT engine on one chain (T = 16, N2 = 512 volume-fixed, 10 N2 attempts per call). The engines draw
    different random numbers, so each is checked by the Euler relation of a torus triangulation (N2 = 2 N0) and
    the volume window instead of equal outputs. With one engine available there is nothing to race: the area
    records nothing (the default that runs is the one engine, ``ivhl info`` says why)."""
    import jax

    from ivhl_jax.physics import cdt
    from ivhl_jax.physics.cdt import host as cdt_host

    volume = 128 if t.tiny else 512
    attempts = 2 * volume if t.tiny else 10 * volume

    def build(engine: str):
        stepper = cdt.metropolis(cdt.LN2, eps=0.02, target=volume, attempts_per_sweep=attempts, engine=engine)
        keys = jax.random.split(jax.random.key(0), 1)
        state = jax.vmap(lambda k: stepper.init(k, 16, volume // 32, volume))(keys)
        return t.aot(lambda c: jax.vmap(stepper.step)(c), state)

    table = backend.TABLE.get(backend.platform(), backend.TABLE["portable"]).cdt_engine
    engines = ["jax"]
    if cdt_host.available():
        if t.quick and not host_kernels_cached():
            t.note(
                "the host engine's numba kernels are not in numba's disk cache here (compiling them takes "
                "minutes): not a candidate in --quick; run the full `ivhl tune --only cdt` to include it"
            )
        else:
            engines.insert(0, "host")
    else:
        t.note("numba not installed: the host engine is not a candidate (pip install 'ivhl_jax[cpu-kernels]')")
    if backend.platform() == "gpu" and "pallas" in cdt.ENGINES:
        engines.append("pallas")
    if len(engines) < 2:
        t.note(
            f"only the {engines[0]} engine is a candidate here: nothing to race, nothing recorded (the table's "
            "engine stays; a later `ivhl tune --only cdt` with more engines available measures them)"
        )
        return {}
    t.log(
        f"cdt engines {', '.join(engines)} (1 chain, N2 = {volume}; the host engine's first use on a machine "
        "compiles its numba kernels, cached on disk) ..."
    )
    cands = [Candidate(e, {"cdt_engine": e}, functools.partial(build, e), default=(e == table)) for e in engines]
    if t.verify:
        chosen = backend.defaults().cdt_engine
        cands.append(Candidate(f"no_settings_with_cache({chosen})", {}, lambda: build(chosen)))
    entry = t.choose(
        "cdt.engine",
        None,
        cands,
        rounds=5 if t.tiny else 9,
        check=_cdt_check(volume),
        params={"chains": 1, "target_N2": volume, "attempts_per_call": attempts},
    )
    return {"cdt.engine|all": entry}


# ------------------------------------------------------------------------------------------ registration
def _fields_workload(tiny: bool):
    n, m = _fields_sizes(True, tiny)[-1]
    return _superpose, _fields_inputs(n, m)


def _gp_workload(tiny: bool):
    return _gp_run(_gp_sizes(True, tiny)[0], 4, 4)


tunables.register(tunables.Area("fields", tune_fields, order=10, at_size=_fields_at_size, ops=("fields.superpose",)))
tunables.register(tunables.Area("gp", tune_gp, order=20))
tunables.register(tunables.Area("cdt", tune_cdt, order=30))
tunables.register_workload("fields", _fields_workload)
tunables.register_workload("gp", _gp_workload)
