"""The (3,2) check experiment on the 2+1D CDT reference (bench/peer_cdt3_fan.py).

The reference (JorenB/3d-cdt) is not vendored: the run test skips unless ``IVHL_3DCDT_SRC`` names its sources.
"""

import os

import pytest

from ivhl_jax.bench import peer_cdt3, peer_cdt3_fan

SRC = os.environ.get(peer_cdt3.ENV_VAR)


def test_another_version_of_the_reference_is_refused(tmp_path):
    src = tmp_path / "src"
    for name in peer_cdt3.NEEDED:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("// not the reference\n")
    with pytest.raises(ValueError, match="another version"):
        peer_cdt3_fan.patched_source(src, tmp_path / "out", strict=True)


@pytest.mark.slow
@pytest.mark.skipif(not SRC, reason=f"set {peer_cdt3.ENV_VAR} to a JorenB/3d-cdt checkout to run it")
def test_strict_copy_never_holds_a_duplicate_triangle(tmp_path):
    spec = peer_cdt3.RunSpec(target=300, n_slices=8, thermal=10, sweeps=20, ksteps=2, epsilon=0.01)
    out = {}
    for variant in ("plain", "strict"):
        src = peer_cdt3_fan.patched_source(SRC, tmp_path / variant, variant == "strict")
        out[variant] = peer_cdt3_fan.run_variant(src, spec, 20_000)["fan32"]
    # the census sees every measured state (after each thermal and measurement sweep) and the 10 + 10 states the
    # reference exports; our rule leaves no duplicate
    for rec in out.values():
        assert rec["census_states"] == spec.thermal + spec.sweeps + 20
        assert 0 <= rec["accepted_32_duplicating_a_triangle"] <= rec["accepted_32"]
        assert rec["census_duplicate_tetrahedra_total"] == 0
    strict = out["strict"]
    assert strict["accepted_32"] > 0
    assert strict["accepted_32_duplicating_a_triangle"] == 0
    assert strict["census_states_with_duplicate_triangle"] == strict["census_duplicate_triangles_total"] == 0
