"""ivhl_jax: compiled, differentiable physics simulation in JAX.

Layers (each imports only the ones above it; ``tests/contracts/test_layering.py`` enforces it):

* :mod:`ivhl_jax.core` — validation, precision policies, host facts, the backend table, the per-machine tuning
  cache and the registry of tunable kernels;
* :mod:`ivhl_jax.numerics` — fast transcendentals, spectral multipliers, the stepper protocol and
  :func:`trajectory`;
* :mod:`ivhl_jax.physics` — fields, condensate, gft, cdt, mera, happy, tn, exact;
* :mod:`ivhl_jax.nn` — attention, gru, adaptive-node dynamics;
* :mod:`ivhl_jax.train` — training step, parallelism, data, checkpoints (never imports physics/models);
* :mod:`ivhl_jax.run` — chunked runner, configs, io, launch, device, profiler, ``ivhl tune``
  (never imports physics/models).

``import ivhl_jax`` has no side effect beyond importing: it reads no file, sets no environment variable and
prints nothing. The XLA flags ``ivhl tune`` measured as paying on this machine are put in force by
:func:`ivhl_jax.run.tune.apply` (the ``ivhl`` command calls it first; a script calls it before its first JAX
computation).

The public namespace is flat (diffrax style): ``ivhl_jax.condensate``, ``ivhl_jax.trajectory``,
``ivhl_jax.Policy`` ... are the documented entry points. Flax modules, runnable simulations and
benchmarks live in the repository folders ``models/``, ``sims/`` and ``bench/``; the wheel (and an editable
install, through setuptools' package-dir mapping) installs them as ``ivhl_jax.models``, ``ivhl_jax.sims`` and
``ivhl_jax.bench`` (imported on demand: they pull in Flax models, plotting and peers that a kernel user does not
need).
"""

__version__ = "0.1.0"  # the one version: pyproject.toml reads it ([tool.setuptools.dynamic])

from ivhl_jax.core import backend, precision, validation  # noqa: E402
from ivhl_jax.core.precision import Policy  # noqa: E402
from ivhl_jax.nn import adaptive, attention, gru  # noqa: E402
from ivhl_jax.nn import tunables as _nn_tunables  # noqa: E402
from ivhl_jax.numerics import fastmath, rollout, spectral  # noqa: E402
from ivhl_jax.numerics.rollout import Stepper, chunked, trajectory  # noqa: E402
from ivhl_jax.physics import cdt, condensate, exact, fields, gft  # noqa: E402
from ivhl_jax.physics import tunables as _physics_tunables  # noqa: E402
from ivhl_jax.physics.tensornet import happy, mera, tn  # noqa: E402

# _nn_tunables, _physics_tunables: the families' tunable kernels, registered for `ivhl tune` (a dictionary insert
# each, ivhl_jax.core.tunables). Importing ivhl_jax reads no file, sets no environment variable and prints nothing:
# the measured XLA flags are put in force by ivhl_jax.run.tune.apply(), which the `ivhl` command calls first.
del _nn_tunables, _physics_tunables

# The training and run layers load on first use (PEP 562): they pull in Orbax and Optax, which a kernel user
# does not need, and `import ivhl_jax` stays light (tests/contracts/test_layering.py checks what it imports).
_LAZY = {
    "train": ("ivhl_jax.train", None),
    "run": ("ivhl_jax.run", None),
    "training": ("ivhl_jax.train.training", None),
    "parallel": ("ivhl_jax.train.parallel", None),
    "data": ("ivhl_jax.train.data", None),
    "checkpoint": ("ivhl_jax.train.checkpoint", None),
    "Checkpointer": ("ivhl_jax.train.checkpoint", "Checkpointer"),
    "runner": ("ivhl_jax.run.runner", None),
    "run_chunked": ("ivhl_jax.run.runner", "run_chunked"),
    "config": ("ivhl_jax.run.config", None),
    "io": ("ivhl_jax.run.io", None),
    "device": ("ivhl_jax.run.device", None),
    "tune": ("ivhl_jax.run.tune", None),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ivhl_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | {"__version__"})


__all__ = [
    # layers
    "core",
    "numerics",
    "physics",
    "nn",
    "train",
    "run",
    # modules, flat
    "validation",
    "precision",
    "backend",
    "fastmath",
    "spectral",
    "rollout",
    "fields",
    "condensate",
    "gft",
    "cdt",
    "mera",
    "happy",
    "tn",
    "exact",
    "attention",
    "gru",
    "adaptive",
    "training",
    "parallel",
    "data",
    "checkpoint",
    "runner",
    "config",
    "io",
    "device",
    "tune",
    # the few names every user meets
    "Stepper",
    "trajectory",
    "chunked",
    "Policy",
    "Checkpointer",
    "run_chunked",
]
