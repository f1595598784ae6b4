"""Framework integrations: other libraries' training loops on the data plane, unchanged.

Each module is imported only by its users (jobs, benchmarks, tests) and imports its
framework on import: :mod:`conduit_hpc.integrations.rllib` (the ``[rllib]`` extra).
They use the data plane's public API only; nothing else in the package imports them.
"""
