"""Training infrastructure: the shared train step, sharding and multi-host parallelism, step-addressed data,
Orbax checkpoints. Never imports physics or models."""
