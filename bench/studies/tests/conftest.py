"""Tests of the studies (not of the library): they import ``bench.studies.*`` from the repository root, which
pytest puts on sys.path for this package. The same 8 emulated CPU devices as the library tests."""

import os

# Before jax initialises its backend; `make test` sets the same flag.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("MPLBACKEND", "Agg")
