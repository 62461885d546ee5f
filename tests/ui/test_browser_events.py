"""The event history, failures, resolving unknown outcomes and what-if forks, in Chromium:
the event table filters by agent and by text; a failed run's page opens on its traceback; an
unknown tool outcome is resolved from the page (or its command shown); a fork made in the
page with a message in flight dropped and dry tools is continued from the page, finishes,
and its calls show as dry, beside its parent's."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agentsnap import Agent, AgentState, Context, HandlerFailed, Message, Runtime
from agentsnap.records import SnapshotStatus
from agentsnap.store.sql import SqlStore

from .conftest import PageProblems, Served, in_thread
from .test_browser import api, open_view, wait_drawn
from .test_browser_actions import APP, killed_run, payroll
from .workflows import Runs, counters_run

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from payroll_app import make_app  # noqa: E402
from test_run_command import DEADLINE, Payroll  # noqa: E402

if TYPE_CHECKING:
    from playwright.sync_api import Page

__all__ = ["payroll"]  # the fixture, shared with the actions' tests


def column(page: Page, name: str) -> list[str]:
    """The texts of the events table's cells of class ``name``."""
    return page.locator(f"table.events tbody td.{name}").all_inner_texts()


def test_the_event_table_filters_by_agent_and_by_text(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    every = api(served, page, f"/api/runs/{runs.counters}/executions")
    open_view(page, served, f"/runs/{runs.counters}/events")
    assert page.locator("table.events tbody tr").count() == every["total"]
    assert page.locator("nav.tabs a.tab.active").inner_text() == "Events"

    page.select_option("select[aria-label='Agent']", "beta")
    page.click("form.events-filters button[type=submit]")
    page.wait_for_selector("#view[data-loaded='true'] form.events-filters")
    page.wait_for_function("() => location.hash.includes('agent=beta')")
    page.wait_for_selector("#view[data-loaded='true']")
    betas = column(page, "agent")
    assert betas
    assert set(betas) == {"beta"}
    assert len(betas) < every["total"]

    page.select_option("select[aria-label='Agent']", "")
    page.fill("input[aria-label='Search executions']", "wrong")
    page.click("form.events-filters button[type=submit]")
    page.wait_for_function("() => location.hash.includes('q=wrong')")
    page.wait_for_selector("#view[data-loaded='true']")
    assert column(page, "agent") == ["alpha", "beta"]
    assert all("wrong" in text for text in page.locator("table.events .payload").all_inner_texts())

    # A row leads to its message in the space-time view and to the cut after it.
    row = page.locator("table.events tbody tr").first
    after = row.locator("a.cut-after").inner_text()
    row.locator("a.message-link").click()
    page.wait_for_selector("#view[data-loaded='true'] canvas.st-canvas")
    assert page.locator("#panel h2").inner_text() == "Message $env → alpha #13"
    page.go_back()
    page.wait_for_selector("#view[data-loaded='true'] table.events")
    page.locator("table.events tbody tr").first.locator("a.cut-after").click()
    page.wait_for_function("() => location.hash.includes('/snapshots/')")
    page.wait_for_selector("#view[data-loaded='true']")
    assert after.removeprefix("after ") in page.locator("#panel").inner_text()
    assert not problems


class Accountant(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.state.memory["asked"] = message.payload
        try:
            raise KeyError("acme")
        except KeyError as exc:
            raise ValueError("the ledger has no account for acme") from exc


async def failed_run(url: str) -> str:
    store = SqlStore(url)
    try:
        runtime = Runtime(store=store, name="fails")

        async def run() -> None:
            async with runtime:
                runtime.add(Accountant("accountant"))
                await runtime.snapshot()
                runtime.send("accountant", {"account": "acme"})
                await runtime.run_until_idle()

        with pytest.raises(HandlerFailed, match="no account for acme"):
            await run()
        return runtime.run_id
    finally:
        await store.close()


def test_a_failed_run_opens_on_its_traceback(
    page: Page, tmp_path: Path, chromium_path: str, problems: PageProblems
) -> None:
    url = f"sqlite:///{tmp_path / 'failed.db'}"
    run_id = in_thread(lambda: failed_run(url))
    server = Served(url, allow_fork=False)
    try:
        open_view(page, server, f"/runs/{run_id}")
        failure = page.locator(".run-failure")
        assert failure.is_visible()
        assert "This run failed" in failure.locator("h2").inner_text()
        assert "agent 'accountant' failed" in failure.locator(".failure-reason").inner_text()
        trace = failure.locator("pre.traceback")
        assert trace.is_visible(), "open on the run's first view"
        text = trace.inner_text()
        assert text.index("KeyError: 'acme'") < text.index("ValueError: the ledger has no")
        assert "direct cause of the following exception" in text
        # The error comes first: above the space-time view, in the window as the page opens.
        box = failure.bounding_box()
        canvas = page.locator("canvas.st-canvas").bounding_box()
        assert box is not None
        assert canvas is not None
        assert box["y"] < canvas["y"]
        assert box["y"] < 900
        # The other views keep it, folded.
        open_view(page, server, f"/runs/{run_id}/snapshots")
        assert page.locator(".run-failure").is_visible()
        assert not page.locator(".run-failure pre.traceback").is_visible()
    finally:
        server.stop()
    assert not problems


def unknown_counters(tmp_path: Path) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path / 'unknown.db'}"

    async def make() -> str:
        store = SqlStore(url)
        try:
            return await counters_run(store, url)
        finally:
            await store.close()

    return url, in_thread(make)


def test_an_unknown_outcome_is_resolved_from_the_page(
    page: Page, tmp_path: Path, chromium_path: str, problems: PageProblems
) -> None:
    url, run_id = unknown_counters(tmp_path)
    read_only = Served(url, allow_fork=False)
    try:
        open_view(page, read_only, f"/runs/{run_id}/tools")
        row = page.locator("table.tools tr[data-key='stamp:lost']")
        row.locator("button.action-resolve").click()
        command = row.locator("code.resolve-retry")
        command.wait_for()
        assert command.inner_text() == f"agentsnap tools resolve stamp:lost --retry --db {url}"
        assert (
            row.locator("code.resolve-succeeded")
            .inner_text()
            .startswith("agentsnap tools resolve stamp:lost --result JSON --db")
        )
    finally:
        read_only.stop()
    server = Served(url, allow_fork=False, allow_run=True)
    try:
        open_view(page, server, f"/runs/{run_id}/tools")
        row = page.locator("table.tools tr[data-key='stamp:lost']")
        assert row.locator(".badge.unknown").inner_text() == "outcome unknown"
        row.locator("button.action-resolve").click()
        form = row.locator("form.resolve-form")
        form.locator("input[value=succeeded]").check()
        assert "stamp (stamp:lost) happened" in form.locator(".resolve-what").inner_text()
        form.locator("textarea.resolve-result").fill("{oops")
        form.locator("button.confirm-resolve").click()
        assert "not JSON" in form.locator(".resolve-message").inner_text()
        form.locator("textarea.resolve-result").fill('"stamp-by-hand"')
        form.locator("button.confirm-resolve").click()
        page.wait_for_selector(
            "#view[data-loaded='true'] table.tools tr[data-key='stamp:lost'] .badge.s-succeeded"
        )
        row = page.locator("table.tools tr[data-key='stamp:lost']")
        assert row.locator(".badge.unknown").count() == 0
        assert "stamp-by-hand" in row.inner_text()
    finally:
        server.stop()
    assert not problems


async def parent_with_payments_in_flight(url: str) -> tuple[str, dict[str, Any]]:
    """A payroll run in this process, with a cut where payments wait in flight."""
    store = SqlStore(url)
    try:
        app = make_app()
        async with Runtime(store=store, name="payroll") as runtime:
            for agent in app.agents:
                runtime.add(agent)
            runtime.send("clerk", {"names": ["ann", "bo", "cy", "di"]})
            handle = runtime.snapshot()
            await runtime.run_until_idle()
            cut = await handle
            await runtime.snapshot()
        assert cut.status is SnapshotStatus.COMPLETE
        flying = [m for c in cut.channels if c.dst == "payer" for m in c.messages]
        assert len(flying) >= 2, "payments in flight at the cut"
        return runtime.run_id, {"id": cut.id, "seq": cut.seq, "flying": [m.id for m in flying]}
    finally:
        await store.close()


def test_a_dry_fork_with_a_message_dropped_is_continued_from_the_page_at_once(
    page: Page, payroll: Payroll, problems: PageProblems
) -> None:
    parent, cut = in_thread(lambda: parent_with_payments_in_flight(payroll.db))
    paid_by_parent = payroll.paid()
    assert len(paid_by_parent) == 4
    server = Served(payroll.db, allow_fork=True, allow_run=True, app_spec=APP)
    try:
        open_view(page, server, f"/runs/{parent}/fork/{cut['id']}")
        dropped = cut["flying"][0]
        page.check(f"input.drop-message[data-message='{dropped}']")
        assert page.locator("select[name=tools]").input_value() == "dry"
        page.fill("input[name=name]", "what if one payment was not asked")
        page.click("form.fork-form button[type=submit]")
        created = page.locator("a.fork-link")
        created.wait_for()
        fork_id = (created.get_attribute("href") or "").split("/")[2]
        # Continued right after it was created, from the fork's result.
        page.click(".fork-continue button.action-resume")
        confirm = page.locator(".fork-continue .action-confirm")
        assert "this fork's tools are dry" in confirm.inner_text()
        page.click(".fork-continue button.confirm-resume")
        page.locator(".fork-continue .action-result.ok-box").wait_for()
        deadline = time.monotonic() + DEADLINE
        while api(server, page, f"/api/runs/{fork_id}")["status"] != "succeeded":
            assert time.monotonic() < deadline, "the fork did not finish"
            time.sleep(0.2)
        created.click()
        page.wait_for_selector(".run-header .badge.s-succeeded")

        calls = api(server, page, f"/api/runs/{fork_id}/tools")["calls"]
        assert len(calls) == len(cut["flying"]) - 1, "the dropped payment was never asked"
        open_view(page, server, f"/runs/{fork_id}/tools")
        statuses = page.locator("table.tools tbody tr .badge[class*='s-']").all_inner_texts()
        assert statuses == ["dry"] * len(calls)

        open_view(page, server, f"/runs/{fork_id}/compare")
        assert page.locator("strong.tools-dry").inner_text() == "dry"
        paired = page.locator("table.compare-tools tr.paired")
        assert paired.count() == len(calls)
        for i in range(paired.count()):
            cells = paired.nth(i).locator("td")
            assert "succeeded" in cells.nth(0).inner_text()
            assert "dry" in cells.nth(1).inner_text()
        assert page.locator(".compare-cut").count() >= 2
    finally:
        server.stop()
    assert payroll.paid() == paid_by_parent, "a dry fork pays nobody"
    assert not problems


def test_the_timeline_folds_idle_gaps_and_marks_a_stop_and_its_resume(
    page: Page, payroll: Payroll, problems: PageProblems
) -> None:
    run_id = killed_run(payroll)
    time.sleep(3)  # the run stays stopped a while: an idle gap to fold
    resumed = payroll.run("resume", run_id, "--app", APP)
    assert resumed.returncode == 0, resumed.stderr
    server = Served(payroll.db, allow_fork=False)
    try:
        incidents = api(server, page, f"/api/runs/{run_id}/incidents")
        open_view(page, server, f"/runs/{run_id}")
        wait_drawn(page)
        page.wait_for_function(
            "() => (window.agentsnap.timeline.incidentMarks || []).some("
            "(m) => m.kind === 'resumed')"
        )
        marks = page.evaluate("() => window.agentsnap.timeline.incidentMarks")
        (stopped,) = [m for m in marks if m["kind"] == "stopped"]
        (resume,) = [m for m in marks if m["kind"] == "resumed"]
        assert stopped["x"] <= resume["x"]
        assert stopped["crashed"] is True
        assert stopped["label"] == "✕ crashed"
        assert resume["label"].startswith("▶ resumed by pid ")
        assert resume["owner"] == incidents["owner"]
        folds = [m for m in marks if m["kind"] == "fold"]
        assert len(folds) == len(incidents["gaps"])
        width = page.locator("canvas.st-canvas").bounding_box()
        assert width is not None
        for fold, gap in zip(folds, incidents["gaps"], strict=True):
            assert fold["label"].startswith("idle ")
            assert fold["x1"] - fold["x0"] < width["width"] / 5, "folded to a narrow band"
            assert fold["from_us"] == gap["from_us"]
        # The fold's arithmetic: times outside the gaps keep their order and spacing.
        checked = page.evaluate(
            """async () => {
                const { foldedAxis } = await import('/static/views/incidents.js');
                const gap = { from_us: 100, to_us: 10100, length_us: 10000 };
                const axis = foldedAxis([gap], 0, 10200);
                return [axis.u(50), axis.u(100), axis.u(10100), axis.u(10200), axis.t(axis.u(5000)),
                        axis.t(axis.u(10150))];
            }"""
        )
        assert checked[:2] == [50, 100]
        assert checked[2] - checked[1] < 100, "the 10,000 µs gap keeps a few µs"
        assert checked[3] - checked[2] == 100, "after the gap, time runs as before"
        assert checked[4] == pytest.approx(5000)
        assert checked[5] == pytest.approx(10150)
    finally:
        server.stop()
    assert not problems
