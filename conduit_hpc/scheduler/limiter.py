"""The rate limiter: Reverb's ``SampleToInsertRatio`` as a plain state machine.

Learners wait while too few rows were inserted for the samples they took, actors wait
while too many. Settings under which both could wait forever are refused by
:class:`~conduit_hpc.config.SchedulerConfig` when the config loads.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LimiterState", "RateLimiter", "no_window_why"]


def no_window_why(window: int) -> str:
    """Why a sampler of ``window``-row items (the sequence sampler) finds nothing to
    draw in a shard that holds rows: the words of a learner's timeout."""
    return (f"no window of {window} rows of one stream's episode is drawable: episodes "
            f"shorter than {window} rows, windows whose rows all have priority 0, or rows "
            f"hidden while writers write (those they may overwrite next; the plan refuses "
            f"windows longer than half a written shard)")


@dataclass(frozen=True, slots=True)
class LimiterState:
    """Counters the limiter decides on.

    Attributes:
        inserts (int): rows admitted by actors (all actors together).
        samples (int): rows sampled by learners (all learners together).
        held (int): rows held in the buffers (for the minimum fill).
    """

    inserts: int
    samples: int
    held: int


@dataclass(frozen=True, slots=True)
class RateLimiter:
    """Samples-per-insert ratio with tolerance (Reverb's ``SampleToInsertRatio``).

    With ``diff = inserts * samples_per_insert - samples``, an insert of ``n`` rows is
    allowed while fewer than ``min_size_to_sample`` rows were inserted or
    ``diff + n * spi <= max_diff``, and a sample of ``n`` rows while ``diff - n >=
    min_diff`` and at least ``min_size_to_sample`` rows are held, where
    ``min_diff, max_diff = spi * min_size_to_sample -/+ error_buffer``.
    ``samples_per_insert = 0`` disables the ratio (only the minimum fill remains).

    Inserts are free until the fill is reached (as in Reverb, whose inserts are one item
    each; here the batch that crosses the fill is free too, so ``diff`` may pass
    ``max_diff`` by up to ``spi * (max_insert_batch - 1)`` once, and learners sample it
    back): no learner can sample before the fill, so an actor held back there would wait
    forever. With ``2 * error_buffer >= spi * max_insert_batch + batch_rows`` (checked by
    :class:`~conduit_hpc.config.SchedulerConfig`) one side can always move afterwards.
    With partitioned sampling the inserts are every partition's and the fill each
    learner's own: the plan then also needs ``error_buffer >= spi * ((partitions - 1) *
    min_size_to_sample + partitions * max_insert_batch)`` (checked when it is made,
    :mod:`conduit_hpc.plane.planning`), or actors are held before any partition fills.

    Args:
        samples_per_insert (float): target ratio (>= 0).
        min_size_to_sample (int): rows held before any sample.
        error_buffer (float): tolerance in rows.
    """

    samples_per_insert: float
    min_size_to_sample: int = 1
    error_buffer: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.samples_per_insert > 0

    @property
    def min_diff(self) -> float:
        return self.samples_per_insert * self.min_size_to_sample - self.error_buffer

    @property
    def max_diff(self) -> float:
        return self.samples_per_insert * self.min_size_to_sample + self.error_buffer

    def diff(self, s: LimiterState) -> float:
        return s.inserts * self.samples_per_insert - s.samples

    def can_insert(self, s: LimiterState, n: int) -> bool:
        """Whether ``n`` more rows may be admitted now."""
        if not self.enabled or s.inserts < self.min_size_to_sample:
            return True
        return self.diff(s) + n * self.samples_per_insert <= self.max_diff

    def can_sample(self, s: LimiterState, n: int) -> bool:
        """Whether ``n`` more rows may be sampled now."""
        if s.held < self.min_size_to_sample:
            return False
        if not self.enabled:
            return True
        return self.diff(s) - n >= self.min_diff

    def explain(self, s: LimiterState) -> str:
        """The state in words, for wait and timeout messages."""
        return (f"inserts={s.inserts} samples={s.samples} held={s.held} "
                f"diff={self.diff(s):g} allowed=[{self.min_diff:g}, {self.max_diff:g}] "
                f"min_size_to_sample={self.min_size_to_sample}")

    def explain_sampling(self, s: LimiterState, mass: float, held: int, window: int) -> str:
        """What a learner waiting to sample waits for, in words (its timeout): the state,
        the priority mass it could draw from and, with rows held but no mass, why (a
        window of ``window`` rows per item: the sequence sampler)."""
        why = (no_window_why(window) if window > 1 else
               "every row held has priority 0: none can be drawn")
        return f"{self.explain(s)}; total priority mass {mass:g}" + (
            f" ({why})" if held and not mass else "")
