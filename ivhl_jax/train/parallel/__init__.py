"""Distributed and model-parallel training and simulation on ``jit`` + ``NamedSharding`` + ``jax.shard_map``.

The mesh *is* the parallelism plan. A spec such as ``{"data": -1, "fsdp": 1, "tensor": 2, "pipeline": 1}``
builds a device mesh (``-1`` takes the remaining devices); logical axis names on parameters and
activations (``("embed", "mlp")``, ``("batch", "length")``) are mapped to mesh axes by rules; mesh axes of
size 1 simply vanish, so the same code runs data parallel (``data: 8``), fully sharded (``fsdp: 8``),
tensor parallel (``tensor: 2``) or any mix of them, and on one device.

==========================  ======================================================================
piece                       what it does
==========================  ======================================================================
:func:`make_mesh`           mesh from a spec (Auto axis types: GSPMD propagates shardings)
:data:`DEFAULT_RULES`       logical name → mesh axes (MaxText-style): batch→(data, fsdp), embed→fsdp,
                            mlp/heads/vocab→tensor (Megatron column/row split), stage→pipeline
:func:`param_shardings`     NamedSharding tree for parameters (logical names, else FSDP fallback)
:func:`state_shardings`     the same for a whole :class:`ivhl_jax.train.training.TrainState`
:func:`shard_tree`,         place pytrees / batches on the mesh, also across processes
:func:`shard_batch`
:func:`jit_train_step`      ``ivhl_jax.train.training.make_train_step`` compiled with in/out shardings
:func:`tp_mlp`,             explicit Megatron tensor-parallel layers for use inside ``shard_map``
:func:`tp_attention`
:func:`pipeline_apply`      GPipe microbatch pipeline (``shard_map`` + ``ppermute``), differentiable
:func:`compressed_mean`     optax transform: error-feedback bf16/int8/PowerSGD gradient all-reduce
:func:`compressed_dp_train_step`  data-parallel step with compressed all-reduce inside ``shard_map``
:func:`sharded_map`         split a grid of evaluation points across devices (wave fields)
:func:`collective_bytes`    bytes moved by collectives in a compiled program (parsed from its HLO)
==========================  ======================================================================

One module per job, ``ivhl_jax.train.parallel.<job>``: ``mesh``, ``sharding`` (logical rules and placement),
``tensor``, ``pipeline``, ``compression``, ``simulation`` (sharded wave fields) and ``accounting`` (collective
bytes); every name is also importable from here.

Equality with one device: every mode computes the same mathematical function; only the order of
floating-point reductions changes, so losses and parameters agree to round-off (tested on 8 emulated
CPU devices in ``tests/train/test_parallel.py``).
"""

from __future__ import annotations

from ivhl_jax.train.parallel import accounting, compression, mesh, pipeline, sharding, simulation, tensor

# the package re-exports exactly each job module's public names (``__all__``)
from ivhl_jax.train.parallel.accounting import *  # noqa: F403
from ivhl_jax.train.parallel.compression import *  # noqa: F403
from ivhl_jax.train.parallel.mesh import *  # noqa: F403
from ivhl_jax.train.parallel.pipeline import *  # noqa: F403
from ivhl_jax.train.parallel.sharding import *  # noqa: F403
from ivhl_jax.train.parallel.simulation import *  # noqa: F403
from ivhl_jax.train.parallel.tensor import *  # noqa: F403

# in the order of the table above
__all__: list[str] = []
__all__ += mesh.__all__
__all__ += sharding.__all__
__all__ += tensor.__all__
__all__ += pipeline.__all__
__all__ += compression.__all__
__all__ += simulation.__all__
__all__ += accounting.__all__
