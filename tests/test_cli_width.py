"""Tables that fit the terminal: the fitting functions, then the real console script.

The console script runs in a subprocess, its output piped (tables are then whole, unless
``COLUMNS`` is set) or on a pseudo-terminal of a given size (tables are fitted to it).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from terminal import run_on_terminal

from agentsnap import Agent, AgentState, Context, JsonValue, Message, Runtime
from agentsnap.cli import main
from agentsnap.cli._main import TABLES
from agentsnap.console import (
    ELLIPSIS,
    GAP,
    Kind,
    cut,
    cut_list,
    ellipsis_for,
    fit_widths,
    kind_of,
    paint_diff_line,
    paint_word,
    render_table,
    table_width,
    text_width,
    wrap,
)
from agentsnap.records import RollbackInfo
from agentsnap.store.sql import SqlStore

AGENTSNAP = Path(sys.executable).parent / "agentsnap"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
AGENTS = [f"agent-{n:02d}" for n in range(20)]
REASON = (
    "the draft cites no source for its central claim, and its conclusion does not follow "
    "from the figures in the second paragraph; rewrite it with the sources the researcher found"
)


def plain(text: str) -> str:
    return ANSI.sub("", text)


# 1. The fitting functions


def test_text_width_counts_terminal_columns() -> None:
    assert text_width("agent") == 5
    assert text_width("代理") == 4  # wide characters take two columns
    assert text_width("e\u0301") == 1  # a combining accent takes none
    assert text_width(click.style("failed", fg="red")) == 6  # colour codes take none


def test_cut_marks_what_it_cut() -> None:
    assert cut("researcher", 10) == "researcher"
    assert cut("researcher", 6) == "resea" + ELLIPSIS
    assert text_width(cut("researcher", 6)) == 6
    assert cut("代理人", 4) == "代" + ELLIPSIS  # never half a wide character
    assert cut("researcher", 1) == ELLIPSIS
    assert cut("researcher", 0) == ""
    assert cut("researcher", 6, "...") == "res..."


def test_a_list_is_cut_after_an_item_saying_how_many_are_hidden() -> None:
    agents = "planner,researcher,writer,critic"
    assert cut_list(agents, 40) == agents
    assert cut_list(agents, 26) == "planner,researcher,…+2"
    assert cut_list(agents, 20) == "planner,…+3"
    assert cut_list(agents, 6) == "plann…"  # not even one item: cut like any text


def test_wrap_breaks_at_spaces_and_breaks_long_words() -> None:
    assert wrap("the draft cites no source", 10) == ["the draft", "cites no", "source"]
    assert wrap("abcdefghijkl", 5) == ["abcde", "fghij", "kl"]
    assert wrap("first line\nsecond", 20) == ["first line", "second"]
    assert wrap("", 5) == [""]


@pytest.mark.parametrize(
    ("header", "cells", "kind"),
    [
        ("ID", ["3fa2b1c9"], Kind.ID),
        ("PARENT", ["-"], Kind.ID),
        ("AGENTS", ["a,b"], Kind.LIST),
        ("TAGS", ["nightly"], Kind.LIST),
        ("REASON", ["too short"], Kind.PROSE),
        ("STATUS REASON", ["x"], Kind.PROSE),
        ("STATUS", ["succeeded"], Kind.FIXED),
        ("STATUS", ["succeeded", "failed: the critic said no"], Kind.PROSE),
        ("ATTEMPTS", ["1", "12"], Kind.FIXED),
        ("CREATED", ["2026-11-24 21:05:03 +01:00", "-"], Kind.TIME),
        ("SNAPSHOTS", ["1,2", "3"], Kind.LIST),
        ("NOTE", ["two words"], Kind.PROSE),
        ("INITIATOR", ["researcher", "$env"], Kind.TEXT),
    ],
)
def test_kind_of_a_column(header: str, cells: list[str], kind: Kind) -> None:
    assert kind_of(header, cells) is kind


def test_a_table_that_fits_keeps_its_widths() -> None:
    assert fit_widths(["A", "B"], [10, 20], [Kind.ID, Kind.TEXT], 32) == [10, 20]


def test_ids_give_way_first_then_lists_then_times() -> None:
    headers = ["ID", "STARTED", "AGENTS"]
    kinds = [Kind.ID, Kind.TIME, Kind.LIST]
    natural = [32, 26, 100]
    # Ids go down to a prefix of 8 (and an ellipsis) before a list gives anything.
    assert fit_widths(headers, natural, kinds, 32 + 26 + 100 + 2 * GAP - 23) == [9, 26, 100]
    # Then the list, down to its first item and how many are hidden, before the time.
    widths = fit_widths(headers, natural, kinds, 9 + 26 + 30 + 2 * GAP, least=[0, 0, 14])
    assert widths == [9, 26, 30]
    widths = fit_widths(headers, natural, kinds, 9 + 26 + 14 + 2 * GAP - 5, least=[0, 0, 14])
    assert widths == [9, 16, 19]  # the time, to the minute; the list gets what is left


def test_columns_of_one_kind_give_way_together_widest_first() -> None:
    widths = fit_widths(["ID", "PARENT"], [32, 20], [Kind.ID, Kind.ID], 20 + 20 + GAP)
    assert widths == [20, 20]


def test_a_terminal_too_narrow_for_every_column_leaves_out_the_right_ones() -> None:
    widths = fit_widths(["A", "B", "C"], [5, 5, 5], [Kind.TEXT] * 3, 4)
    assert widths == [1, 1, 0]


cells = st.text(alphabet=st.sampled_from(list("abc ,-:19代é\u0301\n")), min_size=0, max_size=40)


@given(
    headers=st.lists(
        st.sampled_from(["ID", "AGENTS", "REASON", "STATUS", "X", ""]), min_size=1, max_size=6
    ),
    values=st.lists(cells, min_size=6, max_size=6),
    rows=st.integers(min_value=0, max_value=3),
    width=st.integers(min_value=1, max_value=120),
)
def test_a_fitted_table_is_never_wider_than_the_terminal(
    headers: list[str], values: list[str], rows: int, width: int
) -> None:
    table = [values[: len(headers)] for _ in range(rows)]
    for line in render_table(headers, table, width=width):
        assert text_width(line) <= width, line


def test_an_unfitted_table_shows_every_value_whole() -> None:
    row = ["3fa2b1c9d4e5f60718293a4b5c6d7e8f", ",".join(AGENTS), REASON]
    lines = [plain(line) for line in render_table(["ID", "AGENTS", "REASON"], [row])]
    assert len(lines) == 2
    assert lines[1].split() == [row[0], row[1], *REASON.split()]


def test_a_note_takes_lines_of_its_own_under_its_row() -> None:
    rows = [["a1", "failed"], ["b2", "succeeded"]]
    whole = [plain(li) for li in render_table(["ID", "STATUS"], rows, notes=[REASON, None])]
    assert whole == ["ID  STATUS", "a1  failed", f"  {REASON}", "b2  succeeded"]
    fitted = render_table(["ID", "STATUS"], rows, width=30, notes=[REASON, "\x1b[2Jgone"])
    under = fitted[2:-2]
    assert len(under) > 1
    assert all(line.startswith("  ") and text_width(line) <= 30 for line in under)
    assert " ".join(line.strip() for line in under) == REASON  # wrapped, never cut
    assert fitted[-1] == "  \\x1b[2Jgone"  # stored text cannot move the cursor


def test_colour_codes_do_not_count_towards_the_width() -> None:
    rows = [["failed", "x" * 30]]
    natural = len("failed") + GAP + 30
    lines = render_table(["STATUS", "NOTE"], rows, width=natural)
    assert "\x1b[31m" in lines[1]  # failed, in red
    assert plain(lines[1]) == "failed  " + "x" * 30  # nothing cut: the codes take no room


def test_prose_wraps_and_the_other_cells_stay_on_the_first_line() -> None:
    lines = [plain(li) for li in render_table(["AGENT", "REASON"], [["writer", REASON]], width=40)]
    assert lines[0].split() == ["AGENT", "REASON"]
    assert lines[1].startswith("writer  ")
    assert all(line.startswith(" " * len("writer  ")) for line in lines[2:])
    assert " ".join(" ".join(line.split()) for line in lines[1:]) == f"writer {REASON}"
    assert all(len(line) <= 40 for line in lines)


def test_a_status_is_coloured_and_so_is_a_status_with_why() -> None:
    assert paint_word("failed") == click.style("failed", fg="red")
    assert paint_word("failed: no source") == click.style("failed", fg="red") + ": no source"
    assert paint_word("writer") == "writer"


def test_control_characters_are_shown_not_sent() -> None:
    (_, line) = render_table(["NOTE"], [["red\x1b[31m here"]])
    assert "\x1b[31m" not in line
    assert "\\x1b[31m" in line


def test_table_width_fits_a_terminal_or_COLUMNS_and_not_a_pipe(  # noqa: N802
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("COLUMNS", raising=False)
    assert table_width(io.StringIO()) is None  # a pipe or a file: whole values
    assert table_width(Terminal()) is not None
    assert table_width(Terminal(), wide=True) is None
    monkeypatch.setenv("COLUMNS", "72")
    assert table_width(io.StringIO()) == 72
    assert table_width(io.StringIO(), wide=True) is None
    monkeypatch.setenv("COLUMNS", "wat")
    assert table_width(io.StringIO()) is None


def test_an_encoding_without_the_ellipsis_gets_three_dots() -> None:
    assert ellipsis_for(io.TextIOWrapper(io.BytesIO(), encoding="utf-8")) == ELLIPSIS
    assert ellipsis_for(io.TextIOWrapper(io.BytesIO(), encoding="latin-1")) == "..."


def test_diff_lines_are_coloured_by_their_mark() -> None:
    assert paint_diff_line("  + memory.c: 3") == click.style("  + memory.c: 3", fg="green")
    assert paint_diff_line("  - memory.b: 2") == click.style("  - memory.b: 2", fg="red")
    assert paint_diff_line("  ~ memory.a: 1 -> 3") == click.style(
        "  ~ memory.a: 1 -> 3", fg="yellow"
    )
    assert paint_diff_line("  (unchanged)") == "  (unchanged)"


def test_every_table_command_takes_wide_and_no_other_does() -> None:
    def walk(group: click.Group, path: str = "") -> dict[str, click.Command]:
        found: dict[str, click.Command] = {}
        for name, command in group.commands.items():
            here = f"{path} {name}".strip()
            if isinstance(command, click.Group):
                found.update(walk(command, here))
            found[here] = command
        return found

    commands = walk(main)
    assert set(commands) >= TABLES
    for path, command in commands.items():
        takes_wide = any("--wide" in param.opts for param in command.params)
        assert takes_wide == (path in TABLES), path


# 2. The console script


@dataclass(frozen=True)
class Wide:
    """A run of 20 agents in an SQLite file: two snapshots and a rollback with a long reason."""

    db: str
    run_id: str
    first: str
    second: str


class KeeperState(AgentState):
    count: int = 0


class MemoryChange(BaseModel):
    set: dict[str, JsonValue] = {}
    drop: list[str] = []


class Keeper(Agent[KeeperState]):
    """Sets and drops memory keys as it is told."""

    async def handle(self, message: Message, ctx: Context[KeeperState]) -> None:
        self.state.count += 1
        change = message.payload_as(MemoryChange)
        self.state.memory.update(change.set)
        for key in change.drop:
            self.state.memory.pop(key, None)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Wide:
    db = f"sqlite:///{tmp_path_factory.mktemp('width') / 'wide.db'}"

    async def go() -> Wide:
        store = SqlStore(db)
        try:
            async with Runtime(store=store) as runtime:
                for name in AGENTS:
                    runtime.add(Keeper(name, KeeperState()))
                runtime.send(AGENTS[0], {"set": {"a": 1, "b": 2}})
                await runtime.run_until_idle()
                first = await runtime.snapshot()
                runtime.send(AGENTS[0], {"set": {"a": 3, "c": "new"}, "drop": ["b"]})
                await runtime.run_until_idle()
                second = await runtime.snapshot()
                run_id = runtime.run_id
            await store.save_rollback(
                RollbackInfo(
                    id=uuid.uuid4().hex,
                    run_id=run_id,
                    snapshot_id=first.id,
                    agent=AGENTS[0],
                    reason=REASON,
                    source="critic",
                    attempt=1,
                    discarded=0,
                )
            )
        finally:
            await store.close()
        return Wide(db, run_id, first.id, second.id)

    return asyncio.run(go())


def without_columns(env: dict[str, str] | None = None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in {"COLUMNS", "LINES", "NO_COLOR"}}
    return {**environ, **(env or {})}


def agentsnap(*args: str, env: dict[str, str] | None = None) -> str:
    """What the console script printed with ``args``, its output piped."""
    done = subprocess.run(
        [str(AGENTSNAP), *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=without_columns(env),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def on_terminal(*args: str, columns: int, env: dict[str, str] | None = None) -> str:
    """What the console script wrote to a terminal ``columns`` wide (no ``COLUMNS``)."""
    written = run_on_terminal(
        [str(AGENTSNAP), *args],
        without_columns({"TERM": "xterm", **(env or {})}),
        columns,
    )
    return written.replace("\r\n", "\n")


def test_twenty_agents_fit_80_columns(wide: Wide) -> None:
    full = json.loads(agentsnap("snapshots", wide.run_id, "--json", "--db", wide.db))
    text = agentsnap("snapshots", wide.run_id, "--db", wide.db, env={"COLUMNS": "80"})
    header, *rows = text.splitlines()
    assert header.split() == ["SEQ", "ID", "STATUS", "INITIATOR", "STARTED", "AGENTS", "IN-FLIGHT"]
    assert len(rows) == len(full)
    assert all(len(line) <= 80 for line in text.splitlines())
    for row, snapshot in zip(rows, full, strict=True):
        assert len(snapshot["agents"]) == 21  # the environment, $env, is one too
        seq, shown, status, initiator, day, minute, agents, in_flight = row.split()
        assert (seq, status, initiator) == (str(snapshot["seq"]), "complete", "$env")
        assert shown.endswith(ELLIPSIS)
        assert snapshot["id"].startswith(shown.removesuffix(ELLIPSIS))
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", f"{day} {minute}")  # to the minute
        assert agents == f"$env,{ELLIPSIS}+20"
        assert in_flight == str(snapshot["in_flight"])


def test_a_cut_id_is_a_prefix_the_commands_take(wide: Wide) -> None:
    text = agentsnap("snapshots", wide.run_id, "--db", wide.db, env={"COLUMNS": "80"})
    (row,) = [line for line in text.splitlines() if line.split()[1][:8] == wide.first[:8]]
    prefix = row.split()[1].removesuffix(ELLIPSIS)
    assert len(prefix) >= 8
    shown = json.loads(agentsnap("show", prefix, "--json", "--db", wide.db))
    assert shown["id"] == wide.first


def test_wide_and_a_pipe_show_every_value_whole(wide: Wide) -> None:
    piped = agentsnap("snapshots", wide.run_id, "--db", wide.db)
    forced = agentsnap("snapshots", wide.run_id, "--wide", "--db", wide.db, env={"COLUMNS": "80"})
    before = agentsnap("--wide", "snapshots", wide.run_id, "--db", wide.db, env={"COLUMNS": "80"})
    for text in (piped, forced):
        rows = [line.split() for line in text.splitlines()[1:]]
        assert wide.first in [row[1] for row in rows]
        assert all(row[-2] == ",".join(["$env", *AGENTS]) for row in rows)
        assert max(len(line) for line in text.splitlines()) > 80
    assert forced == piped
    assert before == piped


def test_json_is_never_cut(wide: Wide) -> None:
    text = agentsnap("snapshots", wide.run_id, "--json", "--db", wide.db, env={"COLUMNS": "40"})
    assert not ANSI.search(text)
    rows = json.loads(text)
    assert {wide.first, wide.second} <= {row["id"] for row in rows}
    assert rows[0]["agents"] == ["$env", *AGENTS]
    rollbacks = json.loads(
        agentsnap("rollbacks", wide.run_id, "--json", "--db", wide.db, env={"COLUMNS": "40"})
    )
    assert [row["reason"] for row in rollbacks] == [REASON]


def test_a_long_reason_wraps_within_the_width(wide: Wide) -> None:
    text = agentsnap("rollbacks", wide.run_id, "--db", wide.db, env={"COLUMNS": "100"})
    lines = text.splitlines()
    assert len(lines) > 2  # the reason took several lines
    assert all(len(line) <= 100 for line in lines)
    column = lines[0].index("REASON")
    assert " ".join(line[column:].strip() for line in lines[1:]) == REASON


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_every_table_fits(wide: Wide, columns: int) -> None:
    for args in (
        ["runs"],
        ["snapshots", wide.run_id],
        ["rollbacks", wide.run_id],
        ["checkpoints", wide.run_id],
        ["tools", wide.run_id],
    ):
        text = agentsnap(*args, "--db", wide.db, env={"COLUMNS": str(columns)})
        assert all(len(line) <= columns for line in text.splitlines()), (args, text)


def test_a_terminal_fits_its_own_width_without_counting_colour(wide: Wide) -> None:
    text = on_terminal("snapshots", wide.run_id, "--db", wide.db, columns=70)
    lines = text.splitlines()
    assert ANSI.search(text)  # colour, on a terminal
    assert all(len(plain(line)) <= 70 for line in lines)
    assert any(len(line) > 70 for line in lines)  # with their colour codes, some are longer
    whole = on_terminal("snapshots", wide.run_id, "--wide", "--db", wide.db, columns=70)
    assert ",".join(["$env", *AGENTS]) in plain(whole)


def test_diff_is_coloured_on_a_terminal(wide: Wide) -> None:
    text = on_terminal(
        "diff", wide.first, wide.second, "--agent", AGENTS[0], "--db", wide.db, columns=80
    )
    lines = text.splitlines()
    bold, green, red, yellow = "\x1b[1m", "\x1b[32m", "\x1b[31m", "\x1b[33m"
    assert lines[0].startswith(bold)
    assert plain(lines[0]) == f"diff {wide.first} -> {wide.second}"
    assert lines[1].startswith(bold)
    assert plain(lines[1]) == f"agent {AGENTS[0]}: changed"
    by_text = {plain(line).strip(): line for line in lines[2:]}
    assert by_text['+ memory.c: "new"'].startswith(green)
    assert by_text["- memory.b: 2"].startswith(red)
    assert by_text["~ memory.a: 1 -> 3"].startswith(yellow)
    assert by_text["~ count: 1 -> 2"].startswith(yellow)


@pytest.mark.parametrize(
    ("args", "env"),
    [
        pytest.param(["--no-color"], {}, id="--no-color"),
        pytest.param([], {"NO_COLOR": "1"}, id="NO_COLOR"),
    ],
)
def test_diff_colour_can_be_turned_off(wide: Wide, args: list[str], env: dict[str, str]) -> None:
    text = on_terminal("diff", wide.first, wide.second, *args, "--db", wide.db, columns=80, env=env)
    assert "+ memory.c" in text
    assert not ANSI.search(text)


def test_diff_piped_has_no_colour(wide: Wide) -> None:
    text = agentsnap("diff", wide.first, wide.second, "--db", wide.db)
    assert "~ memory.a: 1 -> 3" in text
    assert not ANSI.search(text)
