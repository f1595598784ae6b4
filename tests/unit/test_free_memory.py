"""What a rank may still allocate: the node's free memory, or less where its memory
cgroup (a SLURM job's ``--mem``, a container's limit) leaves less.

The shard-memory check compared the shards of a node against the node's free memory
only: under a job cgroup of a few GB on a node with hundreds free, a capacity far past
the job's limit passed it, and the kernel killed the job while the windows were zeroed
(no named error). The cgroup files are read from a tree given here (real files, laid
out as the kernel shows them, v1 and v2)."""

from __future__ import annotations

import os
from pathlib import Path

from conduit_hpc.plane.memory import free_memory_bytes

GB = 10**9


def node_free() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v1_job_limit_less_usage_not_counting_droppable_cache(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    write(proc, "4:memory:/slurm/uid_0/job_7/step_0\n3:cpuset:/\n")
    job = tmp_path / "sys/memory/slurm/uid_0/job_7"
    write(job / "memory.limit_in_bytes", f"{4 * GB}\n")
    write(job / "memory.usage_in_bytes", f"{3 * GB}\n")
    write(job / "memory.stat", f"cache 1\ntotal_inactive_file {GB}\n")
    step = job / "step_0"  # no limit of its own (v1's "unlimited")
    write(step / "memory.limit_in_bytes", "9223372036854771712\n")
    write(step / "memory.usage_in_bytes", "100\n")
    assert free_memory_bytes(proc, tmp_path / "sys") == 2 * GB  # (the node has more free)


def test_v2_the_smallest_room_of_the_cgroup_and_those_above_it(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    write(proc, "0::/system.slice/job.scope\n")
    root = tmp_path / "sys"
    write(root / "system.slice/memory.max", f"{3 * GB}\n")
    write(root / "system.slice/memory.current", f"{GB}\n")
    write(root / "system.slice/job.scope/memory.max", "max\n")
    write(root / "system.slice/job.scope/memory.current", "5\n")
    write(root / "system.slice/job.scope/memory.stat", "inactive_file 0\n")
    assert free_memory_bytes(proc, root) == 2 * GB


def test_no_limit_or_no_cgroup_files_leave_the_node_free_memory(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    write(proc, "0::/\n4:memory:/gone\nnot a line\n")
    for got in (free_memory_bytes(proc, tmp_path / "sys"),
                free_memory_bytes(tmp_path / "missing", tmp_path / "sys")):
        assert got is not None and abs(got - node_free()) < node_free() // 10  # it moves
