"""Per-backend choices live in one place (ivhl_jax.core.backend): no other module asks which backend it runs on
in order to choose a setting. Reporting the platform (``ivhl info``, the profiler's record) is allowed."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
# files that only *report* the platform, and the one place that chooses (the table and the per-machine tuning cache,
# whose folder follows the operating system's convention)
REPORTING = {
    "ivhl_jax/run/device.py",
    "ivhl_jax/run/profiling.py",
    "ivhl_jax/core/backend.py",
    "ivhl_jax/core/tuning_cache.py",
}
PATTERN = re.compile(r"default_backend\(\)|\.platform\s*[!=]=")


def test_no_module_sniffs_the_backend_to_choose_a_setting():
    offenders = []
    for folder in ("ivhl_jax", "models", "sims"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in REPORTING:
                continue
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if PATTERN.search(line) and not line.lstrip().startswith("#"):
                    offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "read the default from ivhl_jax.core.backend.defaults() instead:\n" + "\n".join(offenders)
