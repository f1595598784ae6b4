"""RLlib's DQN (new API stack) with its replay on the data plane, its loop unchanged.

RLlib's DQN keeps one replay buffer in the algorithm's process, built from
``config.replay_buffer_config`` (``from_config``: ``{"type": ...}`` is a class path), and
calls ``add(episodes)``, ``sample(num_items, n_step=, gamma=, beta=, ...)`` and - for a
subclass of ``PrioritizedEpisodeReplayBuffer`` - ``update_priorities(td_errors)`` (see
``ray/rllib/algorithms/dqn/dqn.py`` ``_training_step_new_api_stack``, Ray 2.60).
:class:`DataPlaneEpisodeReplayBuffer` is such a subclass: the user's change is the
buffer's ``type`` (:data:`BUFFER_TYPE`) and launching under ``conduit-hpc run``.

* The algorithm's process is the **learner** rank of the MPI job and also ingests
  (``[layout] learners_ingest = true``); **buffer** ranks hold the replay.
* ``add`` turns RLlib's episode chunks into n-step transitions on ingest (one
  ``ingest`` per call): ``obs, action, reward`` (the discounted sum of ``n_step``
  rewards), ``next_obs`` (``n_step`` later), ``terminated``, ``n_step``. A step whose
  ``t + n_step`` lies past its episode's end is never stored, as RLlib's own buffer never
  samples it.
* ``sample`` is the data plane's ``next_batch`` (prefetched in ``edp`` mode while RLlib
  collects and learns) turned into RLlib's 1-step episodes ``(o_t, a_t, R, o_t+n)`` with
  ``weights`` and ``n_step`` in their extra model outputs; ``update_priorities`` sends
  the TD errors to the owners.

What differs from RLlib's ``PrioritizedEpisodeReplayBuffer``: n-step returns are fixed
at ingest (``n_step`` a single int, and ``sample``'s ``gamma``/``n_step`` must be the
algorithm's), capacity, priority exponent and beta come from ``[storage]`` and
``[scheduler]`` (a replay-buffer key that disagrees is refused), the batch size is
``scheduler.batch_rows``, and sampled transitions carry ``truncated = False`` (DQN's
loss reads only ``terminated``). Stateful modules (sequences) are refused.

Call :func:`check_algo_config` before Ray starts (it raises :class:`ConfigError` naming
the key), build the algorithm inside :func:`data_plane_for` (which also owns
``ray.init``/``ray.shutdown``). See ``jobs/rllib_dqn_cartpole.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (
    PrioritizedEpisodeReplayBuffer,
)

from conduit_hpc import Config, ConfigError, ExperienceDataPlane, Role
from conduit_hpc.errors import SpecError
from conduit_hpc.integrations.nstep import SPEC_FIELDS, NStepAssembler
from conduit_hpc.spec import as_array

__all__ = ["BASELINE_TYPE", "BUFFER_KEYS", "BUFFER_TYPE", "SPEC_FIELDS",
           "DataPlaneEpisodeReplayBuffer", "NStepAssembler", "PathTimes",
           "TimedPrioritizedEpisodeReplayBuffer", "check_algo_config", "data_plane_for"]

#: the ``replay_buffer_config["type"]`` that puts RLlib's replay on the data plane
BUFFER_TYPE = "conduit_hpc.integrations.rllib.DataPlaneEpisodeReplayBuffer"
#: RLlib's own prioritized buffer, timed like ours (the baseline of ``bench rllib``)
BASELINE_TYPE = "conduit_hpc.integrations.rllib.TimedPrioritizedEpisodeReplayBuffer"
#: keys the buffer's config may hold (``metrics_num_episodes_for_smoothing`` is RLlib's)
BUFFER_KEYS = ("type", "capacity", "alpha", "beta", "metrics_num_episodes_for_smoothing")


def _key(name: str) -> str:
    return f"replay_buffer_config.{name}"


def _same(v: Any, want: float) -> bool:
    """``v`` is a number close to ``want`` (as RLlib's float config values go)."""
    try:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isclose(
            v, want)
    except OverflowError:  # an int beyond float
        return False


def check_algo_config(algo: DQNConfig, config: Config) -> None:
    """Check an RLlib DQN config against the job's config, before Ray starts.

    Local, no MPI, deterministic: every rank that calls it with the same configs raises
    the same error.

    Raises:
        ConfigError: naming the key (``replay_buffer_config.<key>``, ``n_step``,
            ``train_batch_size_per_learner``, ``scheduler.min_fill_rows``, ``layout.*``,
            ``spec``), its value and what was expected.
    """
    raw = algo.replay_buffer_config
    if not isinstance(raw, Mapping):
        raise ConfigError(f"replay_buffer_config must be a dict with 'type' = "
                          f"{BUFFER_TYPE!r}, got {type(raw).__name__} {raw!r:.80}",
                          key="replay_buffer_config")
    rb = dict(raw)
    for k in rb:
        if k not in BUFFER_KEYS:
            raise ConfigError(f"{_key(k)} is not a key of {BUFFER_TYPE.rsplit('.', 1)[1]} "
                              f"(got {rb[k]!r}); expected one of {', '.join(BUFFER_KEYS)}",
                              key=_key(k))
    if rb.get("type") in (BASELINE_TYPE, TimedPrioritizedEpisodeReplayBuffer):
        return  # RLlib's own replay: its keys are RLlib's, the data plane holds nothing
    if rb.get("type") not in (BUFFER_TYPE, DataPlaneEpisodeReplayBuffer):
        raise ConfigError(f"{_key('type')} must be {BUFFER_TYPE!r}, got {rb.get('type')!r}",
                          key=_key("type"))
    twins = {"capacity": ("storage.capacity_rows", config.storage.capacity_rows),
             "alpha": ("storage.priority_exponent", config.storage.priority_exponent),
             "beta": ("scheduler.beta", config.scheduler.beta)}
    for k, (where, want) in twins.items():
        v = rb.get(k, want)
        if not _same(v, want):
            raise ConfigError(f"{_key(k)} = {v!r} disagrees with {where} = {want!r} "
                              f"(the data plane's value; drop the key or make them equal)",
                              key=_key(k))
    if not algo.enable_env_runner_and_connector_v2:
        raise ConfigError("api_stack(enable_env_runner_and_connector_v2=False): the old API "
                          "stack samples SampleBatches from another buffer API; expected "
                          "RLlib's new API stack (the default), whose DQN adds episodes",
                          key="enable_env_runner_and_connector_v2")
    if algo.is_multi_agent:
        raise ConfigError(f"multi_agent(policies={sorted(map(str, algo.policies))!r}): "
                          f"expected a single-agent DQN (one module; RLlib's episode "
                          f"buffers are single-agent too)", key="policies")
    g = algo.gamma
    if isinstance(g, bool) or not isinstance(g, int | float) or not 0 <= g <= 1:
        raise ConfigError(f"gamma must be a number in [0, 1] (n-step returns are summed "
                          f"with it on ingest), got {g!r}", key="gamma")
    n = algo.n_step
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"n_step must be one int >= 1 on the data plane (returns are "
                          f"summed on ingest), got {n!r}", key="n_step")
    if algo.train_batch_size_per_learner != config.scheduler.batch_rows:
        raise ConfigError(f"train_batch_size_per_learner = "
                          f"{algo.train_batch_size_per_learner!r} must equal "
                          f"scheduler.batch_rows = {config.scheduler.batch_rows}",
                          key="train_batch_size_per_learner")
    model = algo.model_config  # a dict, or RLlib's DefaultModelConfig dataclass
    flag = (model.get if isinstance(model, Mapping)
            else lambda name: getattr(model, name, None))
    if flag("use_lstm") or flag("use_attention"):
        raise ConfigError("model_config use_lstm/use_attention: a stateful module samples "
                          "sequences, which this buffer does not", key="model_config")
    if algo.num_learners != 0:
        raise ConfigError(f"num_learners must be 0 (the update runs in this rank), got "
                          f"{algo.num_learners}", key="num_learners")
    starts = algo.num_steps_sampled_before_learning_starts
    if isinstance(starts, bool) or not isinstance(starts, int) or starts < 0:
        raise ConfigError(f"num_steps_sampled_before_learning_starts must be an int >= 0, "
                          f"got {starts!r}", key="num_steps_sampled_before_learning_starts")
    if config.scheduler.min_fill_rows > starts // n:
        raise ConfigError(f"scheduler.min_fill_rows = {config.scheduler.min_fill_rows} must "
                          f"be <= num_steps_sampled_before_learning_starts // n_step = "
                          f"{starts // n}: the first sample comes after that many "
                          f"transitions at least, and nothing else ingests",
                          key="scheduler.min_fill_rows")
    lay = config.layout
    if not (lay.learners == 1 and lay.learners_ingest and lay.actors == 0):
        raise ConfigError(f"[layout] must be learners = 1, learners_ingest = true, actors "
                          f"= 0 (the algorithm's process collects and learns), got "
                          f"{lay.learners}, {lay.learners_ingest}, {lay.actors}",
                          key="layout")
    missing = [f for f in SPEC_FIELDS if f not in config.spec]
    if missing:
        raise ConfigError(f"[spec] lacks {missing}; the transitions fill {SPEC_FIELDS}",
                          key="spec")


@dataclass
class PathTimes:
    """Seconds the training loop spent on the experience path, per call, in order.

    Attributes:
        add_s, sample_s, update_s (list[float]): each ``add``, ``sample``,
            ``update_priorities`` call.
        fetch_s (list[float]): the part of each ``sample`` spent getting the rows (the
            data plane's ``next_batch``; all of it for RLlib's own buffer), not building
            RLlib's episodes from them.
        iteration_s (list[float]): between successive ``sample`` calls (one DQN
            training step: collect, add, sample, learn, update).
    """

    add_s: list[float] = field(default_factory=list)
    sample_s: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    fetch_s: list[float] = field(default_factory=list)
    iteration_s: list[float] = field(default_factory=list)


@dataclass
class _Active:
    edp: ExperienceDataPlane
    gamma: float
    n_step: int
    times: PathTimes


_ACTIVE: list[_Active] = []


@contextmanager
def data_plane_for(edp: ExperienceDataPlane, algo: DQNConfig, *,
                   ray_cpus: int = 1) -> Iterator[PathTimes]:
    """Make ``edp`` the replay of the DQN algorithm built inside; start and stop Ray.

    On the learner rank only. Starts a local Ray instance of its own (``address =
    "local"``, ``ray_cpus`` CPUs, no dashboard) and always shuts it down on the way out.

    Yields:
        PathTimes: the experience-path times, filled as the algorithm runs.

    Raises:
        ConfigError: not a learner rank, ``check_algo_config`` fails, or Ray already
            runs in this process (its Ray is left running).
    """
    if edp.role is not Role.LEARNER:
        raise ConfigError(f"the RLlib algorithm runs on the learner rank; world rank "
                          f"{edp.world_rank} has the role {edp.role.value!r}", key="layout")
    check_algo_config(algo, edp.config)
    if ray.is_initialized():  # before: ray.init's RuntimeError, and the finally below
        # shut the script's own Ray down
        raise ConfigError("Ray is already running in this process (a ray.init() in the "
                          "script?); expected none: data_plane_for starts a local Ray of "
                          "its own and shuts it down on the way out (drop the script's "
                          "ray.init() / ray.shutdown())", key="ray.init")
    active = _Active(edp, float(algo.gamma), int(algo.n_step), PathTimes())
    _ACTIVE.append(active)
    try:
        ray.init(address="local", num_cpus=ray_cpus, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
        yield active.times
    finally:
        _ACTIVE.remove(active)
        ray.shutdown()


class DataPlaneEpisodeReplayBuffer(PrioritizedEpisodeReplayBuffer):  # type: ignore[misc]
    """RLlib's prioritized episode buffer interface over the data plane (see the module
    docstring). Built by RLlib (``from_config``) inside :func:`data_plane_for`.

    Raises:
        ConfigError: built outside :func:`data_plane_for`, or with a key not in
            :data:`BUFFER_KEYS` (RLlib passes them as keyword arguments).
    """

    def __init__(self, capacity: int | None = None, *, alpha: float | None = None,
                 beta: float | None = None, metrics_num_episodes_for_smoothing: int = 100,
                 **kwargs: Any) -> None:
        if kwargs:
            k = sorted(kwargs)[0]
            raise ConfigError(f"{_key(k)} is not a key of DataPlaneEpisodeReplayBuffer "
                              f"(got {kwargs[k]!r}); expected one of {', '.join(BUFFER_KEYS)}",
                              key=_key(k))
        if not _ACTIVE:
            raise ConfigError("DataPlaneEpisodeReplayBuffer is built inside "
                              "conduit_hpc.integrations.rllib.data_plane_for(edp, config) "
                              "on the learner rank of a conduit-hpc job", key=_key("type"))
        a = _ACTIVE[-1]
        self.edp, self.gamma, self.n_step, self.times = a.edp, a.gamma, a.n_step, a.times
        cfg = self.edp.config
        super().__init__(capacity=1, batch_size_B=cfg.scheduler.batch_rows, batch_length_T=1,
                         alpha=cfg.storage.priority_exponent,
                         metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing)
        self.capacity, self.beta = cfg.storage.capacity_rows, cfg.scheduler.beta
        self.assembler = NStepAssembler(self.n_step, self.gamma)
        self._last: np.ndarray | None = None
        self._spaces: tuple[Any, Any] = (None, None)
        self._added = 0
        self._last_sample_at: float | None = None

    # -- add: episodes -> n-step transitions -> ingest ---------------------------------
    def add(self, episodes: Any, weight: float | None = None) -> None:  # type: ignore[override]
        """Ingest the n-step transitions that these episode chunks complete (one
        ``ingest``). Blocks only as ``ingest`` does.

        Raises:
            SpecError: not single-agent episodes, or rows the spec refuses (nothing is
                stored, and the episodes' pending steps are as before the call)."""
        t0 = time.perf_counter()
        eps = episodes if isinstance(episodes, list | tuple) else [episodes]
        for ep in eps:
            if not isinstance(ep, SingleAgentEpisode):
                raise SpecError(f"add() takes RLlib SingleAgentEpisode chunks (a "
                                f"single-agent DQN's), got a {type(ep).__name__}")
        before = dict(self.assembler.open)  # its lists are never changed in place
        try:
            batch = self.assembler.add(eps)
            if batch is not None:
                self.edp.ingest(batch)
        except BaseException:  # nothing stored: the episodes' open steps stay as they were
            self.assembler.open = before
            raise
        self._added += 0 if batch is None else len(batch["obs"])
        if eps:
            self._spaces = (eps[-1].observation_space, eps[-1].action_space)
        self.times.add_s.append(time.perf_counter() - t0)

    # -- sample: next_batch -> RLlib's 1-step episodes ---------------------------------
    def sample(self, num_items: int | None = None, *, batch_size_B: int | None = None,
               batch_length_T: int | None = None, n_step: Any = None, beta: Any = None,
               gamma: float = 0.99, include_infos: bool = False,
               include_extra_model_outputs: bool = False, to_numpy: bool = False,
               **kwargs: Any) -> Any:  # type: ignore[override]
        """The data plane's next batch as RLlib's list of 1-step episodes. Blocks until
        it is ready (bounded by ``run.timeout_s``; prefetched in ``edp`` mode).

        Raises:
            ConfigError: a size, ``n_step``, ``gamma`` or ``beta`` other than the job's,
                a sequence length or lookback, infos / extra model outputs asked for, or
                an argument RLlib's DQN does not pass (naming it).
        """
        t0 = time.perf_counter()
        if self._last_sample_at is not None:
            self.times.iteration_s.append(t0 - self._last_sample_at)
        self._last_sample_at = t0
        # None is "the default"; a 0 is a size asked for (and refused), not the default -
        # except batch_length_T, where RLlib's own DQN passes 0 for "no time axis"
        rows = next((v for v in (num_items, batch_size_B) if v is not None),
                    self.batch_size_B)
        want = {"num_items": (rows, self.batch_size_B),
                "n_step": (1 if n_step is None else n_step, self.n_step),
                "gamma": (gamma, self.gamma),
                "batch_length_T": (batch_length_T or 1, 1),
                "include_infos": (include_infos, False),
                "include_extra_model_outputs": (include_extra_model_outputs, False),
                "beta": (self.beta if beta is None or _same(beta, self.beta) else beta,
                         self.beta),
                # RLlib's DQN passes these (a stateful module's; refused at the config)
                "lookback": (kwargs.pop("lookback", 0), 0),
                "min_batch_length_T": (kwargs.pop("min_batch_length_T", 0), 0)}
        kwargs.pop("sample_episodes", None)  # DQN's: episodes are all this buffer gives
        if kwargs:
            k = sorted(kwargs)[0]
            raise ConfigError(f"sample({k}={kwargs[k]!r}): not an argument this buffer "
                              f"takes (RLlib's DQN passes num_items, n_step, gamma, beta, "
                              f"batch_length_T, lookback, min_batch_length_T, "
                              f"sample_episodes)", key=k)
        for k, (got, ok) in want.items():
            if got != ok:
                raise ConfigError(f"sample({k}={got!r}): the data plane's replay serves "
                                  f"{k} = {ok!r} only", key=k)
        b = self.edp.next_batch()
        self.times.fetch_s.append(time.perf_counter() - t0)
        d = {k: v.numpy() for k, v in b.data.items()}
        w = b.weights.numpy()
        self._last = b.indices
        obs_space, act_space = self._spaces
        out = [SingleAgentEpisode(
            observations=[d["obs"][i], d["next_obs"][i]], observation_space=obs_space,
            actions=[d["action"][i]], action_space=act_space, rewards=[d["reward"][i]],
            terminated=bool(d["terminated"][i]), truncated=False,
            extra_model_outputs={"weights": [w[i]], "n_step": [d["n_step"][i]]},
            len_lookback_buffer=0, t_started=0) for i in range(len(w))]
        if to_numpy:
            for ep in out:
                ep.to_numpy()
        self.sampled_timesteps += len(out)
        self.times.sample_s.append(time.perf_counter() - t0)
        return out

    def update_priorities(self, priorities: Any, module_id: Any = None) -> None:
        """The last batch's new priorities (RLlib's TD errors; their absolute values,
        at least 1e-12 as RLlib's). Never blocks on the network.

        Raises:
            SpecError: not one real number per row of the last sample, or no sample to
                update (before the first, or a second update of one sample)."""
        t0 = time.perf_counter()
        what = "update_priorities: priorities (RLlib's TD errors)"
        arr = as_array(priorities, what)  # by the data plane's rule: a SpecError if bad
        if self._last is None:  # RLlib's own buffer: an AssertionError (no rows to update)
            if arr.size == 0:
                return
            raise SpecError(f"{what}: {arr.size} values but no sample to update (before "
                            f"the first sample(), or a second update of one sample); "
                            f"expected one update per sample(), after it")
        if arr.dtype.kind == "c" or arr.shape != (len(self._last),):
            raise SpecError(f"{what} must be {len(self._last)} real numbers, one per row "
                            f"of the last sample, got dtype {arr.dtype} shape "
                            f"{tuple(arr.shape)}")
        p = np.maximum(np.abs(arr.astype(np.float64)), 1e-12)
        self.edp.update_priorities(self._last, p)
        self._last = None
        self.times.update_s.append(time.perf_counter() - t0)

    # -- what RLlib reads ----------------------------------------------------------------
    def get_num_timesteps(self, module_id: Any = None) -> int:
        """Transitions this rank ingested, at most the replay's capacity."""
        return min(self._added, self.capacity)

    def get_added_timesteps(self, module_id: Any = None) -> int:
        return self._added

    def get_state(self) -> dict[str, Any]:
        """Counters only: the replay lives on the buffer ranks (checkpoint it with the
        data plane's ``[checkpoint]``)."""
        return {"added": self._added, "sampled": self.sampled_timesteps}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """The counters of :meth:`get_state`.

        Raises:
            ValueError: not a mapping, or a counter that is not an int >= 0 (nothing set).
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"set_state takes the dict of get_state(), got "
                             f"{type(state).__name__}")
        got = {k: state.get(k, 0) for k in ("added", "sampled")}
        for k, v in got.items():
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
                raise ValueError(f"set_state: {k!r} must be an int >= 0, got {v!r}")
        self._added, self.sampled_timesteps = int(got["added"]), int(got["sampled"])


class TimedPrioritizedEpisodeReplayBuffer(PrioritizedEpisodeReplayBuffer):  # type: ignore[misc]
    """RLlib's own ``PrioritizedEpisodeReplayBuffer``, unchanged but for the same
    experience-path timers as :class:`DataPlaneEpisodeReplayBuffer` (into the
    :class:`PathTimes` of the enclosing :func:`data_plane_for`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.times = _ACTIVE[-1].times if _ACTIVE else PathTimes()
        self._last_sample_at: float | None = None

    def add(self, episodes: Any, weight: float | None = None) -> None:  # type: ignore[override]
        t0 = time.perf_counter()
        super().add(episodes, weight)
        self.times.add_s.append(time.perf_counter() - t0)

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        if self._last_sample_at is not None:
            self.times.iteration_s.append(t0 - self._last_sample_at)
        self._last_sample_at = t0
        out = super().sample(*args, **kwargs)
        self.times.sample_s.append(time.perf_counter() - t0)
        self.times.fetch_s.append(self.times.sample_s[-1])
        return out

    def update_priorities(self, priorities: Any, module_id: Any = None) -> None:
        t0 = time.perf_counter()
        super().update_priorities(priorities, module_id)
        self.times.update_s.append(time.perf_counter() - t0)
