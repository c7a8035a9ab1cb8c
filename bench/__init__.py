"""Benchmarks (imported as ``ivhl_jax.bench``).

Every module ``ivhl_jax.bench.ops_<area>`` defines ``OPS: dict[str, Callable[[str], BenchCase]]``
mapping an op name to a factory that builds the case for a size (small|medium|large|extreme).
``ivhl bench`` discovers them; see ``ivhl_jax.bench.harness``.
"""
