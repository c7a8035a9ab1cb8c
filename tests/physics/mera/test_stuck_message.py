"""The stuck check's reason says which way the energy error moved: "fell by only 5 %" when it fell too little,
"rose by 3 %" when it rose (never "fell by only -3 %")."""

from __future__ import annotations

import numpy as np

from ivhl_jax.physics.tensornet.mera.ladder import StuckCheck


def _errors(before: float, now: float) -> np.ndarray:
    e = np.full(300, before)
    e[-1] = now
    return e


def test_a_rising_error_is_said_to_rise():
    msg = StuckCheck().reason(_errors(2e-3, 2.06e-3))
    assert msg is not None and "rose by 3 %" in msg and "-" not in msg.split("rose")[1].split("%")[0], msg


def test_a_slowly_falling_error_is_said_to_fall_too_little():
    msg = StuckCheck().reason(_errors(2e-3, 1.9e-3))
    assert msg is not None and "fell by only 5 %" in msg and "needs to fall by 20 %" in msg, msg
