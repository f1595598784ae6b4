"""``[dqn]``: the DQN job's own knobs (one source of truth: batch size, learning start,
ratio, weight period and priority exponent are the data plane's ``[scheduler]`` and
``[storage]`` values)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from conduit_hpc.config import (
    FieldConfig,
    LaunchWorld,
    SchedulerConfig,
    require,
    require_bytes,
    require_types,
)
from conduit_hpc.errors import ConfigError, SpecError
from conduit_hpc.rl.exploration import epsilon_ladder

__all__ = ["ENV_BYTES_FLOOR", "DQNSection", "check_actor_batch", "check_actor_rows",
           "check_dqn_launch", "check_env_id", "require_network", "require_polls_within"]

#: bytes one Gymnasium environment of a vector env takes at least (a CartPole-v1 slot of
#: a synchronous vector env: ~5.7 kB measured)
ENV_BYTES_FLOOR = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class DQNSection:
    """``[dqn]``: hyperparameters shared by the single-process baseline and the
    distributed job. What the replay does (batch, fill, ratio, weight period, capacity,
    priority exponent) is not here: ``[scheduler]`` and ``[storage]`` hold it.

    The defaults are tuned for CartPole-v1: 8 of 8 seeds reached a mean return of 475
    over 20 scored episodes in 32k-82k env steps (median about 52k). ``bench/README.md``
    records the sweep: what was tried and what failed.

    Attributes:
        env_id (str): Gymnasium environment id (discrete actions, flat observations).
        num_envs (int): environment slots in total; the distributed job splits them over
            its actor ranks, and the epsilon ladder runs over all of them.
        hidden (tuple[int, ...]): hidden layer widths of the Q network.
        dueling (bool): dueling head.
        gamma (float): discount per step.
        n_step (int): steps per transition.
        lr (float): Adam learning rate.
        target_period (int): learner updates between target-network syncs.
        epsilon (float): base epsilon of the Ape-X ladder.
        epsilon_alpha (float): spread exponent of the ladder.
        max_grad_norm (float): gradient clipping (0 = off).
        huber_delta (float): Huber threshold of the loss.
        target_return (float): stop when the mean return of the last ``window`` scored
            episodes reaches this.
        window (int): episodes in that mean.
        score_max_epsilon (float): episodes of env slots whose ladder epsilon is at most
            this are *scored* (enter that mean); the more exploring slots only feed
            replay. 1.0 scores every episode. At least the least-exploring slot is
            always scored. (With 8 slots and 0.05: slots 3-7, epsilon 0.026 .. 0.0007.)
        max_env_steps (int): step budget.
    """

    env_id: str = "CartPole-v1"
    num_envs: int = 8
    hidden: tuple[int, ...] = (128, 128)
    dueling: bool = False
    gamma: float = 0.99
    n_step: int = 3
    lr: float = 2e-3
    target_period: int = 100
    epsilon: float = 0.4
    epsilon_alpha: float = 7.0
    max_grad_norm: float = 10.0
    huber_delta: float = 1.0
    target_return: float = 475.0
    window: int = 20
    score_max_epsilon: float = 0.05
    max_env_steps: int = 200_000

    def __post_init__(self) -> None:
        require_types(self)
        require(bool(self.env_id), "env_id", self.env_id, "a Gymnasium environment id")
        require(self.num_envs >= 1, "num_envs", self.num_envs, ">= 1")
        require(len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden), "hidden",
                self.hidden, "a non-empty list of positive widths")
        require(0.0 <= self.gamma <= 1.0, "gamma", self.gamma, "in [0, 1]")
        require(self.n_step >= 1, "n_step", self.n_step, ">= 1")
        require(math.isfinite(self.lr) and self.lr > 0, "lr", self.lr, "finite and > 0")
        require(self.target_period >= 1, "target_period", self.target_period, ">= 1")
        require(0.0 < self.epsilon <= 1.0, "epsilon", self.epsilon, "in (0, 1]")
        require(math.isfinite(self.epsilon_alpha) and self.epsilon_alpha >= 0, "epsilon_alpha",
                self.epsilon_alpha, "finite and >= 0")
        require(math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0, "max_grad_norm",
                self.max_grad_norm, "finite and >= 0")
        require(math.isfinite(self.huber_delta) and self.huber_delta > 0, "huber_delta",
                self.huber_delta, "finite and > 0")
        require(not math.isnan(self.target_return), "target_return", self.target_return,
                "a number (inf: never stop at a return)")
        require(self.window >= 1, "window", self.window, ">= 1")
        require(0.0 < self.score_max_epsilon <= 1.0, "score_max_epsilon",
                self.score_max_epsilon, "in (0, 1]")
        require(self.max_env_steps >= 1, "max_env_steps", self.max_env_steps, ">= 1")

    def epsilons(self) -> np.ndarray:
        """The ladder's epsilon of each of the ``num_envs`` env slots."""
        return epsilon_ladder(self.num_envs, self.epsilon, self.epsilon_alpha)

    def scored_slots(self) -> np.ndarray:
        """Bool per env slot: its episodes count toward the convergence test."""
        eps = self.epsilons()
        return eps <= max(self.score_max_epsilon, float(eps.min()))


def check_env_id(env_id: str) -> None:
    """Refuse an ``env_id`` Gymnasium does not know, naming ``dqn.env_id`` and the
    closest ids it knows (Gymnasium's own message, e.g. a missing namespace or
    version). Local.

    Raises:
        ConfigError: unknown id.
    """
    import gymnasium as gym
    from gymnasium import error as gym_error

    try:
        gym.spec(env_id)
    except gym_error.Error as err:
        raise ConfigError(f"dqn.env_id must be a registered Gymnasium environment id, got "
                          f"{env_id!r}: {err}", key="dqn.env_id") from err


def check_actor_batch(hp: DQNSection, envs_per_actor: int, scheduler: SchedulerConfig) -> None:
    """Refuse an ``n_step`` whose ingests the rate limiter would refuse mid-run: an Ape-X
    actor ingests one step's transitions at once, up to ``envs_per_actor * n_step`` rows
    (every env ending an episode in the same step flushes its n-step window), and with
    ``scheduler.samples_per_insert > 0`` ingest refuses a batch over
    ``scheduler.max_insert_batch``. Local, deterministic.

    Raises:
        ConfigError: naming ``dqn.n_step``, the rows and the limit.
    """
    most = envs_per_actor * hp.n_step
    if scheduler.samples_per_insert > 0 and most > scheduler.max_insert_batch:
        raise ConfigError(f"dqn.n_step = {hp.n_step} with {envs_per_actor} env(s) per actor "
                          f"makes ingests of up to {most} rows (every env ending an "
                          f"episode at once), over scheduler.max_insert_batch = "
                          f"{scheduler.max_insert_batch}, which the rate limiter refuses: "
                          f"lower dqn.n_step or dqn.num_envs, or raise "
                          f"scheduler.max_insert_batch (and error_buffer)", key="dqn.n_step")


def require_polls_within(job: object, timeout_s: float) -> None:
    """Refuse a job section's ``poll_every_s`` or ``report_every_s`` longer than
    ``run.timeout_s``: the learner looks for stop requests and budgets (and an actor
    reports its steps) this often; longer than the ranks' own waits, a SIGTERM or a
    reached budget went unnoticed and the job ran on to ``run.duration_s`` or its limit.
    Local, deterministic.

    Raises:
        ConfigError: naming ``job.<field>``, its value and the limit.
    """
    for name in ("poll_every_s", "report_every_s"):
        v = getattr(job, name)
        require(v <= timeout_s, f"job.{name}", v, f"<= run.timeout_s ({timeout_s:g} s)")


def require_network(world: LaunchWorld, key: str, hidden: Sequence[int],
                    in_features: int) -> None:
    """Refuse hidden-layer widths whose Q network a learner cannot hold in a node's
    memory: at least ``in_features x hidden[0] + hidden[0] x hidden[1] + ...``
    parameters (and biases), in 5 float32 copies (weights, target, gradients and Adam's
    two moments). Local, deterministic.

    Raises:
        ConfigError: naming ``key``, the widths, the bytes and the limit.
    """
    widths = [max(1, in_features), *hidden]
    params = sum(a * b + b for a, b in itertools.pairwise(widths))
    require_bytes(world, key, list(hidden), 5 * 4 * params,
                  f"on a learner (a Q network of at least {params:,} parameters from "
                  f"{in_features} inputs, in 5 float32 copies: weights, target, gradients "
                  f"and Adam's two moments)")


def check_dqn_launch(hp: DQNSection, world: LaunchWorld, *, in_features: int,
                     env_bytes: int = ENV_BYTES_FLOOR) -> None:
    """Refuse, before any rank starts, a ``[dqn]`` whose Q network or environments one
    rank cannot hold in a node's memory (the rank would fail or swap the node only once
    every rank had started). Lower bounds: the network's hidden layers from
    ``in_features`` inputs, in 5 float32 copies on a learner (weights, target,
    gradients and Adam's two moments); each actor's share of ``dqn.num_envs``
    environments at ``env_bytes`` each (with the actors unknown, ``layout.per_node``,
    the share of one rank of the world). Local, deterministic.

    Raises:
        ConfigError: naming ``dqn.hidden`` or ``dqn.num_envs``, the bytes and the limit.
    """
    require_network(world, "dqn.hidden", hp.hidden, in_features)
    share = world.actors if world.actors else max(1, world.ranks)
    envs = -(-hp.num_envs // share)
    require_bytes(world, "dqn.num_envs", hp.num_envs, envs * env_bytes,
                  f"on each actor ({envs:,} environments of at least {env_bytes:,} bytes "
                  f"each)")


def check_actor_rows(fields: Mapping[str, FieldConfig], rows: Mapping[str, np.ndarray],
                     stream: str = "") -> None:
    """Refuse, before any rank starts, a ``[spec]`` that the rows the actors write do
    not fit: ``rows`` is one row of each column an actor fills (its dtype and shape as
    the actor makes it), ``stream`` the frame stacks' stream field the actors fill with
    the env slot in the field's own type. A field no actor writes, a column with no
    field, a dtype that ingest would not cast or a shape that differs would each have
    failed every ingest once the job ran; a stream field that is one of ``rows`` would
    have been overwritten with env slots (the actions, say), silently. Local.

    Raises:
        ConfigError: naming ``spec.<field>`` (or ``spec.<stacked>.stack.stream``), the
            value and what the actors write.
    """
    from conduit_hpc.spec import Field, Spec

    written = ", ".join([*rows, *([stream] if stream else [])])
    if stream in rows:
        stacked = next((n for n, fc in fields.items() if fc.stack.stream == stream), "obs")
        raise ConfigError(f"spec.{stacked}.stack.stream must be a field of its own that "
                          f"the actors fill with the env slot, not one of "
                          f"{', '.join(rows)} (the actors would overwrite it with env "
                          f"slots), got {stream!r}", key=f"spec.{stacked}.stack.stream")
    for name in fields:
        if name != stream and name not in rows:
            raise ConfigError(f"spec.{name} must not be declared: the actors write "
                              f"{written} and nothing writes {name!r}, so every ingest "
                              f"would be refused", key=f"spec.{name}")
    for name, col in rows.items():
        fc = fields.get(name)
        if fc is None:
            raise ConfigError(f"spec.{name} must be declared: the actors write {written} "
                              f"(spec fields: {', '.join(fields)})", key=f"spec.{name}")
        try:
            Spec([Field(name, np.dtype(fc.dtype), fc.shape, cast=fc.cast)]).validate({name: col})
        except SpecError as err:
            raise ConfigError(f"spec.{name} must take what the actors write ({col.dtype} "
                              f"of shape {list(col.shape[1:])}), got {fc.dtype} of shape "
                              f"{list(fc.shape)}: {err}", key=f"spec.{name}") from err
