"""Every config field has a reader: one source of truth per knob, and no dead knobs.

Walks the AST of ``conduit_hpc/`` (outside ``config/``, which declares and checks the
fields) and of ``jobs/`` for attribute names, and requires each field of each config
section - the library's and the jobs' own (found through their ``JOB_CONFIG``) - to be
read somewhere as ``something.<field>``. A field read by a section's ``@property``
(``SchedulerConfig.window`` reads ``burn_in`` and ``sequence_length``) counts as read
when that property is.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from conduit_hpc.config import Config, declared_config

REPO = Path(__file__).resolve().parents[2]

#: fields read by nothing yet, each with the reason. Keep this list short.
NOT_READ_YET: set[str] = set()


def attribute_names() -> set[str]:
    names: set[str] = set()
    files = [p for p in (REPO / "conduit_hpc").rglob("*.py") if "config" not in
             p.relative_to(REPO / "conduit_hpc").parts[:1]]
    files += sorted((REPO / "jobs").glob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
    # properties of the config sections pass the read on to the fields they use
    props: dict[str, set[str]] = {}
    for path in (REPO / "conduit_hpc" / "config").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
                props.setdefault(node.name, set()).update(
                    a.attr for a in ast.walk(node) if isinstance(a, ast.Attribute)
                    and isinstance(a.value, ast.Name) and a.value.id == "self")
    for name, used in props.items():
        if name in names:
            names |= used
    return names


def section_classes() -> set[type]:
    roots: list[type] = [Config]
    for toml in sorted((REPO / "jobs").glob("*.toml")):
        cls, _ = declared_config(toml)
        if cls is not None:
            roots.append(cls)
    seen: set[type] = set()

    def visit(tp: object) -> None:
        for arg in typing.get_args(tp):
            visit(arg)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp not in seen:
            seen.add(tp)
            for name, hint in typing.get_type_hints(tp).items():
                if name in {f.name for f in dataclasses.fields(tp)}:
                    visit(hint)

    for root in roots:
        visit(root)
    return seen


def test_job_scripts_declare_their_config() -> None:
    for name in ("synthetic", "dqn_cartpole", "longhaul_dqn"):
        cls, why = declared_config(REPO / "jobs" / f"{name}.toml")
        assert cls is not None and issubclass(cls, Config), why


def test_every_config_field_has_a_reader() -> None:
    read = attribute_names()
    classes = section_classes()
    assert len(classes) >= 14  # 10 library classes + the jobs' sections
    unread = sorted(f"{cls.__name__}.{f.name}" for cls in classes
                    for f in dataclasses.fields(cls)
                    if f.name not in read and f"{cls.__name__}.{f.name}" not in NOT_READ_YET)
    assert not unread, f"config fields nothing reads: {unread}"
