"""The tree drawn in ``agentsnap.exceptions``' docstring is the package's real class tree."""

from __future__ import annotations

import importlib
import pkgutil
import re

import agentsnap
import agentsnap.exceptions
from agentsnap.exceptions import AgentsnapError, Signal

_NODE = re.compile(r"^((?:│   |    )*)(├── |└── )?([A-Z]\w*)")


def drawn_tree() -> dict[str, str | None]:
    """Each class the docstring draws, with the class drawn as its parent (``None``: a root)."""
    doc = agentsnap.exceptions.__doc__
    assert doc is not None
    drawing = doc.split("```")[1]
    parents: dict[str, str | None] = {}
    path: list[str] = []
    for line in drawing.splitlines():
        found = _NODE.match(line)
        if found is None:
            continue  # a blank line, or a note continued from the line above
        prefix, connector, name = found.groups()
        depth = len(prefix) // 4 + (1 if connector else 0)
        assert depth <= len(path), f"{name!r} is drawn deeper than a child of the line above"
        del path[depth:]
        assert name not in parents, f"{name!r} is drawn twice"
        parents[name] = path[-1] if path else None
        path.append(name)
    return parents


def real_tree() -> dict[str, str | None]:
    """Each error class the package defines, with its base in the tree."""
    for module in pkgutil.walk_packages(agentsnap.__path__, "agentsnap."):
        importlib.import_module(module.name)
    parents: dict[str, str | None] = {}
    pending: list[type[BaseException]] = [AgentsnapError, Signal]
    while pending:
        cls = pending.pop()
        if not cls.__module__.startswith("agentsnap"):
            continue  # a test's own subclass
        bases = [b for b in cls.__bases__ if issubclass(b, (AgentsnapError, Signal))]
        assert len(bases) <= 1, f"{cls.__name__} has two bases in the tree: {bases}"
        assert cls.__name__ not in parents, f"two error classes are named {cls.__name__}"
        parents[cls.__name__] = bases[0].__name__ if bases else None
        pending.extend(cls.__subclasses__())
    return parents


def test_the_drawing_names_every_error_class_under_its_real_base() -> None:
    drawn, real = drawn_tree(), real_tree()
    missing = sorted(set(real) - set(drawn))
    assert not missing, f"classes missing from the drawing: {missing}"
    unknown = sorted(set(drawn) - set(real))
    assert not unknown, f"the drawing names classes that do not exist: {unknown}"
    misplaced = {name: (drawn[name], real[name]) for name in real if drawn[name] != real[name]}
    assert not misplaced, f"drawn under the wrong parent (drawn, real): {misplaced}"


def test_the_parser_sees_the_shape_of_the_drawing() -> None:
    drawn = drawn_tree()
    assert drawn["AgentsnapError"] is None
    assert drawn["Signal"] is None
    assert drawn["SchemaOutOfDate"] == "StoreError"
    assert drawn["ApprovalDenied"] == "ToolFailed"
    assert drawn["OutputRejected"] == "Signal"


def test_the_errors_defined_for_everyone_are_exported_here_and_from_the_package() -> None:
    # The classes the drawing does not place in another module (integrations, workers, the
    # spool, retention) are importable from agentsnap.exceptions and from agentsnap.
    elsewhere = {"AgentsHeld", "MissingExtraError", "CheckpointMissing"}
    elsewhere |= {"SpoolError", "DeleteRefused"}
    drawn = set(drawn_tree()) - elsewhere
    assert drawn <= set(agentsnap.exceptions.__all__), sorted(
        drawn - set(agentsnap.exceptions.__all__)
    )
    assert drawn <= set(agentsnap.__all__), sorted(drawn - set(agentsnap.__all__))
