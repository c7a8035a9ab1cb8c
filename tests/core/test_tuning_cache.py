"""The per-machine tuning cache (ivhl_jax.core.tuning_cache) and how backend.defaults() reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from ivhl_jax.core import backend, host, tuning_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = "fields.superpose"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache folder, read in the default mode (the suite itself runs frozen)."""
    monkeypatch.setenv("IVHL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("IVHL_TUNING", "cache")
    tuning_cache.reset()
    yield tmp_path
    tuning_cache.reset()
    tuning_cache.set_auto_tuner(None)


_CDT_JAX = {"cdt.engine|all": {"op": "cdt.engine", "bucket": "all", "settings": {"cdt_engine": "jax"}}}


def _entry(op, size, **settings):
    return {f"{op}|{tuning_cache.bucket(size)}": {"op": op, "bucket": tuning_cache.bucket(size), "settings": settings}}


def test_round_trip_and_size_buckets(cache):
    table = backend.TABLE["cpu"]
    path = tuning_cache.record("cpu", _entry(FIELDS, 1 << 20, fields_pair_budget=1 << 20, fields_serial_pairs=0))
    assert os.path.dirname(path) == os.path.join(str(cache), "tuning")
    doc = json.load(open(path))
    assert doc["fingerprint"] == tuning_cache.fingerprint("cpu") and doc["format"] == tuning_cache.FORMAT
    row = backend.defaults("cpu", op=FIELDS, size=(1 << 20) + 5)
    assert (row.fields_pair_budget, row.fields_serial_pairs) == (1 << 20, 0)
    # a bucket a factor 4 away uses the nearest measurement; one 2**10 away and a call without a size, the table
    assert backend.defaults("cpu", op=FIELDS, size=1 << 22).fields_pair_budget == 1 << 20
    assert backend.defaults("cpu", op=FIELDS, size=1 << 30).fields_pair_budget == table.fields_pair_budget
    assert backend.defaults("cpu").fields_pair_budget == table.fields_pair_budget
    # a second writer merges, never replaces
    tuning_cache.record("cpu", _CDT_JAX)
    assert set(json.load(open(path))["entries"]) == {f"{FIELDS}|2^20", "cdt.engine|all"}
    assert backend.defaults("cpu").cdt_engine == "jax"  # size-independent entries apply to every call


def test_sources_reported(cache):
    tuning_cache.record("cpu", _entry(FIELDS, 1 << 20, fields_pair_budget=1 << 20))
    tuning_cache.record("cpu", _CDT_JAX)
    rows = {r["setting"]: r for r in backend.describe("cpu")}
    assert rows["cdt_engine"]["value"] == "'jax'" and rows["cdt_engine"]["source"].startswith("tuning cache: measured")
    assert tuning_cache.cache_path("cpu") in rows["cdt_engine"]["source"]
    assert rows[f"fields_pair_budget@{FIELDS}[2^20]"]["value"] == repr(1 << 20)
    assert rows["host_fft"]["source"].startswith("table: bench/results/")
    avx512 = "avx512f" in host.facts().cpu_flags
    want = "not measured on this kind of machine" if avx512 else "the tuner's flags need AVX-512"
    assert want in rows["xla_flags"]["source"]
    with backend.override(cdt_engine="host"):
        assert {r["setting"]: r for r in backend.describe("cpu")}["cdt_engine"]["source"] == "override()"
    gpu = {r["setting"]: r for r in backend.describe("gpu")}
    assert gpu["fields_method"]["source"].startswith("table, not measured on this kind of machine")
    assert (
        "not measured on this kind of machine"
        in {r["setting"]: r for r in backend.describe("npu")}["cdt_engine"]["source"]
    )


def test_frozen_uses_the_table_alone(cache, monkeypatch):
    tuning_cache.record("cpu", _CDT_JAX)
    monkeypatch.setenv("IVHL_TUNING", "frozen")
    assert backend.defaults("cpu") == backend.TABLE["cpu"]
    assert tuning_cache.load("cpu") is None


def test_foreign_file_ignored_with_one_warning(cache):
    path = tuning_cache.record("cpu", _entry(FIELDS, 1 << 20, fields_pair_budget=1 << 20))
    doc = json.load(open(path))
    doc["fingerprint"]["versions"]["jax"] = "0.0.1"
    with open(path, "w") as f:
        json.dump(doc, f)
    tuning_cache.reset()
    with pytest.warns(tuning_cache.TuningCacheWarning, match=r"jax 0\.0\.1") as rec:
        assert backend.defaults("cpu", op=FIELDS, size=1 << 20) == backend.TABLE["cpu"]
        backend.defaults("cpu", op=FIELDS, size=1 << 20)
        backend.describe("cpu")
    assert len([w for w in rec if issubclass(w.category, tuning_cache.TuningCacheWarning)]) == 1
    assert path in str(rec[0].message)


def test_cache_of_another_jax_version_named_once(cache):
    """The file of this machine under other versions has another name: it is found and named, the table used."""
    fp = tuning_cache.fingerprint("cpu")
    fp["versions"] = {**fp["versions"], "jax": "0.0.1"}
    other = os.path.join(tuning_cache.cache_dir(), "cpu-0123456789abcdef.json")
    os.makedirs(os.path.dirname(other))
    with open(other, "w") as f:
        json.dump({"format": tuning_cache.FORMAT, "fingerprint": fp, "entries": {}}, f)
    with pytest.warns(tuning_cache.TuningCacheWarning, match=r"0123456789abcdef\.json was measured with jax 0\.0\.1"):
        assert backend.defaults("cpu") == backend.TABLE["cpu"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.defaults("cpu")


def test_corrupt_file_ignored_with_one_warning(cache):
    path = tuning_cache.cache_path("cpu")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write('{"format": "ivhl_jax.tuning/1", "entr')
    with pytest.warns(tuning_cache.TuningCacheWarning, match="corrupt") as rec:
        assert backend.defaults("cpu") == backend.TABLE["cpu"]
        backend.defaults("cpu")
    assert len(rec) == 1 and path in str(rec[0].message)
    # ... and `ivhl tune` replaces it with a good one
    tuning_cache.record("cpu", _entry(FIELDS, 1 << 20, fields_pair_budget=1 << 20))
    assert backend.defaults("cpu", op=FIELDS, size=1 << 20).fields_pair_budget == 1 << 20


_WRITER = """
import sys
from ivhl_jax.core import tuning_cache
who = sys.argv[1]
for i in range(15):
    tuning_cache.record("cpu", {f"test.{who}|2^{i}": {"op": f"test.{who}", "bucket": f"2^{i}", "settings": {"i": i}}})
"""


def test_two_processes_writing_at_once_keep_every_entry(cache):
    env = {**os.environ, "IVHL_CACHE_DIR": str(cache), "IVHL_TUNING": "cache"}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, who], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        for who in ("a", "b")
    ]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    doc = json.load(open(tuning_cache.cache_path("cpu")))
    assert {k for k in doc["entries"]} == {f"test.{w}|2^{i}" for w in "ab" for i in range(15)}
    assert not [f for f in os.listdir(tuning_cache.cache_dir()) if f.endswith(".tmp")]


def test_auto_mode_tunes_a_new_bucket_once(cache, monkeypatch, capsys):
    calls = []

    def fake_tuner(op, size, platform):
        calls.append((op, size))
        tuning_cache.record(platform, _entry(op, size, fields_pair_budget=4096))

    tuning_cache.set_auto_tuner(fake_tuner)
    table = backend.TABLE["cpu"].fields_pair_budget
    assert backend.defaults("cpu", op=FIELDS, size=1 << 12).fields_pair_budget == table
    assert calls == []  # off by default
    monkeypatch.setenv("IVHL_TUNING", "auto")
    assert backend.defaults("cpu", op=FIELDS, size=1 << 12).fields_pair_budget == 4096
    assert backend.defaults("cpu", op=FIELDS, size=(1 << 12) + 1).fields_pair_budget == 4096
    assert calls == [(FIELDS, 1 << 12)]
    assert "IVHL_TUNING=auto: tuning fields.superpose" in capsys.readouterr().err


def test_unknown_mode_warns_and_reads_the_cache(cache, monkeypatch):
    monkeypatch.setenv("IVHL_TUNING", "sometimes")
    with pytest.warns(tuning_cache.TuningCacheWarning, match="IVHL_TUNING='sometimes'"):
        assert tuning_cache.mode() == "cache"


def test_unwritable_folder_is_named(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("IVHL_CACHE_DIR", str(blocker))
    tuning_cache.reset()
    with pytest.raises(OSError, match="tuning cache folder .*a_file"):
        tuning_cache.record("cpu", _entry(FIELDS, 1 << 20, fields_pair_budget=1 << 20))
    tuning_cache.reset()


_FLAGS = "import os, ivhl_jax; print(os.environ.get('XLA_FLAGS', ''))"
_APPLY = "import os, ivhl_jax.run.tune as t; t.apply(); print(os.environ.get('XLA_FLAGS', ''))"
_VECTOR = "--xla_cpu_prefer_vector_width=512"


def _record_flags(flags: str) -> str:
    return tuning_cache.record(
        "cpu", {"xla.flags|all": {"op": "xla.flags", "bucket": "all", "settings": {"xla_flags": flags}}}
    )


def _python(code, env, *args):
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
    )


def test_measured_xla_flags_applied_by_apply_not_by_import(cache):
    _record_flags(_VECTOR)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(IVHL_CACHE_DIR=str(cache), IVHL_TUNING="cache")
    out = _python(_FLAGS, env)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stderr  # import ivhl_jax sets nothing
    out = _python(_APPLY, env)
    assert out.stdout.split() == [_VECTOR], out.stderr
    env["IVHL_TUNING"] = "frozen"
    out = _python(_APPLY, env)
    assert out.stdout.strip() == "", out.stderr
    env.update(IVHL_TUNING="cache", XLA_FLAGS="--xla_cpu_prefer_vector_width=256")  # the user's own value wins
    out = _python(_APPLY, env)
    assert out.stdout.split() == ["--xla_cpu_prefer_vector_width=256"], out.stderr


def test_apply_after_the_backend_started_warns_and_sets_nothing(cache, monkeypatch):
    import jax.numpy as jnp

    from ivhl_jax.run import tune

    _record_flags(_VECTOR)
    jnp.zeros(1).block_until_ready()  # the backend runs
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    with pytest.warns(tuning_cache.TuningCacheWarning, match="not applied: a JAX backend has started"):
        done = tune.apply()
    assert done["applied"] is False and "XLA_FLAGS" not in os.environ
    assert tuning_cache.applied_xla_flags()["applied"] is False


def test_only_the_tuners_own_flags_are_applied(cache):
    """A cache file is data: a flag `ivhl tune` never measures (one that writes files, one XLA does not know and
    that would abort every process) is ignored with one warning naming the file."""
    path = _record_flags(f"--xla_dump_to={cache}/dump {_VECTOR} --xla_no_such_flag=1")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(IVHL_CACHE_DIR=str(cache), IVHL_TUNING="cache")
    code = _APPLY + "; import jax.numpy as jnp; jnp.ones(3).sum().block_until_ready()"
    out = _python(code, env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [_VECTOR]
    warned = [line for line in out.stderr.splitlines() if "never measures" in line]
    assert len(warned) == 1 and path in warned[0] and "--xla_dump_to" in warned[0]
    assert not os.path.exists(cache / "dump")


def test_run_folder_records_the_settings_in_force(cache, tmp_path):
    import dataclasses

    from ivhl_jax.run.config import prepare_run_dir
    from ivhl_jax.run.lock import release_run_dir

    @dataclasses.dataclass
    class Cfg:
        steps: int = 3

    tuning_cache.record("cpu", _CDT_JAX)
    out = tmp_path / "run"
    prepare_run_dir(out, Cfg(), resume=False)
    release_run_dir(out)
    doc = json.load(open(out / "settings.json"))
    rows = {r["setting"]: r for r in doc["settings"]}
    assert doc["tuning_mode"] == "cache" and rows["cdt_engine"]["source"].startswith("tuning cache")
    assert rows["fields_chunking"]["source"].startswith("table")


@pytest.mark.parametrize(
    "text, why",
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper"),  # Python's JSON parser would recurse past its limit
        ('{"format": "ivhl_jax.tuning/1", "fingerprint": {}, "entries": {"x|all": {"settings": 5}}}', "settings"),
        ('{"format": "ivhl_jax.tuning/1", "fingerprint": {}, "entries": {"x|all": {"settings": {"a": [1]}}}}', "'a'"),
        ('{"format": "ivhl_jax.tuning/1", "fingerprint": [], "entries": {}}', "must be objects"),
        ("\xff\xfe junk", "corrupt"),
    ],
)
def test_a_hostile_cache_is_ignored_with_one_warning_naming_it(cache, text, why):
    path = tuning_cache.cache_path("cpu")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
    with pytest.warns(tuning_cache.TuningCacheWarning, match=why) as rec:
        assert backend.defaults("cpu") == backend.TABLE["cpu"]
        assert backend.describe("cpu")[0]["source"].startswith("table")
    assert len([w for w in rec if issubclass(w.category, tuning_cache.TuningCacheWarning)]) == 1
    assert path in str(rec[0].message)


def test_a_hostile_cache_kills_no_command(cache):
    """`ivhl --version` never reads the cache; `ivhl info` reads it and says in one line that it is ignored."""
    path = tuning_cache.cache_path("cpu")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("[" * 100_000)
    env = {**os.environ, "IVHL_CACHE_DIR": str(cache), "IVHL_TUNING": "cache"}
    for args in (["--version"], ["info"]):
        out = _python("import sys, ivhl_jax.cli; sys.exit(ivhl_jax.cli.main(sys.argv[1:]))", env, *args)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "Traceback" not in out.stderr and "RecursionError" not in out.stderr
    ignored = [line for line in out.stderr.splitlines() if path in line]
    assert len(ignored) == 1 and "ignored" in ignored[0], out.stderr


def test_an_unknown_tuning_mode_is_one_line_on_the_command_line(cache):
    env = {**os.environ, "IVHL_CACHE_DIR": str(cache), "IVHL_TUNING": "bogus"}
    out = _python("import sys, ivhl_jax.cli; sys.exit(ivhl_jax.cli.main(sys.argv[1:]))", env, "info")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == ["TuningCacheWarning: IVHL_TUNING='bogus' is not one of ['cache', 'frozen', 'auto']; using 'cache'"]


def test_a_race_of_one_candidate_is_not_a_measurement(cache):
    """A cache entry that timed one engine (the JAX engine alone, numba missing when it was written) does not pin
    that engine: the table's choice applies, with one warning."""
    one = {"jax": {"settings": {"cdt_engine": "jax"}, "median_s": 0.1}, "host": {"error": "ImportError: numba"}}
    entry = {"op": "cdt.engine", "bucket": "all", "settings": {"cdt_engine": "jax"}, "candidates": one}
    tuning_cache.record("cpu", {"cdt.engine|all": entry})
    with pytest.warns(tuning_cache.TuningCacheWarning, match=r"race of 1 candidate\(s\) \(jax\)"):
        assert backend.defaults("cpu").cdt_engine == backend.TABLE["cpu"].cdt_engine
    two = {**one, "host": {"settings": {"cdt_engine": "host"}, "median_s": 0.2}}
    tuning_cache.record("cpu", {"cdt.engine|all": {**entry, "candidates": two}})
    assert backend.defaults("cpu").cdt_engine == "jax"


def test_the_tuner_refuses_a_race_of_one():
    from ivhl_jax.core.tunables import Candidate
    from ivhl_jax.run import tune

    def build():
        import jax
        import jax.numpy as jnp

        return jax.jit(lambda x: x + 1).lower(jnp.ones(3)).compile(), (jnp.ones(3),)

    with pytest.raises(RuntimeError, match="a race needs two; nothing recorded"):
        tune.choose("x", None, [Candidate("only", {}, build, default=True)], rounds=1, limits={})


def test_an_entry_measured_without_a_package_installed_since_is_stale(cache):
    """A race that left a candidate out for a missing package (the host FFT without ducc0) no longer stands once
    the package is installed: the table applies, with one warning, until `ivhl tune` measures every candidate."""
    timed = {"a": {"median_s": 0.1}, "b": {"median_s": 0.2}}
    entry = {"op": "cdt.engine", "bucket": "all", "settings": {"cdt_engine": "jax"}, "candidates": timed}
    tuning_cache.record("cpu", {"cdt.engine|all": {**entry, "unavailable": {"c": "no_such_package_ivhl"}}})
    assert backend.defaults("cpu").cdt_engine == "jax"  # the package is still missing: the measurement stands
    tuning_cache.record("cpu", {"cdt.engine|all": {**entry, "unavailable": {"c": "json"}}})  # "installed now"
    with pytest.warns(tuning_cache.TuningCacheWarning, match="measured without json, installed now"):
        assert backend.defaults("cpu").cdt_engine == backend.TABLE["cpu"].cdt_engine


def test_apply_arms_tuning_on_the_fly_under_auto(cache, monkeypatch, capsys):
    """Under IVHL_TUNING=auto, apply() (not the import) arms the tuner: a miss tunes the op through the area that
    registered it, once."""
    from ivhl_jax.core import tunables
    from ivhl_jax.run import tune

    calls = []

    def at_size(t, op, size):
        calls.append((op, size))
        return _entry(op, size, fields_pair_budget=4096)

    area = tunables.Area("test", lambda t: {}, at_size=at_size, ops=("test.op",))
    monkeypatch.setitem(tunables._AREAS, "test", area)
    monkeypatch.setenv("IVHL_TUNE_TINY", "1")  # the limits it measures first: small
    monkeypatch.setenv("IVHL_TUNING", "auto")
    backend.defaults("cpu", op="test.op", size=1 << 13)
    assert calls == []  # not armed: importing armed nothing
    tune.apply()
    assert "IVHL_TUNING=auto" in capsys.readouterr().err
    assert backend.defaults("cpu", op="test.op", size=1 << 13).fields_pair_budget == 4096
    assert calls == [("test.op", 1 << 13)]
