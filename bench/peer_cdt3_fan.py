"""The reference's (3,2) manifold check, measured: JorenB/3d-cdt as is against the same code with our full check.

The (3,2) move removes the timelike edge ``(v0, v1)`` (base vertex ``v0`` of a (3,1) or of the top of a (1,3),
``v1`` its apex) held by exactly three tetrahedra and creates the timelike triangle ``(v2, v4, v3)`` (``v2, v4``
the other two base vertices, ``v3`` the fourth vertex of the two (2,2)s). The reference (``universe.cpp``,
``move32u``/``move32d``) refuses the move only when one of five tetrahedra next to the three would duplicate a
new tetrahedron; among them only the first tetrahedron of the fan around the spatial edge ``(v2, v4)`` is
looked at. Our engine (:mod:`ivhl_jax.physics.cdt.d3_host`, ``fan_has``) walks the whole fan: the move is
refused when a triangle with the vertices ``(v2, v4, v3)`` exists anywhere, else the result has two distinct
triangles on the same three vertices, which is no simplicial complex.

This module makes two copies of the reference's sources (``--peer-src``) in ``--work`` with one inserted
block each (nothing of the reference is vendored): a fan walk after the reference's five checks in both (3,2)
functions that counts the accepted (3,2)s whose triangle already existed, and a census of every measured state
(vertex triples that label more than one triangle, vertex quadruples that label more than one tetrahedron).
In the ``strict`` copy the walk also refuses the move (our rule); the ``plain`` copy keeps the reference's
rule. Both run as :mod:`ivhl_jax.bench.peer_cdt3` runs the reference (its driver, config, tuning of ``k3``,
measurements at N(3,1) = target), analysed by :func:`ivhl_jax.bench.peer_cdt3.analyse`.

Command line (writes ``bench/results/cdt3_reference_fan32.json``)::

    python -m ivhl_jax.bench.peer_cdt3_fan --peer-src DIR --k0 5.0 --target 500 --slices 16 \\
        --thermal 400 --sweeps 4000 --ksteps 5 --seeds 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ivhl_jax.bench import peer_cdt3

STATS_ENV = "N22_STATS"
# The inserted helpers: a walk of the fan around the spatial edge (e1, e2) from ``prev`` into ``cur``, counters
# written (one JSON line) to $N22_STATS at exit, and the census of duplicate triangles and tetrahedra.
_HELPER = r"""
#define STRICT32 @STRICT@
#include <map>
#include <cstdlib>
#include <algorithm>
namespace fan32 {
long dup32 = 0, acc32 = 0, states = 0, dup_states = 0, dup_tri = 0, dup_tet = 0;
bool fanHas(Tetra::Label prev, Tetra::Label cur, Vertex::Label e1, Vertex::Label e2, Vertex::Label w) {
	for (int it = 0; it < 1000000; it++) {
		if (cur->hasVertex(w)) return true;
		if (!cur->is22()) return false;
		int wa = -1;
		for (int i = 0; i < 4; i++) {
			int x = cur->vs[i];
			if (x != (int)e1 && x != (int)e2 && prev->hasVertex(cur->vs[i])) wa = x;
		}
		Tetra::Label nxt = cur->getTetraOpposite(wa);
		prev = cur;
		cur = nxt;
	}
	return true;
}
struct Report {
	~Report() {
		const char* p = std::getenv("@ENV@");
		if (!p) return;
		FILE* f = fopen(p, "a");
		fprintf(f, "{\"accepted_32\": %ld, \"accepted_32_duplicating_a_triangle\": %ld, \"census_states\": %ld, "
			"\"census_states_with_duplicate_triangle\": %ld, \"census_duplicate_triangles_total\": %ld, "
			"\"census_duplicate_tetrahedra_total\": %ld}\n", acc32, dup32, states, dup_states, dup_tri, dup_tet);
		fclose(f);
	}
} report;
void census() {
	std::map<std::array<int, 3>, int> tri;
	std::map<std::array<int, 4>, int> tet;
	for (auto t : Universe::tetrasAll) {
		std::array<int, 4> v = {t->vs[0], t->vs[1], t->vs[2], t->vs[3]};
		std::sort(v.begin(), v.end());
		tet[v]++;
		for (int i = 0; i < 4; i++) {
			std::array<int, 3> f;
			int k = 0;
			for (int j = 0; j < 4; j++) if (j != i) f[k++] = v[j];
			tri[f]++;
		}
	}
	long dt = 0, dtt = 0;
	for (auto& kv : tri) if (kv.second > 2) dt += kv.second / 2 - 1;  // a triangle is a face of 2 tetrahedra
	for (auto& kv : tet) if (kv.second > 1) dtt += kv.second - 1;
	states++;
	if (dt > 0) dup_states++;
	dup_tri += dt;
	dup_tet += dtt;
}
}  // namespace fan32
"""
_CHECK = "\tif (ta134->hasVertex(v2)) return false;\n\n\tauto {new} = Tetra::create();\n"
_WALK = (
    "\tif (fan32::fanHas({start}, ta124, v2, v4, v3)) {{ if (STRICT32) return false; fan32::dup32++; }}\n"
    "\tfan32::acc32++;\n"
)


def patched_source(src_dir: str | os.PathLike | None, out_dir: Path, strict: bool) -> Path:
    """A copy of the reference's sources in ``out_dir`` with the fan walk and census inserted in ``universe.cpp``
    (``strict``: the walk refuses the (3,2) as our engine does). ValueError when the reference's text differs
    from the version this was written for (an anchor is missing or not unique)."""
    src = peer_cdt3.peer_src_dir(src_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(src, out_dir, ignore=shutil.ignore_patterns("build-ivhl", ".git"))
    path = out_dir / "universe.cpp"
    text = path.read_text()
    edits = [
        ('#include "universe.hpp"\n', _HELPER.replace("@STRICT@", str(int(strict))).replace("@ENV@", STATS_ENV)),
        (_CHECK.format(new="tn31"), _WALK.format(start="t31")),  # move32u
        (_CHECK.format(new="tn13"), _WALK.format(start="t13")),  # move32d
        ("void Universe::updateGeometry() {\n", "\tfan32::census();\n"),  # before every measurement
    ]
    for anchor, insert in edits:
        if text.count(anchor) != 1:
            raise ValueError(f"the reference's universe.cpp does not hold exactly one {anchor!r}: another version")
        if anchor.startswith("\tif (ta134"):  # insert after the five checks, before the new tetrahedra
            head = "\tif (ta134->hasVertex(v2)) return false;\n\n"
            text = text.replace(anchor, head + insert + "\n" + anchor[len(head) :])
        else:
            text = text.replace(anchor, anchor + insert)
    path.write_text(text)
    return out_dir


def run_variant(src: Path, spec: peer_cdt3.RunSpec, timed_attempts: int) -> dict[str, Any]:
    """Build and run one patched copy; its record's summary, the analysis and the fan counters."""
    binary = peer_cdt3.build_peer(src)
    with tempfile.TemporaryDirectory(prefix="fan32-") as tmp:
        stats = Path(tmp) / "stats.jsonl"
        os.environ[STATS_ENV] = str(stats)
        try:
            run = peer_cdt3.run_peer(binary, src, spec, timed_attempts=timed_attempts)
        finally:
            del os.environ[STATS_ENV]
        counters = json.loads(stats.read_text().splitlines()[-1])
    res = peer_cdt3.analyse(run["counts"], run["profiles"])
    keep = ("n22_over_n31", "mean_n0", "mean_n31", "mean_n22", "mean_n3", "de_sitter", "warnings")
    return {"seed": spec.seed, "run": peer_cdt3.summary(run), "fan32": counters, **{k: res[k] for k in keep}}


def main(argv: list[str] | None = None) -> int:
    from ivhl_jax.bench.harness import write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-src", default=None, help=f"JorenB/3d-cdt sources (default ${peer_cdt3.ENV_VAR})")
    ap.add_argument("--work", default=None, help="folder for the patched copies (default: a temporary one)")
    ap.add_argument("--k0", type=float, default=peer_cdt3.EXAMPLE["k0"])
    ap.add_argument("--target", type=int, default=500)
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--thermal", type=int, default=400)
    ap.add_argument("--sweeps", type=int, default=4000)
    ap.add_argument("--ksteps", type=int, default=5)
    ap.add_argument("--epsilon", type=float, default=peer_cdt3.EPSILON)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--variants", nargs="+", default=["plain", "strict"], choices=["plain", "strict"])
    ap.add_argument("--timed-attempts", type=int, default=2_000_000)
    ap.add_argument("--export", default="bench/results/cdt3_reference_fan32.json")
    a = ap.parse_args(argv)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="fan32-src-"))
    k3 = peer_cdt3.starting_k3(a.k0)
    runs: dict[str, list[dict[str, Any]]] = {}
    for variant in a.variants:
        src = patched_source(a.peer_src, work / variant, variant == "strict")
        for seed in a.seeds:
            spec = peer_cdt3.RunSpec(a.k0, k3, a.target, a.slices, a.thermal, a.sweeps, a.ksteps, a.epsilon, seed)
            entry = run_variant(src, spec, a.timed_attempts)
            print(variant, json.dumps({k: entry[k] for k in ("seed", "n22_over_n31", "fan32")}), flush=True)
            runs.setdefault(variant, []).append(entry)
    doc = {
        "op": "cdt3_reference_fan32",
        "reference": {"url": peer_cdt3.PEER_URL, "driver": "bench/peer_cdt3_driver.cpp"},
        "variants": {
            "plain": "the reference's (3,2) rule (five neighbouring tetrahedra); the fan walk only counts",
            "strict": "our rule: the (3,2) refused when its new triangle's vertex triple is a triangle already",
        },
        "conventions": "N31 = N(3,1) + N(1,3); target counts N(3,1); measured after each sweep once N(3,1) == "
        "target; k3 retuned during thermalisation; accept_by_move from the timed loop after the run",
        "runs": runs,
    }
    print("wrote", write_results(a.export, doc, command=peer_cdt3.command_line("ivhl_jax.bench.peer_cdt3_fan", argv)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
