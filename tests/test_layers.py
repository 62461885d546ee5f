"""Imports run one way: each layer imports only the layers below it, even for type checking.

Every ``import`` of every module of the package counts, wherever it stands (at the top, in a
function, under ``TYPE_CHECKING``). These are the contracts the package keeps; the layering
of the bus, agents, snapshot and rollback modules among themselves is not checked yet.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "agentsnap"

FOUNDATION = {
    "agentsnap.exceptions",
    "agentsnap.limits",
    "agentsnap.messages",
    "agentsnap.state",
    "agentsnap.records",
    "agentsnap.liveness",
    "agentsnap.semconv",
}
"""Data types and rules every layer uses; they import nothing but each other."""

CONTRACTS: dict[str, set[str]] = {
    **dict.fromkeys(FOUNDATION, FOUNDATION),
    "agentsnap.checks": FOUNDATION | {"agentsnap.bus"},
    "agentsnap.ledger": FOUNDATION | {"agentsnap.store"},
    "agentsnap.once": FOUNDATION | {"agentsnap.ledger", "agentsnap.store"},
    "agentsnap.store": FOUNDATION | {"agentsnap.ledger", "agentsnap.integrity", "agentsnap.store"},
    "agentsnap.fork": FOUNDATION | {"agentsnap.store"},
}
"""For a module (or a package, with everything in it): the only agentsnap modules it may
import (a package allows its modules too)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports; ``from agentsnap import x`` counts as ``agentsnap.x``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "agentsnap":
                found.update(f"agentsnap.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
    return found


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def allowed(importer: str, imported: str) -> bool:
    for scope, permitted in CONTRACTS.items():
        if importer == scope or importer.startswith(scope + "."):
            return any(imported == p or imported.startswith(p + ".") for p in permitted)
    return True


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_the_layers_below_it(module: str) -> None:
    wrong = sorted(
        imported
        for imported in imports(MODULES[module])
        if imported.startswith("agentsnap") and imported != module
        if not allowed(module, imported)
    )
    assert not wrong, f"{module} imports {wrong}, above it"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_store_imports_sqlalchemy(module: str) -> None:
    if module == "agentsnap.store" or module.startswith("agentsnap.store."):
        return
    using = sorted(name for name in imports(MODULES[module]) if name.split(".")[0] == "sqlalchemy")
    assert not using, f"{module} imports {using}; only agentsnap.store may"


def test_the_contracts_name_modules_that_exist() -> None:
    named = set(CONTRACTS) | set().union(*CONTRACTS.values())
    assert named <= set(MODULES), sorted(named - set(MODULES))
