"""ivhl_jax.run.config: TOML + --set overrides, nested overrides keep embedded defaults."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from ivhl_jax import config
from ivhl_jax.run.config import load_config
from ivhl_jax.sims.train_lm import TrainLMConfig, _default_model


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = 4
    dt: float = 0.1
    grid: tuple[int, int] = (8, 8)
    name: str = "a"

    def validate(self):
        if self.dt <= 0:
            raise ValueError(f"dt must be > 0, got {self.dt}")


def test_config_loading(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("n = 7\ngrid = [16, 32]\n")
    cfg = config.load_config(_Cfg, f, ["dt=0.5", "name=xyz"])
    assert cfg == _Cfg(n=7, dt=0.5, grid=(16, 32), name="xyz")
    with pytest.raises(ValueError, match="unknown config key\\(s\\) \\['nn'\\]"):
        config.load_config(_Cfg, None, ["nn=3"])
    with pytest.raises(TypeError, match="config key 'n' must be an integer"):
        config.load_config(_Cfg, None, ["n=1.5"])
    with pytest.raises(ValueError, match="dt must be > 0"):
        config.load_config(_Cfg, None, ["dt=-1"])


def test_lm_nested_override_keeps_embedded_model_defaults():
    cfg = load_config(TrainLMConfig, None, ["model.d_model=256"])
    assert cfg.model == dataclasses.replace(_default_model(), d_model=256)
    assert (cfg.model.n_layers, cfg.model.n_heads, cfg.model.activation, cfg.model.d_ff) == (3, 4, "swiglu", 384)
    assert cfg.steps == TrainLMConfig().steps


def test_lm_nested_toml_table_keeps_embedded_model_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("steps = 100\n\n[model]\nd_model = 256\nn_heads = 8\n")
    cfg = load_config(TrainLMConfig, path, ["model.n_layers=2"])
    assert cfg.model == dataclasses.replace(_default_model(), d_model=256, n_heads=8, n_layers=2)
    assert cfg.steps == 100


@dataclasses.dataclass(frozen=True)
class _Inner:
    a: int = 1
    b: str = "class"


@dataclasses.dataclass(frozen=True)
class _Middle:
    inner: _Inner = dataclasses.field(default_factory=lambda: _Inner(a=5, b="embedded"))
    c: float = 0.5


@dataclasses.dataclass(frozen=True)
class _Outer:
    middle: _Middle = dataclasses.field(default_factory=lambda: _Middle(inner=_Inner(a=7, b="outer"), c=2.0))
    optional: _Inner | None = None


def test_nested_overrides_update_every_level_field_by_field():
    cfg = load_config(_Outer, None, ["middle.inner.a=9"])
    assert cfg.middle == _Middle(inner=_Inner(a=9, b="outer"), c=2.0)
    cfg = load_config(_Outer, None, ["middle.c=3"])
    assert cfg.middle == _Middle(inner=_Inner(a=7, b="outer"), c=3.0)
    # A nested field with no embedded default is built from its class's defaults.
    assert load_config(_Outer, None, ["optional.a=4"]).optional == _Inner(a=4, b="class")
    with pytest.raises(ValueError, match=r"middle\.inner\.zz"):
        load_config(_Outer, None, ["middle.inner.zz=1"])


@dataclasses.dataclass(frozen=True)
class _Typed:
    flag: bool = False
    n: int = 1
    x: float = 0.5
    name: str = "a"
    kind: Literal["gp", "gft"] = "gp"
    pair: tuple[int, int] = (1, 2)
    many: tuple[float, ...] = ()
    either: int | str = 1
    table: dict = dataclasses.field(default_factory=dict)
    inner: _Inner | None = None


@pytest.mark.parametrize(
    "override, error, message",
    [
        ("flag=maybe", TypeError, "config key 'flag' must be true/false, got 'maybe'"),
        ("n=true", TypeError, "config key 'n' must be an integer, got True"),
        ("n=1.5", TypeError, "config key 'n' must be an integer, got 1.5"),
        ("x=false", TypeError, "config key 'x' must be a number, got False"),
        ("x=[1]", TypeError, "config key 'x' must be a number, got [1]"),
        ("name=3", TypeError, "config key 'name' must be a string, got 3"),
        ("kind=bec", ValueError, "config key 'kind' must be one of ['gp', 'gft'], got 'bec'"),
        ("pair=[1, 2, 3]", ValueError, "config key 'pair' must have 2 entries, got 3"),
        ("pair=[1, 2.5]", TypeError, "config key 'pair[1]' must be an integer, got 2.5"),
        ("many=4", TypeError, "config key 'many' must be a list, got 4: say --set many=4,4"),
        ("either=[1]", TypeError, "config key 'either': [1] matches none of int | str"),
        ("table=3", TypeError, "config key 'table' must be a table/dict, got 3"),
        ("inner=3", TypeError, "config key 'inner': 3 matches none of"),
    ],
)
def test_each_type_refuses_a_wrong_value_in_one_line_naming_the_key(override, error, message):
    with pytest.raises(error) as info:
        load_config(_Typed, None, [override])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_each_type_reads_its_values():
    cfg = load_config(
        _Typed,
        None,
        [
            "flag=yes",
            "n=4.0",
            "x=2",
            "name=b",
            "kind=gft",
            "pair=3,4",
            "many=(1.5, 2)",
            "either=word",
            "table={a = 1}",
            "inner.a=5",
        ],
    )
    assert cfg == _Typed(
        flag=True,
        n=4,
        x=2.0,
        name="b",
        kind="gft",
        pair=(3, 4),
        many=(1.5, 2.0),
        either="word",
        table={"a": 1},
        inner=_Inner(a=5, b="class"),
    )
    assert isinstance(cfg.x, float) and isinstance(cfg.many, tuple)


@dataclasses.dataclass(frozen=True)
class _Section:
    a: float = config.option(1.0, "a setting")
    b: bool = config.option(False, "a setting added after a run was written")


@dataclasses.dataclass(frozen=True)
class _WithSection:
    steps: int = config.option(4, "steps")
    section: _Section = config.option(default_factory=_Section, help="a section (--set section.a=...)")


def test_a_section_setting_added_after_a_run_keeps_that_run_resumable():
    """A run saved before ``section.b`` existed resumes when ``b`` holds its default; a changed section key, or one
    the new configuration sets away from its default, differs (named by its section)."""
    defaults = config.config_defaults(_WithSection)
    assert defaults == {"steps": 4, "section": {"a": 1.0, "b": False}}
    old = {"steps": 4, "section": {"a": 1.0}}
    new = config.config_dict(_WithSection())
    assert config.differing_keys(old, new, defaults=defaults) == []
    assert config.differing_keys(
        old, config.config_dict(_WithSection(section=_Section(b=True))), defaults=defaults
    ) == ["section"]
    assert config.differing_keys({"steps": 4, "section": {"a": 2.0}}, new, defaults=defaults) == ["section"]
    assert config.differing_keys(old, new) == ["section"]  # without the defaults a missing key differs
