"""Benchmarks, one module per benchmark: ``conduit-hpc bench NAME`` imports
``conduit_hpc.bench.NAME`` (``-`` in NAME read as ``_``) and calls its
``main(argv) -> dict``. The first line of each module's docstring is its entry in
``conduit-hpc bench --help``. Results (JSON lines, PNGs, ``bench/README.md``) live in the
repository's ``bench/`` folder, not here. Importing a benchmark module does no work.
"""
