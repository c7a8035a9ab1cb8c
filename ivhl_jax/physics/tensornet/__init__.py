"""Tensor networks: one package for the tensors, their operations and the networks built on them.

* :mod:`~ivhl_jax.physics.tensornet.tn` — dense contraction with a cached optimal path, entanglement entropies;
* :mod:`~ivhl_jax.physics.tensornet.blocks` — block-sparse tensors symmetric under an abelian group (Z_n, U(1));
* :mod:`~ivhl_jax.physics.tensornet.ops` — the tensor interface an algorithm is written against, provided by a
  dense array (the trivial charge) and a :class:`~ivhl_jax.physics.tensornet.blocks.BlockTensor` alike;
* :mod:`~ivhl_jax.physics.tensornet.happy` — the HaPPY holographic code;
* :mod:`~ivhl_jax.physics.tensornet.mera` — the scale-invariant MERA, one implementation over both tensor kinds.

``ivhl_jax.tn``, ``ivhl_jax.happy`` and ``ivhl_jax.mera`` are these modules in the flat namespace.
"""

from ivhl_jax.physics.tensornet import blocks, happy, mera, ops, tn

__all__ = ["tn", "blocks", "ops", "happy", "mera"]
