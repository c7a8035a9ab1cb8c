"""One store convention for every `ivhl sim` and `ivhl train` (each writes a run store, ``<out>/run.zarr``),
checked on the store as ``xarray.open_datatree`` reads it, with no code of ours:

* the CF and ACDD global attributes: ``Conventions`` naming CF and ACDD, ``title``, ``summary``, ``source`` and an
  ISO 8601 ``date_created``;
* every variable (data and coordinates) carries ``units``, a UDUNITS string (:func:`udunits`: ``"1"`` for a pure
  number or a count, else products and powers of SI symbols with prefixes, ``"m^2"``, ``"kg m s-2"``,
  ``"J/m^3"``);
* every dimension is named (no automatic ``<variable>_dim<i>``: variables that share an axis share its name) and
  has a coordinate variable;
* a run of several stages (MERA) writes each into a group that the root announces (attribute ``groups``, numbered
  from 1 as the run's log numbers them): ``xarray.open_datatree`` reads every group and each follows the
  convention, and :func:`ivhl_jax.run.open_run` opens them all (``RunData.groups``).

Each simulation runs at its smallest settings (the slow step: a run each).
"""

from __future__ import annotations

import datetime
import re

import pytest

SI = ("m g s A K mol cd rad sr Hz N Pa J W C V F ohm S Wb T H lm lx Bq Gy Sv eV L min h d degree percent").split()
PREFIXES = ["", "Y", "Z", "E", "P", "T", "G", "M", "k", "h", "da", "d", "c", "m", "u", "µ", "n", "p", "f", "a"]
SYMBOLS = {p + s for p in PREFIXES for s in SI}
_POWER = r"(?:\^?-?\d+)?"


def udunits(unit: str) -> bool:
    """Whether ``unit`` parses as a UDUNITS product of powers of known SI symbols (or is ``"1"``), optionally
    scaled by a leading number (``"1.2e-06 m"``)."""
    if not isinstance(unit, str) or not unit.strip():
        return False
    if unit.strip() == "1":
        return True
    unit = re.sub(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s+(?=\S)", "", unit.strip())
    parts = re.split(r"\s+|\.|\*|/", unit)
    for part in parts:
        if not part or part == "1":
            continue
        m = re.fullmatch(rf"([A-Za-zµ]+){_POWER}", part)
        if not m or m[1] not in SYMBOLS:
            return False
    return True


def test_the_units_check_can_fail():
    for good in ("1", "m", "m^2", "m-2", "kg m s-2", "m^-3", "J/m^3", "rad", "s", "1.2e-06 m", "6.6e-32 J"):
        assert udunits(good), good
    for bad in ("", "steps", "ħω", "(trap length)^(-d/2)", "lattice units", "trap_length", "1.2e-06", "2 ħω"):
        assert not udunits(bad), bad


# command -> arguments for a run of seconds
SIMS = {
    "sim holography": (
        ["--set", "grid=[16, 16]", "--set", "n_sources=8", "--set", "steps=4", "--set", "steps_per_chunk=2"]
    ),
    "sim gft": (
        ["--set", "rank=2", "--set", "grid=8", "--set", "steps=20", "--set", "steps_per_chunk=10"]
        + ["--set", "save_every=5", "--set", "checkpoint_every=10"]
    ),
    "sim bec": (
        ["--set", "grid=16", "--set", "length=12.0", "--set", "ground_steps=20", "--set", "steps=20"]
        + ["--set", "steps_per_chunk=10", "--set", "save_every=10", "--set", "checkpoint_every=10"]
        + ["--set", "snapshot_every=10"]
    ),
    "sim cdt": (
        ["--set", "slices=4", "--set", "volume=64", "--set", "chains=2", "--set", "steps=4"]
        + ["--set", "steps_per_chunk=4", "--set", "save_every=2", "--set", "r_max=16", "--set", "curvature_deltas=2"]
        + ["--set", "curvature_samples=2", "--set", "engine=jax"]
    ),
    "sim mera": (
        ["--set", "chis=[4]", "--set", "chi_mids=[]", "--set", "steps=[4]", "--set", "layers=[1]"]
        + ["--set", "u_delay=3", "--set", "steps_per_chunk=1", "--set", "checkpoint_every=2"]
    ),
    # training runs: a record per step (loss) and one per chunk (test scores), two chunks of two steps
    "train adaptive": ["--set", "dataset=synthetic", "--set", "synthetic_samples=64", "--set", "batch_size=8"]
    + ["--set", "steps=4", "--set", "steps_per_chunk=2", "--no-plots"],
    "train vortex_gru": ["--set", "n_train=8", "--set", "n_test=4", "--set", "length=8", "--set", "grid=8"]
    + ["--set", "hidden=4", "--set", "layers=1", "--set", "batch_size=4", "--set", "steps=4"]
    + ["--set", "steps_per_chunk=2", "--no-plots"],
    "train lm": [a for kv in ("d_model=16", "n_layers=1", "n_heads=2", "d_ff=32") for a in ("--set", f"model.{kv}")]
    + ["--set", "warmup_steps=2", "--set", "model.max_len=16", "--set", "seq_len=16", "--set", "max_bytes=20000"]
    + ["--set", "batch_size=2"]
    + ["--set", "eval_batches=1", "--set", "steps=4", "--set", "steps_per_chunk=2", "--no-plots"],
}


def check_global_attributes(a) -> None:
    assert "CF-" in a.get("Conventions", "") and "ACDD-" in a.get("Conventions", ""), a.get("Conventions")
    for key in ("title", "summary", "source", "date_created"):
        assert isinstance(a.get(key), str) and a[key].strip(), f"global attribute {key!r} missing"
    datetime.datetime.fromisoformat(a["date_created"])


def check_dataset(ds, where: str) -> None:
    """Units, named dimensions and coordinates of one Dataset (a store, or one group of it)."""
    bad_units = {k: v.attrs.get("units") for k, v in ds.variables.items() if not udunits(v.attrs.get("units", ""))}
    assert not bad_units, f"{where}: variables without a UDUNITS unit: {bad_units}"
    auto = sorted(d for d in ds.dims if re.search(r"_dim\d+$", str(d)))
    assert not auto, f"{where}: automatic dimension names (name the axis, shared across variables): {auto}"
    bare = sorted(str(d) for d in ds.dims if d not in ds.coords)
    assert not bare, f"{where}: dimensions without a coordinate variable: {bare}"


@pytest.mark.slow  # a run each: 10-70 s on a busy 2-core host
@pytest.mark.parametrize("name", [pytest.param(c, id=c.replace(" ", "_")) for c in SIMS])
def test_sim_store_follows_the_convention(name, tmp_path):
    import xarray as xr

    from ivhl_jax import cli
    from ivhl_jax.run import open_run

    out = tmp_path / name.replace(" ", "_")
    assert cli.main([*name.split(), *SIMS[name], "--no-progress", "--out", str(out)]) == 0
    tree = xr.open_datatree(out / "run.zarr", engine="zarr", consolidated=None)
    check_global_attributes(tree.attrs)
    announced = tree.attrs.get("groups", [])
    assert sorted(tree.children) == sorted(announced), (list(tree.children), announced)
    nodes = [(node.path, node.to_dataset(inherit=False)) for node in tree.subtree]
    assert any(ds.data_vars for _, ds in nodes), "the store holds no variable"
    for path, ds in nodes:
        if ds.data_vars:
            check_dataset(tree[path].to_dataset(), path)
            check_global_attributes(ds.attrs)
    run = open_run(out)
    assert list(run.groups) == announced and all(g.observations.data_vars for g in run.groups.values())
    if name == "sim mera":  # numbered as the log numbers the stages: "stage 1/1"
        assert announced == ["stage1"]


def test_the_store_names_shared_axes_and_writes_the_global_attributes(tmp_path):
    """The store's side of the convention, on a toy run: an observation's axes after ``time`` get the names
    ``describe(dims=)`` gives them, shared across observations, with the coordinates ``describe(coords=)`` gives;
    the step coordinate counts in "1"; the root holds Conventions and the ACDD attributes (title and summary from
    ``attrs``)."""
    import jax.numpy as jnp
    import numpy as np
    import xarray as xr

    from ivhl_jax.numerics.rollout import Stepper, chunked
    from ivhl_jax.run.runner import run_chunked
    from ivhl_jax.run.store import RunStore

    def step(state, params):
        return state + params

    def observe(state, params):  # (chains, slices) and (chains,) per record
        return {"lengths": state, "volume": state.sum(-1)}

    advance = chunked(Stepper.create(step, jnp.float32(1.0)), 4, save_every=2, observe=observe)
    store = RunStore(tmp_path / "run.zarr", config={"seed": 0}, attrs={"title": "toy", "summary": "a toy run"})
    store.describe(
        time_unit="1",
        units={"lengths": "1", "volume": "1", "chain": "1", "slice": "1"},
        dims={"lengths": ("chain", "slice"), "volume": ("chain",)},
        coords={"chain": np.arange(3), "slice": np.arange(5)},
    )
    run_chunked(advance, jnp.zeros((3, 5), jnp.float32), n_chunks=2, steps_per_chunk=4, progress=False, sink=store)
    store.close()
    ds = xr.open_zarr(tmp_path / "run.zarr")
    assert ds["lengths"].dims == ("time", "chain", "slice") and ds["volume"].dims == ("time", "chain")
    np.testing.assert_array_equal(ds["chain"].values, np.arange(3))
    np.testing.assert_array_equal(ds["volume"].values[-1], np.full(3, 40.0))  # 8 steps of +1 on 5 slices
    assert ds["step"].attrs["units"] == "1" and ds["chain"].attrs["units"] == "1"
    assert ds.attrs["title"] == "toy" and ds.attrs["summary"] == "a toy run" and "CF-" in ds.attrs["Conventions"]
    assert ds.attrs["source"].startswith("ivhl_jax") and ds.attrs["date_created"]
    from ivhl_jax.run import open_run
    from ivhl_jax.run.store import StoreError

    assert open_run(tmp_path).groups == {}  # a store of one stage announces no group
    with pytest.raises(StoreError, match="holds no group 'stage1'"):
        open_run(tmp_path, group="stage1")


def test_records_at_two_rates_go_on_two_dimensions(tmp_path):
    """A training run records a loss per step and a test score per chunk: the store keeps them apart, the first
    over ``time`` (coordinate ``step``), the second over ``chunk_time`` (coordinate ``chunk_step``, the chunk's
    last step), each cut to what was committed; ``open_run`` and ``RunStore.read`` give both; a third rate is
    refused in one line naming the observation."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import xarray as xr

    from ivhl_jax.run import open_run
    from ivhl_jax.run.runner import run_chunked
    from ivhl_jax.run.store import RunStore

    def advance(s):  # 4 steps per chunk: a "loss" each step, a "score" at the chunk's end
        losses = s + jnp.arange(1.0, 5.0)
        return s + 4.0, {"loss": losses, "score": (s + 4.0)[None]}

    store = RunStore(tmp_path / "run.zarr", config={"seed": 0})
    store.describe(units={"loss": "1", "score": "1"})
    run_chunked(jax.jit(advance), jnp.float32(0.0), n_chunks=3, steps_per_chunk=4, progress=False, sink=store)
    like = jax.eval_shape(advance, jnp.float32(0.0))[1]
    read = store.read(like=like)
    store.close()
    np.testing.assert_array_equal(read["loss"], np.arange(1.0, 13.0))
    np.testing.assert_array_equal(read["score"], [4.0, 8.0, 12.0])
    ds = xr.open_zarr(tmp_path / "run.zarr")
    assert ds["loss"].dims == ("time",) and ds["score"].dims == ("chunk_time",)
    np.testing.assert_array_equal(ds["step"].values, np.arange(1, 13))
    np.testing.assert_array_equal(ds["chunk_step"].values, [4, 8, 12])
    assert all(udunits(v.attrs.get("units", "")) for v in ds.variables.values())
    obs = open_run(tmp_path).observations
    assert obs.sizes == {"time": 12, "chunk_time": 3} and float(obs["score"][-1]) == 12.0

    def three_rates(s):
        return s, {"loss": jnp.zeros(4), "score": jnp.zeros(1), "half": jnp.zeros(2)}

    other = RunStore(tmp_path / "b" / "run.zarr", config={"seed": 0})
    with pytest.raises(ValueError, match="observation 'half' holds 2 records per chunk"):
        run_chunked(jax.jit(three_rates), jnp.float32(0.0), n_chunks=1, steps_per_chunk=4, progress=False, sink=other)
    other.release()


@pytest.mark.slow  # a bec run (10-40 s on a busy 2-core host)
def test_bec_trap_units_are_si_units_when_a_species_is_given(tmp_path):
    """With ``species`` and ``omega_hz`` the store's trap-unit quantities carry scaled SI units: ħω in J, 1/ω in s,
    the trap length √(ħ/(mω)) in m (checked against scipy's CODATA constants and the ⁸⁷Rb mass), the density in
    m^-2; UDUNITS strings like every unit."""
    import math

    import scipy.constants as sc
    import xarray as xr

    from ivhl_jax import cli

    out = tmp_path / "bec"
    argv = ["sim", "bec", *SIMS["sim bec"], "--set", "species=87Rb", "--set", "omega_hz=100"]
    argv += ["--set", "snapshot_fields=density_phase"]
    assert cli.main([*argv, "--no-progress", "--out", str(out)]) == 0
    ds = xr.open_zarr(out / "run.zarr")
    check_dataset(ds, "bec with a species")

    def scale(var: str, si: str) -> float:
        factor, unit = ds[var].attrs["units"].split(" ", 1)
        assert unit == si, (var, ds[var].attrs["units"])
        return float(factor)

    omega = 2 * math.pi * 100.0
    a_ho = math.sqrt(sc.hbar / (86.909180531 * sc.physical_constants["atomic mass constant"][0] * omega))
    assert math.isclose(scale("energy_total", "J"), sc.hbar * omega, rel_tol=1e-8)
    assert math.isclose(scale("time", "s"), 1 / omega, rel_tol=1e-8)
    assert math.isclose(scale("x", "m"), a_ho, rel_tol=1e-8)
    assert math.isclose(scale("density", "m-2"), a_ho**-2, rel_tol=1e-8)
    assert "ħω" in ds["energy_total"].attrs["long_name"] and ds["phase"].attrs["units"] == "rad"
