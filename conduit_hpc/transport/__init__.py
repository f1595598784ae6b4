"""How bytes move: RMA windows, point-to-point channels, collectives.

Import of this package does not import MPI; use the submodules.
"""
