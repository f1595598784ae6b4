"""``[atari]``: an ALE game through Gymnasium's standard Atari preprocessing, for the
Ape-X DQN job ``jobs/apex_atari.py``.

The ROMs come with ``ale-py``'s wheel (the ``[atari]`` extra: ``pip install
'conduit-hpc[atari]'``, which also brings OpenCV for the resize). An env is
``gymnasium.make(env_id, frameskip=1, repeat_action_probability=sticky_actions)``
wrapped in ``AtariPreprocessing`` (no-op starts, frame skip with max-pooling of the last
two frames, 84 x 84 grayscale) and ``FrameStackObservation`` (the last ``frame_stack``
frames): observations are uint8 ``(frame_stack, screen_size, screen_size)``. ``env_id``
stays ``[dqn] env_id`` (e.g. ``"ALE/Pong-v5"``). Importing this module imports neither
ALE nor OpenCV; :func:`make_atari_vector_env` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from conduit_hpc.config import require, require_types
from conduit_hpc.rl.section import check_env_id

__all__ = ["AtariSection", "make_atari_vector_env"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AtariSection:
    """``[atari]``: the preprocessing of an ALE game.

    Attributes:
        frame_skip (int): emulator frames per agent step (the action repeats; the
            observation is the max of the last two frames).
        frame_stack (int): agent-step frames stacked into one observation.
        screen_size (int): side of the square grayscale frame (pixels).
        noop_max (int): at most this many no-op actions at the start of an episode.
        sticky_actions (float): ALE's ``repeat_action_probability`` (0.25 is the v5
            default of Machado et al.; 0 gives the deterministic emulator of the
            Nature/Ape-X papers).
        terminal_on_life_loss (bool): end an episode when a life is lost.
        reward_clip (float): rewards enter the n-step returns clipped to
            ``[-reward_clip, reward_clip]`` (1 in the papers; 0: unclipped). Episode
            returns are always the game's score.
        max_episode_frames (int): emulator frames before an episode is truncated (ALE's
            ``max_num_frames_per_episode``; 108,000 = 30 minutes of play).
    """

    frame_skip: int = 4
    frame_stack: int = 4
    screen_size: int = 84
    noop_max: int = 30
    sticky_actions: float = 0.25
    terminal_on_life_loss: bool = False
    reward_clip: float = 1.0
    max_episode_frames: int = 108_000

    def __post_init__(self) -> None:
        require_types(self)
        require(1 <= self.frame_skip <= 64, "frame_skip", self.frame_skip, "in [1, 64]")
        require(1 <= self.frame_stack <= 64, "frame_stack", self.frame_stack, "in [1, 64]")
        require(36 <= self.screen_size <= 1024, "screen_size", self.screen_size,
                "in [36, 1024] (the Nature CNN needs at least 36 pixels)")
        require(0 <= self.noop_max <= 10_000, "noop_max", self.noop_max, "in [0, 10000]")
        require(0.0 <= self.sticky_actions <= 1.0, "sticky_actions", self.sticky_actions,
                "in [0, 1]")
        require(math.isfinite(self.reward_clip) and self.reward_clip >= 0, "reward_clip",
                self.reward_clip, ">= 0 (0: unclipped)")
        require(1 <= self.max_episode_frames <= 2**31 - 1, "max_episode_frames",
                self.max_episode_frames, f">= 1 and <= {2**31 - 1} (ALE takes a C int)")

    @property
    def obs_shape(self) -> tuple[int, int, int]:
        """``(frame_stack, screen_size, screen_size)``."""
        return (self.frame_stack, self.screen_size, self.screen_size)


def make_atari_vector_env(env_id: str, num_envs: int, seed: int,
                          atari: AtariSection) -> tuple[Any, np.ndarray]:
    """A synchronous vector env of ``num_envs`` preprocessed ALE games in ``SAME_STEP``
    autoreset mode (as :func:`~conduit_hpc.rl.dqn.make_vector_env`), reset with seeds
    ``seed .. seed + num_envs - 1``. Not collective; blocks while the emulators start.

    Returns:
        tuple: ``(env, first_obs)``, ``first_obs`` uint8 ``(num_envs, *atari.obs_shape)``.

    Raises:
        ImportError: the ``[atari]`` extra (ale-py, OpenCV) is not installed.
    """
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    try:
        import ale_py
    except ImportError as err:
        raise ImportError(f"the Atari job needs the [atari] extra ({err}); pip install "
                          f"'conduit-hpc[atari]'") from err
    gym.register_envs(ale_py)
    check_env_id(env_id)

    def wrap(env: Any) -> Any:
        env = AtariPreprocessing(env, noop_max=atari.noop_max, frame_skip=atari.frame_skip,
                                 screen_size=atari.screen_size,
                                 terminal_on_life_loss=atari.terminal_on_life_loss)
        return FrameStackObservation(env, atari.frame_stack)

    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync", wrappers=[wrap],
                       vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                       frameskip=1, repeat_action_probability=atari.sticky_actions,
                       max_num_frames_per_episode=atari.max_episode_frames)
    obs, _ = env.reset(seed=[seed + i for i in range(num_envs)])  # type: ignore[arg-type]
    env.action_space.seed(seed)
    return env, obs
