"""ivhl_jax: compiled, differentiable physics simulation in JAX.

The pure-functional core lives in this package (``ivhl_jax.fields``, ``ivhl_jax.condensate``,
``ivhl_jax.tn``, ``ivhl_jax.cdt``, ``ivhl_jax.adaptive`` ...). Flax modules, runnable simulations
and benchmarks live in the repository folders ``models/``, ``sims/`` and ``bench/`` and are
importable as ``ivhl_jax.models``, ``ivhl_jax.sims`` and ``ivhl_jax.bench``.
"""

from __future__ import annotations

import os as _os

__version__ = "0.1.0"

# From a source checkout (repo root on sys.path, nothing installed) the folders models/, sims/ and
# bench/ sit beside this package instead of inside it. Extending __path__ lets
# `import ivhl_jax.models` resolve them exactly as the installed wheel's package-dir mapping does.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isdir(_os.path.join(_root, "models")):
    if _root not in __path__:
        __path__.append(_root)
