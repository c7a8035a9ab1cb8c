#!/usr/bin/env bash
# Tune this GPU machine, then run the GPU checks; everything lands under $OUT (default ./gpu_out).
#
#   OUT=/some/dir bash bench/gpu_tune_and_check.sh        # from a copy of the repository root, nothing installed
#
# Works from a copy of the source tree with nothing installed: where `PYTHONPATH=.` does not import ivhl_jax.bench
# (only the wheel and an editable install map bench/ there) it lays out a copy of the package as the wheel has it
# (models/, sims/, bench/ inside ivhl_jax) in $SITE (default ${TMPDIR:-/tmp}/ivhl_site, outside $OUT so that only results land there) and runs
# from there. Budget on one H100: `ivhl tune --quick` <= 150 s, gpu_checks <= 190 s of sections.
# Writes: $OUT/tune_gpu.json (every candidate, timings, roofline fractions, the limits measured now),
# $OUT/cache/tuning/gpu-*.json (the tuning cache), $OUT/gpu_checks.json, $OUT/info.txt and a log per step.
set -u -o pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-${1:-$PWD/gpu_out}}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python3}"
export IVHL_CACHE_DIR="$OUT/cache" IVHL_COMPILATION_CACHE=0 PYTHONUNBUFFERED=1
RUN_DIR="$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if ! (cd "$RUN_DIR" && "$PY" -c "import ivhl_jax.run.tune, ivhl_jax.bench.gpu_checks, ivhl_jax.models, ivhl_jax.sims") \
    >"$OUT/import_check.log" 2>&1; then
  # The wheel's layout (pyproject's package-dir: models/, sims/, bench/ inside ivhl_jax), made by copying; no
  # build step, so no setuptools version or network matters.
  SITE="${SITE:-${TMPDIR:-/tmp}/ivhl_site}"
  echo "ivhl_jax.bench is not importable from the source tree; laying out a copy of the package in $SITE"
  rm -rf "$SITE" && mkdir -p "$SITE"
  cp -r "$REPO/ivhl_jax" "$SITE/ivhl_jax" && for d in models sims bench; do
    cp -r "$REPO/$d" "$SITE/ivhl_jax/$d"; done || { echo "could not copy the package to $SITE"; exit 2; }
  export PYTHONPATH="$SITE"
  RUN_DIR="$SITE"  # not the repository root: `python -m` puts the working folder first on sys.path
fi
cd "$RUN_DIR"
status=0
if [ -z "${SKIP_TUNE:-}" ]; then  # SKIP_TUNE=1: a later call of a plan (gpu_checks --budget), tuned already
echo "== ivhl tune --quick (GPU sizes) =="
# TUNE_ARGS / CHECKS_ARGS narrow a rerun to what a first run did not reach (e.g. TUNE_ARGS="--quick --only cdt"
# CHECKS_ARGS="--budget-s 200 --only fields --only gp"); *_TIMEOUT bound each step.
# shellcheck disable=SC2086
timeout "${TUNE_TIMEOUT:-150}" "$PY" -m ivhl_jax.cli tune ${TUNE_ARGS:---quick} --export "$OUT/tune_gpu.json" 2>&1 \
  | tee "$OUT/tune.log" || status=1
fi
echo "== gpu_checks =="
# shellcheck disable=SC2086
timeout "${CHECKS_TIMEOUT:-200}" "$PY" -m ivhl_jax.bench.gpu_checks --out "$OUT" ${CHECKS_ARGS:---budget-s 190 --skip tune} \
  2>&1 | tee "$OUT/gpu_checks.log" || status=1
"$PY" -m ivhl_jax.cli info >"$OUT/info.txt" 2>&1 || status=1
echo "wrote $OUT (status $status)"
exit $status
