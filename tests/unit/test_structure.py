"""House rules that a reviewer would otherwise check by eye."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "conduit_hpc"

# module (relative, no suffix) -> packages of ours it may import
SEMANTIC = {"spec", "config", "errors", "storage", "placement"}
ALLOWED_OURS = {"config", "errors", "spec", "storage", "placement", "transport"}


def our_imports(path: Path) -> tuple[set[str], set[str]]:
    tree = ast.parse(path.read_text())
    ours, external = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = path.relative_to(PKG).parts
                base = list(parts[:-1])[: len(parts) - node.level]
                mod = (node.module or "").split(".")
                target = [*base, *mod] if node.module else base
                if target:
                    ours.add(".".join(target))
                else:  # "from . import x" at top level
                    ours.update(a.name for a in node.names)
            elif node.module:
                external.add(node.module)
        elif isinstance(node, ast.Import):
            external.update(a.name for a in node.names)
    return ours, external


def modules(prefix: str) -> list[Path]:
    p = PKG / prefix
    return sorted(p.rglob("*.py")) if p.is_dir() else [p.with_suffix(".py")]


@pytest.mark.parametrize("name", sorted(SEMANTIC))
def test_semantic_modules_import_no_mpi_nccl_or_h5py(name: str) -> None:
    for path in modules(name):
        ours, ext = our_imports(path)
        bad = {e for e in ext if e.split(".")[0] in {"mpi4py", "h5py", "cupy"}
               or e.startswith("torch.distributed")}
        assert not bad, f"{path.name} imports {bad}"
        # storage is written against the Transport protocol, and only that
        tops = {o.split(".")[0] for o in ours if o != "transport.base"}
        assert tops <= {"config", "errors", "spec", "storage", "placement"}, (path, ours)


def test_transport_knows_nothing_of_rl() -> None:
    for path in modules("transport"):
        ours, _ = our_imports(path)
        assert {o.split(".")[0] for o in ours} <= {"errors", "transport"}, (path.name, ours)


def test_h5py_only_in_checkpoint_and_no_pickle_anywhere() -> None:
    for path in PKG.rglob("*.py"):
        _, ext = our_imports(path)
        if path.name != "checkpoint.py" and "checkpoint" not in path.parts:
            assert "h5py" not in ext, path
        assert "pickle" not in ext, path


def test_no_module_is_too_long() -> None:
    for path in PKG.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 900, path


def test_import_has_no_side_effects() -> None:
    import subprocess
    import sys

    code = ("import sys, conduit_hpc, conduit_hpc.config, conduit_hpc.spec, "
            "conduit_hpc.storage, conduit_hpc.placement; "
            "assert 'mpi4py.MPI' not in sys.modules, 'MPI imported'; "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_rl_report_and_slurm_import_no_mpi_or_h5py() -> None:
    """DQN pieces, reports and sbatch rendering run on a login node without MPI."""
    for name in ("rl", "tools"):
        for path in modules(name):
            _, ext = our_imports(path)
            bad = {e for e in ext if e.split(".")[0] in {"mpi4py", "h5py"}
                   or e.startswith("torch.distributed")}
            assert not bad, f"{path.name} imports {bad}"
