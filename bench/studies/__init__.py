"""Studies: the scripts behind the measured tables of the guides (scaling fits, conformal data, reference ports,
revision comparisons, the module inventory). Not part of the installed package: run them from a checkout of
the repository root, ``python -m bench.studies.<name>`` (see ``bench/studies/README.md``)."""
