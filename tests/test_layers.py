"""Imports run one way: each layer imports only the layers below it, even for type checking.

Every ``import`` of every module of the package counts, wherever it stands (at the top, in a
function, under ``TYPE_CHECKING``), and no module imports itself through others, even within
a layer. The layers, from the bottom::

    foundation   _errors, _uninterrupted, exceptions, limits, messages, state, versions,
                 records, handles, integrity, liveness, semconv, models, redaction: data types
                 and rules; they import nothing but each other
    store        store/, ledger, once, ownership, fork, model_calls, requests: persistence,
                 the exactly-once machine, forks of stored cuts, recorded model calls,
                 requests to people; the store's contract is a set of roles
                 (store/_roles), and SqlStore is one part per role on a shared base
                 (store/_sql_*.py, see SQL_STORE_PARTS)
    bus          channels, the transport and observer protocols, schedulers; jetstream, the
                 transport carrying channels between processes on NATS (bus-level only)
    checks       verdicts, checks, the guard          telemetry, replay: see the bus only
    agents       _handler: the runtime's state behind a handler's context, out of users'
                 reach; Agent, Context (a snapshot Initiator protocol, not the coordinator)
    snapshot     the Chandy-Lamport coordinator, its observer protocol
    rollback     retry policy and budget, restoring a cut through Bus.restore, the current cut
    journal      a bus observer writing to the store
    tools        side-effecting tools on the ledger
    kernel       _team: one process's agents and how a message is handled, in both modes;
                 _following: its replay log written and its replay plans followed, in both
    distributed  agents hosted over processes: the kernel, snapshot parts and two-phase
                 rollback on jetstream
    runtime      the facade over its collaborators (_phases, _record, _cadence, _recovery,
                 _closing, which never import it); above it only the public face:
                 the package itself, inspect (with _running, _events, and _views, the
                 typed results it shares with ui and cli), timeline, ui, cli (a module per
                 group of commands, one formatter), demo, testing, integrations, which
                 nothing below imports

Within the inspector (``ui``), the server wires one private module of routes per area of the
API, and no area imports another. Its page is ES modules in ``ui/static`` layered the same
way: what draws without a server (DOM helpers, JSON tree, schema checker, space-time view)
imports nothing above it, so that the exported page (``agentsnap timeline``) inlines only
those.
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections import deque
from pathlib import Path

import pytest

from agentsnap import timeline

PACKAGE = Path(__file__).resolve().parent.parent / "agentsnap"

FOUNDATION = {
    "agentsnap._errors",
    "agentsnap._uninterrupted",
    "agentsnap.exceptions",
    "agentsnap.limits",
    "agentsnap.messages",
    "agentsnap.state",
    "agentsnap.records",
    "agentsnap.handles",
    "agentsnap.integrity",
    "agentsnap.liveness",
    "agentsnap.semconv",
    "agentsnap.models",
    "agentsnap.redaction",
    "agentsnap.versions",
}
"""Data types and rules every layer uses; they import nothing but each other."""

STORE = {
    "agentsnap.store",
    "agentsnap.ledger",
    "agentsnap.once",
    "agentsnap.ownership",
    "agentsnap.fork",
    "agentsnap.model_calls",
    "agentsnap.requests",
}
"""Persistence: the store package, the ledger protocols, the exactly-once state machine,
run ownership and forking a run from a stored cut. They know the data types only."""

BUS = FOUNDATION | {"agentsnap.bus"}
AGENTS = BUS | STORE | {"agentsnap.checks", "agentsnap.telemetry", "agentsnap.replay"}
HANDLER = AGENTS | {"agentsnap._handler"}
ROLLBACK = BUS | {"agentsnap.checks", "agentsnap.replay", "agentsnap.snapshot"}
KERNEL = HANDLER | {"agentsnap.agents", "agentsnap.snapshot", "agentsnap.rollback"}
RUNTIME_PARTS = {
    "agentsnap._phases",
    "agentsnap._record",
    "agentsnap._cadence",
    "agentsnap._recovery",
    "agentsnap._closing",
}
"""The runtime's collaborators, each with one job: they know each other and what is below the
runtime, never the runtime itself."""
BELOW_RUNTIME = KERNEL | {
    "agentsnap.journal",
    "agentsnap.tools",
    "agentsnap._team",
    "agentsnap._following",
}

CONTRACTS: dict[str, set[str]] = {
    **dict.fromkeys(FOUNDATION, FOUNDATION),
    **dict.fromkeys(STORE, FOUNDATION | STORE),
    "agentsnap.bus": FOUNDATION,
    "agentsnap.jetstream": BUS | {"agentsnap.jetstream"},
    "agentsnap.checks": BUS,
    "agentsnap.telemetry": BUS,
    "agentsnap.replay": BUS,
    "agentsnap._handler": AGENTS,
    "agentsnap.agents": HANDLER,
    "agentsnap.snapshot": BUS,
    "agentsnap.rollback": ROLLBACK,
    "agentsnap.journal": BUS | STORE,
    "agentsnap.tools": HANDLER | {"agentsnap.agents"},
    "agentsnap._team": KERNEL,
    "agentsnap._following": KERNEL | {"agentsnap._team"},
    "agentsnap.distributed": KERNEL
    | {"agentsnap._team", "agentsnap._following", "agentsnap.jetstream", "agentsnap.distributed"},
    **dict.fromkeys(RUNTIME_PARTS, BELOW_RUNTIME | RUNTIME_PARTS),
    "agentsnap.runtime": BELOW_RUNTIME | RUNTIME_PARTS | {"agentsnap._hints"},
}
"""For a module (or a package, with everything in it): the only agentsnap modules it may
import (a package allows its modules too). Modules not named here are above the runtime."""

PUBLIC_FACE = {
    "agentsnap._events",
    "agentsnap._running",
    "agentsnap._views",
    "agentsnap.cli",
    "agentsnap.demo",
    "agentsnap.inspect",
    "agentsnap.integrations",
    "agentsnap.testing",
    "agentsnap.timeline",
    "agentsnap.ui",
}
"""Built on the public API; only each other, ``__main__`` and the package's ``__init__`` may
import them."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports; ``from agentsnap import x`` counts as ``agentsnap.x``,
    and ``from agentsnap.x import y`` as ``agentsnap.x.y`` when that is a module.
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if node.module == "agentsnap" or name in MODULES else node.module)
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


@pytest.mark.parametrize("module", sorted(MODULES))
def test_nothing_below_the_public_face_imports_it(module: str) -> None:
    if module in {"agentsnap", "agentsnap.__main__"} or _within(module, PUBLIC_FACE):
        return
    wrong = sorted(name for name in imports(MODULES[module]) if _within(name, PUBLIC_FACE))
    assert not wrong, f"{module} imports {wrong}, which only the public face may"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_bus_reaches_into_a_channel(module: str) -> None:
    """Channels are reached through the ``Channel`` protocol; their storage is the bus's."""
    if module == "agentsnap.bus":
        return
    tree = ast.parse(MODULES[module].read_text())
    private = sorted(
        {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in {"queue", "_items"}
        }
    )
    assert not private, f"{module} touches a channel's storage ({private})"


def test_the_runtime_is_imported_by_the_public_face_only() -> None:
    users = sorted(
        module
        for module, path in MODULES.items()
        if "agentsnap.runtime" in imports(path)
        and module not in {"agentsnap", "agentsnap.runtime"}
        and not _within(module, PUBLIC_FACE)
    )
    assert not users, f"{users} import the runtime; only the public face may"


def _within(name: str, scopes: set[str]) -> bool:
    return any(name == scope or name.startswith(scope + ".") for scope in scopes)


def test_agents_across_processes_are_imported_by_the_public_face_only() -> None:
    users = sorted(
        module
        for module, path in MODULES.items()
        if any(_within(name, {"agentsnap.distributed"}) for name in imports(path))
        and not _within(module, {"agentsnap.distributed"} | PUBLIC_FACE)
        and module != "agentsnap"
    )
    assert not users, f"{users} import agentsnap.distributed; only the public face may"


def test_the_contracts_name_modules_that_exist() -> None:
    named = set(CONTRACTS) | set().union(*CONTRACTS.values()) | PUBLIC_FACE
    assert named <= set(MODULES), sorted(named - set(MODULES))


def test_every_module_has_a_place() -> None:
    """A new module must be placed in a layer (or be explicitly above the runtime)."""
    above = {"agentsnap", "agentsnap.__main__", "agentsnap._hints", "agentsnap.console"}
    above |= {"agentsnap.runtime"}
    placed = {m for m in MODULES if _within(m, set(CONTRACTS) | PUBLIC_FACE | above)}
    assert placed == set(MODULES), sorted(set(MODULES) - placed)


def imported_modules(module: str) -> set[str]:
    """The package's modules that ``module`` imports: a name imported from a module (or from a
    package, whose ``__init__`` it runs) counts as that module, others are left out.
    """
    found: set[str] = set()
    for name in imports(MODULES[module]):
        owner = name
        while owner and owner not in MODULES:
            owner = owner.rpartition(".")[0]
        if owner and owner != module:
            found.add(owner)
    return found


def strong_components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of ``graph`` (Tarjan's algorithm)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for after in sorted(graph[node]):
            if after not in order:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], order[after])
        if low[node] == order[node]:
            component: set[str] = set()
            while not component or node not in component:
                component.add(stack.pop())
            components.append(component)

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return components


def circle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest circle of imports through the first module of ``component``, closed."""
    start = min(component)
    paths = {start: [start]}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for after in sorted(graph[node] & component):
            if after == start:
                return [*paths[node], start]
            if after not in paths:
                paths[after] = [*paths[node], after]
                queue.append(after)
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def test_the_package_has_no_import_circle() -> None:
    """Each module can be understood (and imported) before those that import it."""
    graph = {module: imported_modules(module) for module in MODULES}
    circles = [
        " -> ".join(circle_in(graph, component))
        for component in strong_components(graph)
        if len(component) > 1
    ]
    assert not circles, "modules import each other: " + "; ".join(sorted(circles))


# --- The inspector -----------------------------------------------------------------------------

INSPECTOR_ROUTES = {module for module in MODULES if module.startswith("agentsnap.ui._routes_")}
"""One module of routes per area of the API; ``agentsnap.ui.server`` wires them."""


def test_the_inspector_has_its_routes_by_area() -> None:
    assert {
        "agentsnap.ui._routes_actions",
        "agentsnap.ui._routes_runs",
        "agentsnap.ui._routes_snapshots",
        "agentsnap.ui._routes_messages",
        "agentsnap.ui._routes_tools",
        "agentsnap.ui._routes_requests",
        "agentsnap.ui._routes_fork",
    } <= INSPECTOR_ROUTES
    assert imported_modules("agentsnap.ui.server") >= INSPECTOR_ROUTES


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, {"agentsnap.ui"})))
def test_an_area_of_the_inspector_imports_no_other_area(module: str) -> None:
    """Each area's routes stand on what they share (``_inspector``, ``_wire``, ``queries``),
    never on another area's, and nothing but the server imports them."""
    if module == "agentsnap.ui.server":
        return
    wrong = sorted((imported_modules(module) & INSPECTOR_ROUTES) - {module})
    assert not wrong, f"{module} imports {wrong}; only agentsnap.ui.server may"
    if module not in INSPECTOR_ROUTES:
        assert "agentsnap.ui.server" not in imported_modules(module)


STATIC = PACKAGE / "ui" / "static"
JS_MODULES = {path.relative_to(STATIC).as_posix(): path for path in sorted(STATIC.rglob("*.js"))}
JS_ENTRIES = {"main.js", "timeline_page.js"}
"""The inspector's page (``index.html``) and the exported page (``agentsnap timeline``)."""
JS_DRAWING = {"dom.js", "json_tree.js", "schema.js", "sources.js", "spacetime.js"}
"""Modules that draw and check without a server: the exported page stands on these."""
JS_CLIENT = {"api.js", "server_source.js"}
"""The server's API client, and the space-time view's data from it."""
JS_LAYERS = {
    **dict.fromkeys(JS_DRAWING, JS_DRAWING),
    **dict.fromkeys(JS_CLIENT, JS_DRAWING | JS_CLIENT),
    "timeline_page.js": JS_DRAWING | {"views/common.js"},
}
"""What a module of the page may import; the others (views, router, live, main) may import
any module but an entry."""
JS_IMPORT = re.compile(r'^import\s*\{[^}]*\}\s*from\s*"([^"]+)";', re.MULTILINE)


def js_imports(name: str) -> set[str]:
    """The static modules ``name`` imports, as paths under the static folder."""
    here = posixpath.dirname(name)
    specs = JS_IMPORT.findall(JS_MODULES[name].read_text(encoding="utf-8"))
    return {posixpath.normpath(posixpath.join(here, spec)) for spec in specs}


@pytest.mark.parametrize("name", sorted(JS_MODULES))
def test_a_page_module_imports_only_what_its_layer_allows(name: str) -> None:
    imported = js_imports(name)
    assert imported <= set(JS_MODULES), f"{name} imports {sorted(imported - set(JS_MODULES))}"
    assert not imported & JS_ENTRIES, f"{name} imports an entry: {sorted(imported & JS_ENTRIES)}"
    permitted = JS_LAYERS.get(name)
    if permitted is not None:
        wrong = sorted(imported - permitted - {name})
        assert not wrong, f"{name} imports {wrong}, above it"


def test_every_page_module_is_used_and_the_entries_inline() -> None:
    reached: set[str] = set()
    todo = list(JS_ENTRIES)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(js_imports(name))
    assert reached == set(JS_MODULES), f"unused: {sorted(set(JS_MODULES) - reached)}"
    for entry in sorted(JS_ENTRIES):  # the export's resolver takes every entry whole
        assert f"// {entry}\n" in timeline._script(entry)


CLI_SHARED = {
    "agentsnap.cli._main",
    "agentsnap.cli._common",
    "agentsnap.cli._format",
    "agentsnap.cli._results",
}
"""What the CLI's command modules share: the group, the options and the database, the one
formatter, the typed JSON documents. A command module imports no other command module."""


@pytest.mark.parametrize(
    "module",
    sorted(m for m in MODULES if m.startswith("agentsnap.cli.") and m not in CLI_SHARED),
)
def test_a_cli_command_module_imports_only_the_shared_parts(module: str) -> None:
    wrong = sorted(
        name
        for name in imported_modules(module)
        if name.startswith("agentsnap.cli") and name not in CLI_SHARED
    )
    assert not wrong, f"{module} imports {wrong}: share it through {sorted(CLI_SHARED)}"


def test_the_cli_shared_parts_import_no_command_module() -> None:
    for module in sorted(CLI_SHARED):
        wrong = sorted(
            name
            for name in imported_modules(module)
            if name.startswith("agentsnap.cli") and name not in CLI_SHARED
        )
        assert not wrong, f"{module} imports {wrong}, a module of commands"


SQL_STORE_PARTS: dict[str, set[str]] = {
    "agentsnap.store._sql_base": set(),
    "agentsnap.store._sql_snapshots": {"agentsnap.store._sql_base"},
    "agentsnap.store._sql_runs": {"agentsnap.store._sql_base", "agentsnap.store._sql_snapshots"},
    "agentsnap.store._sql_log": {"agentsnap.store._sql_base"},
    "agentsnap.store._sql_leases": {"agentsnap.store._sql_base"},
    "agentsnap.store._sql_queries": {
        "agentsnap.store._sql_base",
        "agentsnap.store._sql_snapshots",
    },
    "agentsnap.store._sql_parts": {"agentsnap.store._sql_base"},
    "agentsnap.store.sql": {
        "agentsnap.store._sql_base",
        "agentsnap.store._sql_runs",
        "agentsnap.store._sql_log",
        "agentsnap.store._sql_leases",
        "agentsnap.store._sql_queries",
        "agentsnap.store._sql_parts",
    },
}
"""``SqlStore``'s parts, one per store role, on a shared base: each may import only these of
the others (and ``SqlStore`` in ``sql.py`` composes them all)."""


@pytest.mark.parametrize("module", sorted(SQL_STORE_PARTS))
def test_the_sql_stores_roles_import_only_their_base(module: str) -> None:
    parts = {m for m in MODULES if m.startswith("agentsnap.store._sql_")} | {"agentsnap.store.sql"}
    wrong = sorted((imported_modules(module) & parts) - SQL_STORE_PARTS[module])
    assert not wrong, f"{module} imports {wrong}: a role's part knows only its base"


def test_every_part_of_the_sql_store_is_placed() -> None:
    parts = {m for m in MODULES if m.startswith("agentsnap.store._sql_")}
    assert parts <= set(SQL_STORE_PARTS), sorted(parts - set(SQL_STORE_PARTS))


ASKS_FOR_ROLES = {"agentsnap._team", "agentsnap.journal", "agentsnap.ownership", "agentsnap.fork"}
ASKS_FOR_ROLES |= RUNTIME_PARTS | {"agentsnap.runtime", "agentsnap.inspect", "agentsnap.once"}
ASKS_FOR_ROLES |= {m for m in MODULES if m.startswith("agentsnap.distributed.")}
"""The store's users below the public face, and the inspector: each names the store roles it
uses (``OneProcessStore``, ``DistributedStore``, ``InspectedStore``, ``RunLog``...), never the
whole ``Store``, so that a backend with fewer roles serves them."""


@pytest.mark.parametrize("module", sorted(ASKS_FOR_ROLES))
def test_the_stores_users_ask_for_roles_not_the_whole_store(module: str) -> None:
    wanted = sorted(
        f"line {node.lineno}"
        for node in ast.walk(ast.parse(MODULES[module].read_text()))
        if isinstance(node, ast.ImportFrom)
        and node.module == "agentsnap.store"
        and any(alias.name == "Store" for alias in node.names)
    )
    assert not wanted, f"{module} imports the whole Store ({wanted}); ask for the roles it uses"
