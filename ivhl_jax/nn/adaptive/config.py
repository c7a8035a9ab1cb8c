"""The adaptive-node model's configuration (:class:`AdaptiveConfig`), its phases, and the node/scheduler state of a
batch (:class:`NodeState`, :func:`init_state`, :func:`detach`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from ivhl_jax.core.precision import Policy, physics_policy
from ivhl_jax.core.validation import check_choice, check_scalar

__all__ = [
    "PHASES",
    "ACTIVE",
    "SLEEP",
    "INTERACTIVE",
    "INSPIRED",
    "E_MAX",
    "AdaptiveConfig",
    "NodeState",
    "init_state",
    "detach",
]

PHASES = ("active", "sleep", "interactive", "inspired")
ACTIVE, SLEEP, INTERACTIVE, INSPIRED = range(4)
E_MAX = 50.0


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    """Model and scheduler configuration. Default sizes N=100, H=64, D=784, C=10.

    Attributes:
      num_nodes, hidden_dim, input_dim, output_dim: N, H, D, C.
      energy_decay: delta, fraction of energy lost per step.
      initial_energy: E at the start of a sequence (10).
      circadian_period: P of the scheduler clock.
      anxiety_threshold: theta of rule R1.
      temperature: T of the phase policy.
      exploration_rate: eps, probability of rule R0.
      inner_steps: K dynamics steps per input.
      scheduler: ``"per_sample"`` or ``"shared"`` (see module docstring).
      softmax_of_probabilities: logits ``w / T`` (a softmax of the probabilities) instead of ``log(w) / T``.
      readout: ``"activity"`` (logits from a'), ``"hidden"`` (from h'), ``"hidden+activity"``.
      readout_energy: also feed E'/50 to the readout (makes the energy head trainable).
      per_node_input: node-specific input weights W_in[N, D, H] instead of one shared projection.
      input_gain: g, weight of the projected input in the hidden update (0.1).
      sleep_recovery: rho, energy a sleeping node regains per step (0: none).
      stochastic: sample phases; if False every node stays ACTIVE (a deterministic ablation).
    """

    num_nodes: int = 100
    hidden_dim: int = 64
    input_dim: int = 784
    output_dim: int = 10
    energy_decay: float = 0.01
    initial_energy: float = 10.0
    circadian_period: int = 100
    anxiety_threshold: float = 5.0
    temperature: float = 1.0
    exploration_rate: float = 0.1
    inner_steps: int = 1
    scheduler: str = "per_sample"
    softmax_of_probabilities: bool = False
    readout: str = "activity"
    readout_energy: bool = False
    per_node_input: bool = False
    input_gain: float = 0.1
    sleep_recovery: float = 0.0
    stochastic: bool = True

    def validate(self) -> None:
        for name in ("num_nodes", "hidden_dim", "input_dim", "output_dim", "circadian_period", "inner_steps"):
            check_scalar(getattr(self, name), name, integer=True, minimum=1)
        if self.hidden_dim < 2:
            raise ValueError("hidden_dim must be >= 2 (anxiety uses the unbiased variance over H)")
        check_scalar(self.energy_decay, "energy_decay", minimum=0.0, maximum=1.0)
        check_scalar(self.initial_energy, "initial_energy", minimum=0.0, maximum=E_MAX)
        check_scalar(self.anxiety_threshold, "anxiety_threshold", positive=True)
        check_scalar(self.temperature, "temperature", positive=True)
        check_scalar(self.exploration_rate, "exploration_rate", minimum=0.0, maximum=1.0)
        check_scalar(self.input_gain, "input_gain", nonnegative=True)
        check_scalar(self.sleep_recovery, "sleep_recovery", nonnegative=True)
        check_choice(self.scheduler, "scheduler", ("per_sample", "shared"))
        check_choice(self.readout, "readout", ("activity", "hidden", "hidden+activity"))

    def __post_init__(self):
        self.validate()

    @classmethod
    def reference(cls, **overrides: Any) -> AdaptiveConfig:
        """The reference model's semantics: batch-shared scheduler, softmax of probabilities, activity readout."""
        return cls(**{"scheduler": "shared", "softmax_of_probabilities": True, **overrides})

    @classmethod
    def improved(cls, **overrides: Any) -> AdaptiveConfig:
        """Removes the bottleneck: read out from h (and a, E), per-node inputs, restorative sleep."""
        base = dict(
            scheduler="per_sample",
            softmax_of_probabilities=False,
            readout="hidden+activity",
            readout_energy=True,
            per_node_input=True,
            input_gain=1.0,
            sleep_recovery=0.5,
            inner_steps=2,
        )
        return cls(**{**base, **overrides})

    @property
    def num_features(self) -> int:
        n, h = self.num_nodes, self.hidden_dim
        f = {"activity": n, "hidden": n * h, "hidden+activity": n * h + n}[self.readout]
        return f + (n if self.readout_energy else 0)


class NodeState(flax.struct.PyTreeNode):
    """Node and scheduler state of a batch.

    Node fields: ``h [B,N,H]``, ``energy [B,N]``, ``activity [B,N]``. Scheduler fields have shape
    ``S + [N]`` with ``S = [B]`` for the per-sample scheduler and ``S = []`` for the shared one:
    ``phase`` (int32), ``anxiety_ema``, ``restorative`` (r), ``sleep_quality`` (q); ``t`` has shape S.
    """

    h: jax.Array
    energy: jax.Array
    activity: jax.Array
    phase: jax.Array
    anxiety_ema: jax.Array
    restorative: jax.Array
    sleep_quality: jax.Array
    t: jax.Array


def init_state(cfg: AdaptiveConfig, batch: int, *, policy: str | Policy | None = None) -> NodeState:
    """The initial state of a sequence: h = 0, E = initial_energy, a = 0, all ACTIVE, r = 0, q = 1; floating
    fields in the policy's ``output_dtype`` (the dtype a step carries its state in; None: float32)."""
    check_scalar(batch, "batch", integer=True, minimum=1)
    dtype = physics_policy(policy, like=()).output_dtype
    n, hd = cfg.num_nodes, cfg.hidden_dim
    s = (batch,) if cfg.scheduler == "per_sample" else ()
    return NodeState(
        h=jnp.zeros((batch, n, hd), dtype),
        energy=jnp.full((batch, n), cfg.initial_energy, dtype),
        activity=jnp.zeros((batch, n), dtype),
        phase=jnp.full(s + (n,), ACTIVE, jnp.int32),
        anxiety_ema=jnp.zeros(s + (n,), dtype),
        restorative=jnp.zeros(s + (n,), dtype),
        sleep_quality=jnp.ones(s + (n,), dtype),
        t=jnp.zeros(s, jnp.int32),
    )


def detach(state: NodeState) -> NodeState:
    """Stop gradients through a state carried from a previous batch (truncated backpropagation of length 1)."""
    return jax.tree_util.tree_map(jax.lax.stop_gradient, state)
