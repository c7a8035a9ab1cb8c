"""Running things: the chunked driver with progress and resume, configs, output files, multi-process launch,
device report and compilation cache, the training profiler. Never imports physics or models."""

from typing import Any

__all__ = ["open_run"]


def __getattr__(name: str) -> Any:  # open_run without importing zarr and xarray with the package
    if name == "open_run":
        from ivhl_jax.run.store import open_run

        return open_run
    raise AttributeError(f"module 'ivhl_jax.run' has no attribute {name!r}")
