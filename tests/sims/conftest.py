"""Fixtures shared by the simulation and training-script tests: a PNG check, a synthetic loss history for the plot
tests and the check of a refused command line."""

from __future__ import annotations

import numpy as np
import pytest

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def is_png():
    """``is_png(path)``: the file is a real PNG picture (signature and > 5000 bytes), not an empty canvas."""

    def check(path) -> bool:
        with open(path, "rb") as f:
            return f.read(8) == PNG and f.seek(0, 2) > 5000

    return check


@pytest.fixture
def loss_history():
    """``loss_history(n_steps=60, chunk=20)``: a falling noisy loss per step and the step at each chunk's end."""

    def make(n_steps: int = 60, chunk: int = 20) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        loss = np.exp(-np.linspace(0, 2, n_steps)) + 0.05 * rng.random(n_steps)
        return {"loss": loss.astype(np.float32), "chunk_end_step": chunk * np.arange(1, n_steps // chunk + 1)}

    return make


@pytest.fixture
def refused(tmp_path, capsys):
    """``refused(main, sets, message)``: the command line ``main`` (a simulation's ``main``) with ``--set`` of each
    ``key=value`` of ``sets`` exits 2 before any work, its error one line that holds ``message``."""

    def check(main, sets, message: str) -> None:
        out = tmp_path / "refused"
        assert main(["--no-progress", *(a for kv in sets for a in ("--set", kv)), "--out", str(out)]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], lines
        assert not (out / "final_state.npy").exists()

    return check
