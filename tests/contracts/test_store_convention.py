"""One store convention for every `ivhl sim` that writes a run store (``<out>/run.zarr``), checked on the store as
``xarray.open_zarr`` reads it, with no code of ours:

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
import importlib
import re

import pytest

SI = ("m g s A K mol cd rad sr Hz N Pa J W C V F ohm S Wb T H lm lx Bq Gy Sv eV L min h d degree percent").split()
PREFIXES = ["", "Y", "Z", "E", "P", "T", "G", "M", "k", "h", "da", "d", "c", "m", "u", "µ", "n", "p", "f", "a"]
SYMBOLS = {p + s for p in PREFIXES for s in SI}
_POWER = r"(?:\^?-?\d+)?"


def udunits(unit: str) -> bool:
    """Whether ``unit`` parses as a UDUNITS product of powers of known SI symbols (or is ``"1"``)."""
    if not isinstance(unit, str) or not unit.strip():
        return False
    if unit.strip() == "1":
        return True
    parts = re.split(r"\s+|\.|\*|/", unit.strip())
    for part in parts:
        if not part or part == "1":
            continue
        m = re.fullmatch(rf"([A-Za-zµ]+){_POWER}", part)
        if not m or m[1] not in SYMBOLS:
            return False
    return True


def test_the_units_check_can_fail():
    for good in ("1", "m", "m^2", "m-2", "kg m s-2", "m^-3", "J/m^3", "rad", "s"):
        assert udunits(good), good
    for bad in ("", "steps", "ħω", "(trap length)^(-d/2)", "lattice units", "trap_length"):
        assert not udunits(bad), bad


# sim -> arguments for a run of seconds
SIMS = {
    "holography": (
        ["--set", "grid=[16, 16]", "--set", "n_sources=8", "--set", "steps=4", "--set", "steps_per_chunk=2"]
    ),
    "gft": (
        ["--set", "rank=2", "--set", "grid=8", "--set", "steps=20", "--set", "steps_per_chunk=10"]
        + ["--set", "save_every=5", "--set", "checkpoint_every=10"]
    ),
    "bec": (
        ["--set", "grid=16", "--set", "length=12.0", "--set", "ground_steps=20", "--set", "steps=20"]
        + ["--set", "steps_per_chunk=10", "--set", "save_every=10", "--set", "checkpoint_every=10"]
        + ["--set", "snapshot_every=10"]
    ),
    "cdt": (
        ["--set", "slices=4", "--set", "volume=64", "--set", "chains=2", "--set", "steps=4"]
        + ["--set", "steps_per_chunk=4", "--set", "save_every=2", "--set", "r_max=16", "--set", "curvature_deltas=2"]
        + ["--set", "curvature_samples=2", "--set", "engine=jax"]
    ),
    "mera": (
        ["--set", "chis=[4]", "--set", "chi_mids=[]", "--set", "steps=[4]", "--set", "layers=[1]"]
        + ["--set", "u_delay=3", "--set", "steps_per_chunk=1", "--set", "checkpoint_every=2"]
    ),
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
@pytest.mark.parametrize("name", list(SIMS))
def test_sim_store_follows_the_convention(name, tmp_path):
    import xarray as xr

    from ivhl_jax.run import open_run

    module = importlib.import_module(f"ivhl_jax.sims.{name}")
    out = tmp_path / name
    assert module.main([*SIMS[name], "--no-progress", "--out", str(out)]) == 0
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
    if name == "mera":  # numbered as the log numbers the stages: "stage 1/1"
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
