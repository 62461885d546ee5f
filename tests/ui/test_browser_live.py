"""The inspector follows runs as they go, in Chromium: no reload needed, and a pause holds.

Runs go on in threads of this process over one SQLite database while the inspector serves
it; the page is opened before they end, and the test looks for what they did without
reloading it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.store.sql import SqlStore

from .conftest import PageProblems, Served
from .test_browser import open_view

if TYPE_CHECKING:
    from playwright.sync_api import Page


class Gate(Agent[AgentState]):
    """Waits until the test opens its gate, then hands three messages to the sink."""

    def __init__(self, name: str, opened: threading.Event) -> None:
        super().__init__(name)
        self.opened = opened

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        await asyncio.to_thread(self.opened.wait)
        for n in range(3):
            ctx.send("sink", {"n": n})


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        assert isinstance(message.payload, dict)
        self.state.memory[str(message.payload["n"])] = "seen"


class GatedRun:
    """A run in a thread of its own that waits at its gate until ``open`` is called."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.name = name
        self.run_id: str | None = None
        self.opened = threading.Event()
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=f"run-{name}", daemon=True)
        self.thread.start()
        assert self.started.wait(30), "the run did not start"
        assert self.error is None, self.error

    def _main(self) -> None:
        async def go() -> None:
            store = SqlStore(self.url)
            try:
                async with Runtime(store=store, name=self.name) as runtime:
                    runtime.add(Gate("gate", self.opened))
                    runtime.add(Sink("sink"))
                    self.run_id = runtime.run_id
                    runtime.send("gate", {"go": True})
                    self.started.set()
                    await runtime.run_until_idle()
            finally:
                await store.close()

        try:
            asyncio.run(go())
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.started.set()

    def finish(self) -> None:
        self.opened.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the run did not end"
        assert self.error is None, self.error


@pytest.fixture
def database(tmp_path: Path, chromium_path: str) -> str:
    return f"sqlite:///{tmp_path / 'live.db'}"


@pytest.fixture
def server(database: str) -> Iterator[Served]:
    # The store must exist before the inspector opens it.
    GatedRun(database, "first").finish()
    served = Served(database, allow_fork=False)
    yield served
    served.stop()


def mark_page(page: Page) -> None:
    """Leave a mark that a reload would wipe out."""
    page.evaluate("() => { window.__notReloaded = true; }")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("() => window.__notReloaded === true"), "the page was reloaded"


def test_a_run_page_opened_before_the_run_ends_shows_it_succeed(
    page: Page, server: Served, database: str, problems: PageProblems
) -> None:
    run = GatedRun(database, "followed")
    try:
        open_view(page, server, f"/runs/{run.run_id}")
        mark_page(page)
        header = page.locator(".run-header")
        assert "running" in header.locator(".badge").first.inner_text()
        assert page.locator("#live").get_attribute("data-state") == "live"
    finally:
        run.finish()
    page.wait_for_selector(".run-header .badge.s-succeeded", timeout=20_000)
    # The messages sent after the page was drawn are counted, and drawn.
    assert " 0 message(s)" not in page.locator(".run-header .facts").inner_text()
    page.wait_for_function(
        "() => window.agentsnap.timeline.data && window.agentsnap.timeline.data.messages"
        ".messages.some((m) => m.dst === 'sink')",
        timeout=20_000,
    )
    assert_not_reloaded(page)
    assert not problems


def test_the_runs_list_shows_a_new_run_and_a_pause_holds_the_view(
    page: Page, server: Served, database: str, problems: PageProblems
) -> None:
    open_view(page, server, "/runs")
    mark_page(page)
    second = GatedRun(database, "second")
    try:
        row = page.locator(f"tr[data-run='{second.run_id}']")
        row.wait_for(timeout=20_000)
        assert "running" in row.inner_text()
        # Paused, the view holds what it shows while the run ends.
        page.click("#live button.live-pause")
        assert page.locator("#live").get_attribute("data-state") == "paused"
    finally:
        second.finish()
    time.sleep(3)  # several polls' worth: none may redraw the paused view
    assert "running" in page.locator(f"tr[data-run='{second.run_id}']").inner_text()
    page.click("#live button.live-pause")
    page.wait_for_selector(f"tr[data-run='{second.run_id}'] .badge.s-succeeded", timeout=20_000)
    assert_not_reloaded(page)
    assert not problems


def test_a_form_being_filled_is_not_redrawn_under_the_user(
    page: Page, server: Served, database: str, problems: PageProblems
) -> None:
    open_view(page, server, "/runs")
    page.fill("input[name=q]", "fol")
    third = GatedRun(database, "third")
    third.finish()
    page.wait_for_selector("#live[data-state='stale']", timeout=20_000)
    assert page.locator("input[name=q]").input_value() == "fol"
    assert page.locator(f"tr[data-run='{third.run_id}']").count() == 0
    page.click("#live button.live-reload")
    page.wait_for_selector(f"tr[data-run='{third.run_id}']", timeout=20_000)
    assert not problems
