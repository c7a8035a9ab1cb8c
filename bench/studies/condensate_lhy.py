"""The cost of the Lee–Huang–Yang term: a step of the dipolar and the mixture equation with LHY against the same
equation without it, timed interleaved round by round (:func:`ivhl_jax.bench.ops_condensate_terms.check_lhy`; the
per-round ratio is the comparable figure on a shared host), and the HLO counts that explain it (FFTs and fusions with a
field-shaped complex output in the compiled step: equal counts mean no extra pass over the field).

``python -m bench.studies.condensate_lhy --n 64 --rounds 21 --out bench/results/condensate_lhy_cpu.json``
"""

from __future__ import annotations

import argparse
import re

import jax


def hlo_counts(kind: str, n: int) -> dict:
    """{"plain"/"lhy": [FFTs, field fusions]} of one compiled real-time step (float32, single device)."""
    import jax.numpy as jnp

    from ivhl_jax.bench.ops_condensate_terms import lhy_pair
    from ivhl_jax.physics import condensate as C

    plain, with_lhy, start = lhy_pair(kind, n, jnp.float32)
    dims = ",".join(map(str, start.shape))
    out = {}
    for name, system in (("plain", plain), ("lhy", with_lhy)):
        st = C.strang(system, 1e-3)
        psi = st.init(jnp.asarray(start, jnp.complex64))
        text = jax.jit(st.step_fn).lower(psi, st.params).compile().as_text() or ""
        fusions = len(re.findall(rf"= c64\[{dims}\]\{{[^}}]*\}} fusion\(", text))
        out[name] = [len(re.findall(r" fft\(", text)), fusions]
    return out


def main(argv=None) -> None:
    from ivhl_jax.bench.ops_condensate_terms import check_lhy

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    doc: dict = {
        "what": "step time with the LHY term over the same equation without it, interleaved (float32, one device)",
        "note": "shared 2-core host, other jobs running: per-round ratios (interleaved) are the comparable figure",
        "results": {},
    }
    for kind in ("dipolar", "mixture"):
        rec = check_lhy(kind, a.n, a.steps, a.rounds)
        rec["hlo_ffts_and_field_fusions"] = hlo_counts(kind, a.n)
        doc["results"][kind] = rec
        r = rec["ratio_lhy_over_plain_per_round"]
        print(
            f"{kind} {a.n}^3: LHY/plain per round {r['median']:.3f} (q1 {r['q1']:.3f}, q3 {r['q3']:.3f}), "
            f"HLO {rec['hlo_ffts_and_field_fusions']}, f32 vs f64 {rec['f32_vs_f64']:.1e}"
        )
    if a.out:
        from ivhl_jax.bench.harness import write_results

        write_results(a.out, doc)


if __name__ == "__main__":
    main()
