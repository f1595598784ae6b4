"""Test job: two learners average gradients every superstep; the second raises at
superstep 10 instead of entering the all-reduce while the first waits in it (and actors
ingest, the buffer serves). The job must end at once with one message naming the
failing rank and its error - not the first learner's collective timeout, not a hang."""

from __future__ import annotations

from pathlib import Path

import torch

from conduit_hpc import ConduitError, Config, ExperienceDataPlane, Role
from conduit_hpc.job import job_main
from conduit_hpc.plane.learner_group import LearnerGroup
from conduit_hpc.testing import checked_batch


def run(cfg: Config, run_dir: Path | None, resume: str) -> None:
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        group = LearnerGroup.open(edp, cfg.transport.collectives,
                                  timeout_s=cfg.run.timeout_s)
        if edp.role is Role.ACTOR:
            i = 0
            while not edp.should_stop:
                edp.ingest(checked_batch(edp.world_rank, 8 * i, 8))
                i += 1
        elif edp.serves:
            edp.serve()
        else:
            param = torch.nn.Parameter(torch.zeros(1000))
            param.grad = torch.ones(1000)
            for step in range(1000):
                edp.next_batch()
                if step == 10 and group.rank == 1:
                    raise ConduitError("injected failure on learner 1 at superstep 10")
                if group.agree(0) == 0:
                    group.average_gradients([param])
        group.close()
        edp.done()


if __name__ == "__main__":
    job_main(Config, run)
