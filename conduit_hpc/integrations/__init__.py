"""Framework integrations: training loops of other RL libraries on the data plane.

A room of its own (see ``docs/architecture.md``): it may import everything public of
conduit_hpc, and nothing else imports it (the plane and the features never do). Each
integration is one module that alone imports its framework, an optional extra:

* :mod:`conduit_hpc.integrations.torchrl` - a TorchRL replay buffer backed by the data
  plane (``pip install 'conduit-hpc[torchrl]'``); the naming rule between TensorDict keys
  and spec fields is :mod:`conduit_hpc.integrations.keymap` (no framework import);
* :mod:`conduit_hpc.integrations.rllib` - RLlib's DQN replay buffer on the data plane
  (``pip install 'conduit-hpc[rllib]'``); its episode chunks become n-step transitions
  in :mod:`conduit_hpc.integrations.nstep` (no framework import).

Importing this package imports no framework.
"""
