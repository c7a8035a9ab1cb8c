"""Benchmarks (imported as ``ivhl_jax.bench``): the harness, the ops of ``ivhl bench`` and the GPU checks.

Every module ``ivhl_jax.bench.ops_<area>`` defines ``OPS: dict[str, Callable[[str], BenchCase]]``
mapping an op name to a factory that builds the case for a size (small|medium|large|extreme), and most a
``gpu_check(quick)`` that ``python -m ivhl_jax.bench.gpu_checks`` runs. ``ivhl bench`` discovers them; see
``ivhl_jax.bench.harness``, whose ``write_results`` writes every results file. The studies in ``bench/studies/``
are scripts of the repository, not part of this package.
"""
