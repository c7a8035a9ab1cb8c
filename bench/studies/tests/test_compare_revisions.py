"""Smoke test of bench/studies/compare_revisions.py: the two-worker, interleaved machinery on tiny sizes.

Both workers load this tree (``--old-root`` = the repository), so no git worktree of another revision is
needed; the outputs must then agree exactly and every record must be complete.
"""

import os

import pytest

from bench.studies import compare_revisions

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.slow  # two JAX worker processes (import + compile): 40-90 s on a loaded 2-core host
def test_compare_revisions_smoke(tmp_path):
    out = tmp_path / "compare.json"
    doc = compare_revisions.main(
        [
            "--quick",
            "--rounds",
            "2",
            "--first-rounds",
            "1",
            "--target-s",
            "0.01",
            "--workloads",
            "gp_step,tn_contract",
            "--old-root",
            REPO,
            "--export",
            str(out),
        ]
    )
    assert out.exists()
    assert set(doc["summary"]) == {"gp_step", "tn_contract"}
    for name, rec in doc["workloads"].items():
        assert rec["check"]["allclose"] and rec["check"]["max_abs_diff"] == 0.0, name
        assert len(rec["ratios"]) == 2 and all(r > 0 for r in rec["ratios"]), name
        assert rec["first_call_s"]["old"] and rec["first_call_s"]["new"], name
    assert doc["workers"]["old"]["ivhl_jax"] == doc["workers"]["new"]["ivhl_jax"]
    assert "uncommitted_start" in doc["runs"][-1]


def test_compare_revisions_says_what_to_compare_with():
    with pytest.raises(SystemExit):
        compare_revisions.main(["--quick"])
    with pytest.raises(SystemExit):
        compare_revisions.main(["--quick", "--old-root", REPO, "--workloads", "no_such_op"])
