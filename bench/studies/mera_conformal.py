"""Conformal data of critical chains from the scale-invariant MERA: energy error, scaling dimensions (one-site and
two-site, identified), OPE coefficients and central charge (:mod:`ivhl_jax.physics.tensornet.mera.conformal`), measured
after every stage of a bond-dimension ladder, and written to ``bench/results/mera_conformal_data.json`` (one record
per model, with the command)::

    python -m bench.studies.mera_conformal --model ising --ladder 6/4/1/2000 8/6/2/1800 12/8/3/1400 --save /tmp/m

A stage is chi/chi_mid/layers/sweeps (float64, reflection symmetric where the term is); ``--save PREFIX`` pickles
each stage's MERA (PREFIX_chi<χ>.pkl); ``--load FILE.pkl`` continues from a saved MERA (with no ``--ladder``: measures
each saved MERA given).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import pickle
import sys
import time
from typing import Any

import jax
import numpy as np

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"  # bench/results


def measure(mera: Any, model: Any, name: str) -> dict[str, Any]:
    from ivhl_jax import mera as M
    from ivhl_jax.physics.tensornet.mera import conformal, scaling

    t0 = time.perf_counter()
    ch = conformal.two_site_channels(mera, 16)
    two = scaling.identify(ch.dims[:12], name)
    rec: dict[str, Any] = {
        "layer_chis": list(mera.chis),
        "layer_chi_mids": list(mera.chi_mids),
        "energy_error": float(M.energy_per_site(mera, _terms(model)) - model.e0),
        "one_site_dims": M.scaling_dimensions(mera, 6).tolist(),
        "two_site": [{k: r[k] for k in ("delta", "label", "exact")} for r in two],
    }
    if M.CFTS[name].ope:
        rec["ope"] = conformal.ope_coefficients(mera, name, channels=ch)
    rec["central_charge"] = conformal.central_charge(mera, model)
    rec["seconds_to_measure"] = round(time.perf_counter() - t0, 1)
    return rec


def _terms(model: Any) -> Any:
    import jax.numpy as jnp

    from ivhl_jax.physics.tensornet.mera.models import blocked_terms

    return blocked_terms(model, jnp.float64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["ising", "xx", "potts"], required=True)
    ap.add_argument("--ladder", nargs="*", default=[], help="stages chi/chi_mid/layers/sweeps")
    ap.add_argument(
        "--load",
        nargs="+",
        default=None,
        help="a pickled MERA to continue from (or, with no --ladder, the MERAs to measure)",
    )
    ap.add_argument("--save", default=None, help="pickle each stage's MERA to <SAVE>_chi<chi>.pkl")
    ap.add_argument("--out", default=str(RESULTS / "mera_conformal_data.json"))
    ap.add_argument("--made-by", default=None, help="the command that made the --load MERAs (recorded)")
    args = ap.parse_args(argv)
    from ivhl_jax import mera as M
    from ivhl_jax.bench.harness import write_results
    from ivhl_jax.bench.ops_tn import ladder_stages

    model = {"ising": M.ising, "xx": M.xx, "potts": M.potts}[args.model]()
    stages: list[dict[str, Any]] = []
    with jax.enable_x64(True):
        start = None
        if args.load and args.ladder:
            with open(args.load[0], "rb") as f:
                start = jax.tree.map(jax.numpy.asarray, pickle.load(f))
        configs = []
        for spec in args.ladder:
            chi, mid, layers, n = (int(x) for x in spec.split("/"))
            configs.append((M.MERAConfig(chi=chi, chi_mid=mid, layers=layers, refsym=model.reflection_symmetric), n))
        t0 = time.perf_counter()
        for k, mera, _ in ladder_stages(
            model, configs, log=lambda line: print(line, flush=True), report_every=200, start=start
        ):
            chi = configs[k][0].chi
            if args.save:
                with open(f"{args.save}_chi{chi}.pkl", "wb") as f:
                    pickle.dump(jax.tree.map(np.asarray, mera), f)
            rec = {
                "stage": args.ladder[k],
                "sweep_seconds": round(time.perf_counter() - t0, 1),
                **measure(mera, model, args.model),
            }
            stages.append(rec)
            print(json.dumps({k: rec[k] for k in ("stage", "energy_error", "one_site_dims")}), flush=True)
            t0 = time.perf_counter()
        for path in (args.load or []) if not args.ladder else []:
            with open(path, "rb") as f:
                mera = jax.tree.map(jax.numpy.asarray, pickle.load(f))
            stages.append({"stage": f"loaded {pathlib.Path(path).name}", **measure(mera, model, args.model)})
            print(json.dumps({k: stages[-1][k] for k in ("stage", "energy_error", "one_site_dims")}), flush=True)
    out = pathlib.Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    data.setdefault(
        "what",
        "conformal data of critical chains from the scale-invariant MERA "
        "(ivhl_jax.physics.tensornet.mera.conformal); one record per model, stages bottom-up",
    )
    data.setdefault(
        "methods",
        {
            "ope": "one-site scaling operators on the B and A sites of the two-site-cone bond, expanded in the left "
            "eigenvectors of the two-site scaling superoperator; |C| = Frobenius norm / sqrt(m)",
            "central_charge": "c = 4L[E0(2L) - 2E0(L)]/(pi v), ground states of the coarse-grained Hamiltonian on "
            "rings of 4 sites at consecutive levels, v exact",
        },
    )
    data[args.model] = {
        "command": "python -m bench.studies.mera_conformal " + " ".join(sys.argv[1:] if argv is None else argv),
        "stages": stages,
    }
    if args.made_by:
        data[args.model]["meras_made_by"] = args.made_by
    write_results(out, data, command=data[args.model]["command"])  # the header: this (latest) run
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
