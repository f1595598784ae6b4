"""Test job: the learner raises in the middle of a run while actors ingest and the buffer
serves. The job must end at once with one clear message and a non-zero status."""

from __future__ import annotations

from pathlib import Path

from conduit_hpc import ConduitError, Config, ExperienceDataPlane, Role
from conduit_hpc.job import job_main
from conduit_hpc.testing import checked_batch


def run(cfg: Config, run_dir: Path | None, resume: str) -> None:
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        if edp.role is Role.ACTOR:
            i = 0
            while not edp.should_stop:
                edp.ingest(checked_batch(edp.world_rank, 8 * i, 8))
                i += 1
        elif edp.serves:
            edp.serve()
        else:
            for step in range(1000):
                edp.next_batch()
                if step == 20:
                    raise ConduitError("injected failure at superstep 20")
        edp.done()


if __name__ == "__main__":
    job_main(Config, run)
