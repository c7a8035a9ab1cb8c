"""What the training programs of ``ivhl train`` share: one rule for their step keys, one vocabulary."""

from __future__ import annotations

import dataclasses

import pytest

from ivhl_jax.run.config import load_config
from ivhl_jax.sims import train_adaptive, train_lm, train_vortex_gru

CONFIGS = [train_adaptive.TrainAdaptiveConfig, train_lm.TrainLMConfig, train_vortex_gru.VortexGRUConfig]

#: (the config key the case needs, the overrides, what the one-line error says)
CASES = [
    ("steps", ["steps=25", "steps_per_chunk=10"], r"steps \(25\) must be a multiple of steps_per_chunk \(10\)"),
    ("steps", ["steps=0"], "steps must be >= 1, got 0"),
    ("steps_per_chunk", ["steps_per_chunk=0"], "steps_per_chunk must be >= 1, got 0"),
    ("steps_per_chunk", ["chunk=10"], r"unknown config key\(s\) \['chunk'\].*valid keys: .*'steps_per_chunk'"),
    ("warmup_steps", ["steps=10", "steps_per_chunk=5", "warmup_steps=20"], r"warmup_steps \(20\) must be <= steps"),
    ("warmup_steps", ["warmup_steps=-1"], "warmup_steps must be >= 0"),
    (
        "checkpoint_every",
        ["steps=100", "steps_per_chunk=10", "checkpoint_every=15"],
        r"checkpoint_every \(15\) must be a multiple of steps_per_chunk \(10\)",
    ),
    ("keep_checkpoints", ["keep_checkpoints=0"], "keep_checkpoints must be >= 1"),
]


@pytest.mark.parametrize(
    "cls, sets, pattern",
    [
        pytest.param(cls, sets, pattern, id=f"{cls.__name__}-{'-'.join(sets)}")
        for cls in CONFIGS
        for key, sets, pattern in CASES
        if key in {f.name for f in dataclasses.fields(cls)}
    ],
)
def test_shared_keys_follow_one_rule(cls, sets, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_config(cls, None, sets)


@pytest.mark.parametrize("cls", CONFIGS)
def test_the_defaults_are_whole_chunks(cls):
    cfg = cls()
    cfg.validate()
    assert cfg.steps % cfg.steps_per_chunk == 0
