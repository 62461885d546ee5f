"""Requests to people in the inspector, in Chromium: shown, highlighted, answered in the page.

A run's handler waits in a thread of this process, on a question with a schema and then on
an approval before a refund; the inspector is served over the same database, and the test
answers in the page as a person would.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agentsnap import Agent, AgentState, ApprovalDenied, Context, Message, RequestRejected, Runtime
from agentsnap.inspect import answer, list_requests
from agentsnap.messages import JsonValue
from agentsnap.requests import Approval
from agentsnap.store.sql import SqlStore
from agentsnap.tools import tool

from .conftest import PageProblems, Served, in_thread
from .test_browser import api, no_script_ran, open_view
from .workflows import HOSTILE_PEER, HOSTILE_TEXT

if TYPE_CHECKING:
    from playwright.sync_api import Page, Route

REFUNDS: list[dict[str, Any]] = []

SEATS: dict[str, JsonValue] = {
    "type": "object",
    "properties": {
        "seats": {"type": "integer", "minimum": 1, "description": "how many to book"},
        "cabin": {"type": "string", "enum": ["economy", "business"]},
    },
    "required": ["seats"],
}
QUESTION = f"How many seats for order B-2? {HOSTILE_TEXT}"


@tool(side_effect=True, approval=Approval(who="finance", deadline=3600))
async def refund(order: str, amount: int) -> str:
    REFUNDS.append({"order": order, "amount": amount})
    return f"refunded {amount} on {order}"


class Clerk(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        try:
            self.state.memory["seats"] = await ctx.ask(QUESTION, schema=SEATS, who=HOSTILE_PEER)
            self.state.memory["refund"] = await refund(ctx, order="B-2", amount=120)
        except (ApprovalDenied, RequestRejected) as refused:
            self.state.memory["refused"] = refused.reason


class Waiting:
    """A run whose handler waits for people, run to its end in a thread of its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.run_id: str | None = None
        self.clerk: Clerk | None = None
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="waiting-run", daemon=True)
        self.thread.start()
        assert self.started.wait(30), "the run did not start"

    def _main(self) -> None:
        async def go() -> None:
            store = SqlStore(self.url)
            try:
                async with Runtime(store=store, name="refunds") as runtime:
                    self.clerk = runtime.add(Clerk("clerk"))
                    self.run_id = runtime.run_id
                    self.started.set()
                    runtime.send("clerk", {"order": "B-2"})
                    await runtime.run_until_idle()
            finally:
                await store.close()

        try:
            asyncio.run(go())
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.started.set()

    def memory(self) -> dict[str, Any]:
        assert self.clerk is not None
        return dict(self.clerk.state.memory)

    def decline_all(self) -> None:
        """Turn down whatever still waits, so that the handler ends."""

        async def go() -> None:
            store = SqlStore(self.url, create=False)
            try:
                for request in await list_requests(store, self.run_id, pending=True):
                    await answer(store, request.id, approve=False, reason="the test is over")
            finally:
                await store.close()

        in_thread(go)


@pytest.fixture
def waiting(tmp_path: Path, chromium_path: str) -> Iterator[Waiting]:
    REFUNDS.clear()
    made = Waiting(f"sqlite:///{tmp_path / 'requests.db'}")
    yield made
    deadline = time.monotonic() + 30
    while made.thread.is_alive() and time.monotonic() < deadline:
        made.decline_all()
        made.thread.join(timeout=1)
    assert not made.thread.is_alive(), "the waiting run did not end"


def reload(page: Page) -> None:
    """Load the page again (going to the address it shows would not)."""
    page.reload()
    page.wait_for_selector("#view[data-loaded='true'] article.request")


def pending(page: Page, server: Served, run: str, kind: str) -> dict[str, Any]:
    """The run's pending request of ``kind``, once the handler has asked it."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = api(server, page, f"/api/runs/{run}/requests?pending=true")["requests"]
        for request in found:
            if request["kind"] == kind:
                return dict(request)
        time.sleep(0.05)
    raise AssertionError(f"no pending {kind}")


def test_a_request_is_answered_in_the_page(
    page: Page, waiting: Waiting, problems: PageProblems
) -> None:
    server = Served(waiting.url, allow_fork=False, allow_answer=True)
    try:
        run = waiting.run_id
        assert run is not None
        question = pending(page, server, run, "question")
        # The runs list counts what waits, and leads to it.
        open_view(page, server, "/runs")
        badge = page.locator(f"tr[data-run='{run}'] a.pending-requests")
        assert badge.inner_text() == "1 waiting for a person"
        badge.click()
        page.wait_for_function("() => location.hash.endsWith('/requests')")
        page.wait_for_selector("#view[data-loaded='true'] article.request")
        assert "1 request(s) wait" in page.locator(".requests-alert").inner_text()
        assert "1 waiting" in page.locator("a.tab.active").inner_text()
        card = page.locator(f"article.request.pending[data-request='{question['id']}']")
        assert card.count() == 1
        # The question, who may answer and the deadline, as text.
        assert card.locator(".question-text").inner_text() == QUESTION
        assert card.locator(".who").inner_text() == HOSTILE_PEER
        assert card.locator(".deadline").inner_text() == "none"
        no_script_ran(page)
        # An input per property, checked against the schema as the person types.
        submit = card.locator("form.answer-form button.answer")
        assert submit.is_disabled(), "seats is required"
        card.locator("input[name='field-seats']").fill("0")
        assert "at least 1" in card.locator("ul.problems").inner_text()
        assert submit.is_disabled()

        # Without the schema the page cannot check: the server's refusal is shown.
        def without_schema(route: Route) -> None:
            response = route.fetch()
            body = response.json()
            for request in body["requests"]:
                request["schema"] = None
            route.fulfill(response=response, json=body)

        page.route(f"**/api/runs/{run}/requests", without_schema)
        reload(page)
        card.locator("textarea.answer-json").fill(json.dumps({"seats": 0}))
        card.locator("form.answer-form button.answer").click()
        refusal = card.locator(".server-refusal")
        refusal.wait_for()
        assert "The server refused the answer" in refusal.inner_text()
        assert "minimum of 1" in refusal.inner_text()
        page.unroute(f"**/api/runs/{run}/requests")

        # A valid answer: the view shows the request answered, the handler goes on.
        reload(page)
        card.locator("input[name='field-seats']").fill("2")
        card.locator("select[name='field-cabin']").select_option(label="business")
        card.locator("input[name=by]").fill("ann")
        assert submit.is_enabled()
        submit.click()
        page.wait_for_selector("#view[data-loaded='true'] .answer-done")
        done = page.locator(f"article.request.settled[data-request='{question['id']}']")
        assert done.get_attribute("data-status") == "answered"
        assert done.locator(".answered-by").inner_text() == "ann"
        assert json.dumps("business") in done.locator(".answer").inner_text()

        # Then the refund waits for approval.
        approval = pending(page, server, run, "approval")
        page.click("button.refresh")
        card = page.locator(f"article.request.pending[data-request='{approval['id']}']")
        card.wait_for()
        assert card.locator(".tool-name").inner_text() == "refund"
        assert '"B-2"' in card.locator(".question").inner_text()
        assert card.locator(".who").inner_text() == "finance"
        assert card.locator(".deadline").inner_text().endswith("then it is turned down")
        # A denial needs a reason; the approval is sent with one.
        card.locator("button.deny").click()
        assert "Give a reason" in card.locator(".answer-result").inner_text()
        card.locator("input[name=reason]").fill("within the limit")
        card.locator("button.approve").click()
        page.wait_for_selector("#view[data-loaded='true'] .answer-done")
        settled = page.locator(f"article.request.settled[data-request='{approval['id']}']")
        assert settled.get_attribute("data-status") == "answered"
        assert "approved" in settled.inner_text()
        assert settled.locator(".answered-by").inner_text() == "ann", "the name is remembered"
        assert settled.locator(".reason-text").inner_text() == "within the limit"
        assert page.locator("article.request.pending").count() == 0
        assert page.locator(".requests-alert").count() == 0
        no_script_ran(page)

        waiting.thread.join(timeout=30)
        assert not waiting.thread.is_alive()
        assert waiting.error is None
        assert REFUNDS == [{"order": "B-2", "amount": 120}], "the refund happened exactly once"
        memory = waiting.memory()
        assert memory["seats"] == {"seats": 2, "cabin": "business"}
        assert memory["refund"] == "refunded 120 on B-2"
        calls = api(server, page, f"/api/runs/{run}/tools")["calls"]
        assert [(c["tool"], c["status"]) for c in calls] == [("refund", "succeeded")]
    finally:
        server.stop()
    assert not problems


def test_a_server_without_answers_shows_no_form(
    page: Page, waiting: Waiting, problems: PageProblems
) -> None:
    server = Served(waiting.url, allow_fork=False, allow_answer=False)
    try:
        run = waiting.run_id
        assert run is not None
        question = pending(page, server, run, "question")
        open_view(page, server, f"/runs/{run}/requests")
        card = page.locator(f"article.request.pending[data-request='{question['id']}']")
        assert card.count() == 1
        assert page.locator("form.answer-form").count() == 0
        assert page.locator("#view button.answer, #view button.approve").count() == 0
        assert "agentsnap ui --allow-answer" in page.locator(".answer-off").inner_text()
    finally:
        server.stop()
    assert not problems
