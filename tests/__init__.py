"""The library's tests (a package, so that its folders never shadow top-level names such as the repository's
``bench`` package, whose studies are tested from ``bench/studies/tests``)."""
