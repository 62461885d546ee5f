"""The web inspector in Chromium: runs, the space-time view, cuts, diffs, tools, forks.

Each test drives the page as a user would (clicks, keys, the wheel, forms) against the real
server over real runs, and checks what the page shows or where it went.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agentsnap.store.sql import SqlStore
from agentsnap.timeline import load_timeline, render_html

from .conftest import PageProblems, Served, in_thread
from .workflows import HOSTILE_AGENT, HOSTILE_PEER, HOSTILE_RUN, HOSTILE_TEXT, Runs

if TYPE_CHECKING:
    from playwright.sync_api import Page, Route


def open_view(page: Page, served: Served, route: str) -> None:
    """Go to ``#route`` and wait until the view has loaded."""
    page.goto(f"{served.base}/#{route}")
    page.wait_for_selector("#view[data-loaded='true']")


def window(page: Page) -> tuple[int, int]:
    """The time window the space-time view shows, as the canvas publishes it."""
    canvas = page.locator("canvas.st-canvas")
    return int(canvas.get_attribute("data-from") or ""), int(canvas.get_attribute("data-to") or "")


def wait_drawn(page: Page) -> None:
    """Wait until the view has drawn data for its current window."""
    page.wait_for_selector("canvas.st-canvas[data-mode]:not([data-loading])")
    page.evaluate("() => window.agentsnap.timeline.nextFrame()")


def api(served: Served, page: Page, path: str) -> Any:
    return json.loads(page.request.get(f"{served.base}{path}").text())


def test_the_runs_list_shows_every_run(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    open_view(page, served, "/runs")
    rows = page.locator("table.runs tbody tr")
    assert rows.count() == 3
    demo = page.locator(f"tr[data-run='{runs.demo}']")
    assert demo.locator("a.run-link").inner_text() == "demo"
    assert "succeeded" in demo.inner_text()
    counters = page.locator(f"tr[data-run='{runs.counters}']")
    assert "suite=ui" in counters.locator(".tag").inner_text()
    # Filter by name.
    page.fill("input[name=q]", "count")
    page.click("form.filters button[type=submit]")
    page.wait_for_function("() => location.hash.includes('q=count')")
    page.wait_for_selector("#view[data-loaded='true']")
    assert page.locator("table.runs tbody tr").count() == 1
    assert page.locator(f"tr[data-run='{runs.counters}']").count() == 1
    assert not problems


def test_opening_a_run_draws_every_message(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    open_view(page, served, "/runs")
    page.click(f"tr[data-run='{runs.demo}'] a.run-link")
    page.wait_for_function(f"() => location.hash === '#/runs/{runs.demo}'")
    wait_drawn(page)
    detail = api(served, page, f"/api/runs/{runs.demo}")
    canvas = page.locator("canvas.st-canvas")
    assert canvas.get_attribute("data-mode") == "exact"
    assert int(canvas.get_attribute("data-drawn") or "") == detail["messages"]
    labels = page.locator(".lane-label").all_inner_texts()
    for agent in detail["agents"]:
        assert agent in labels
    assert "$env" in labels, "lanes appear for every process that sent a message"
    assert not problems


def test_zoom_and_pan_move_the_window(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    open_view(page, served, f"/runs/{runs.counters}")
    wait_drawn(page)
    start, end = window(page)
    canvas = page.locator("canvas.st-canvas")
    canvas.focus()
    page.keyboard.press("+")
    zoomed = window(page)
    assert zoomed[1] - zoomed[0] < (end - start) * 0.8
    assert start < zoomed[0] < zoomed[1] < end, "zooming in keeps the middle in view"
    page.keyboard.press("ArrowRight")
    panned = window(page)
    assert panned[0] > zoomed[0]
    assert panned[1] - panned[0] == pytest.approx(
        zoomed[1] - zoomed[0], abs=2
    )  # whole microseconds
    # The wheel zooms around the pointer; dragging pans.
    box = canvas.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 60)
    page.mouse.wheel(0, -400)
    wheeled = window(page)
    assert wheeled[1] - wheeled[0] < panned[1] - panned[0]
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 60)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 - 200, box["y"] + 60, steps=5)
    page.mouse.up()
    dragged = window(page)
    assert dragged[0] > wheeled[0], "dragging to the left shows later times"
    page.keyboard.press("0")
    assert window(page) == (start, end)
    # Switching the axis to Lamport time shows clock ticks, not microseconds.
    page.click("button.axis-btn[data-axis='lamport']")
    wait_drawn(page)
    assert canvas.get_attribute("data-axis") == "lamport"
    lamport = window(page)
    detail = api(served, page, f"/api/runs/{runs.counters}")
    assert lamport[0] <= 0 < detail["lamport_max"] <= lamport[1]
    assert int(canvas.get_attribute("data-drawn") or "") == detail["messages"]
    assert not problems


def test_clicking_a_cut_shows_every_agent_state(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    open_view(page, served, f"/runs/{runs.counters}")
    wait_drawn(page)
    snapshots = api(served, page, f"/api/runs/{runs.counters}/snapshots")["snapshots"]
    chosen = next(s for s in snapshots if s["status"] == "complete" and len(s["recorded"]) > 1)
    point = page.evaluate(f"() => window.agentsnap.timeline.cutPoint({chosen['seq']}, 'alpha')")
    page.mouse.click(point["x"], point["y"])
    page.wait_for_function(f"() => location.hash.endsWith('/snapshots/{chosen['id']}')")
    page.wait_for_selector("#view[data-loaded='true'] .cut-grid")
    detail = api(served, page, f"/api/runs/{runs.counters}/snapshots/{chosen['id']}")
    assert page.locator("#panel h2").inner_text().startswith(f"Cut S{chosen['seq']}")
    for agent, recorded in detail["agents"].items():
        block = page.locator(f".agent-state[data-agent='{agent}']")
        assert block.count() == 1
        if agent == "alpha":
            text = block.inner_text()
            assert f"count: {recorded['state']['count']}" in text
            assert json.dumps(recorded["state"]["label"]) in text
    assert page.locator(".channel").count() == len(detail["channels"])
    assert not problems


def test_clicking_an_agent_shows_its_history(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    open_view(page, served, f"/runs/{runs.counters}")
    page.click(".lane-label[data-agent='beta']")
    page.wait_for_function("() => location.hash.endsWith('/agents/beta')")
    page.wait_for_selector("#view[data-loaded='true'] .history-item")
    history = api(served, page, f"/api/runs/{runs.counters}/agents/beta/history")
    items = page.locator(".history-item")
    assert items.count() == len(history["snapshots"])
    changed = [s for s in history["snapshots"] if s["changed"]]
    assert changed
    assert page.locator(".history-item.changed").count() == len(changed)
    # From the history, a diff of one agent between two snapshots.
    page.locator(".history-item.changed a", has_text="diff with").first.click()
    page.wait_for_selector("#view[data-loaded='true'] .agent-diff")
    assert page.locator(".agent-diff").count() == 1
    assert page.locator(".agent-diff h3").inner_text() == "beta"
    assert not problems


def test_a_diff_highlights_what_changed(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    snapshots = api(served, page, f"/api/runs/{runs.counters}/snapshots")["snapshots"]
    complete = [s for s in snapshots if s["status"] == "complete"]
    a, b = complete[1], complete[-1]
    open_view(page, served, f"/runs/{runs.counters}/diff?a={a['id']}&b={b['id']}")
    page.wait_for_selector(".agent-diff")
    section = page.locator(".agent-diff[data-agent='alpha']")
    rows = section.locator("table.changes tbody tr")
    assert rows.count() > 0
    count_row = section.locator("table.changes tr", has_text="count")
    before = api(served, page, f"/api/runs/{runs.counters}/snapshots/{a['id']}")
    after = api(served, page, f"/api/runs/{runs.counters}/snapshots/{b['id']}")
    old, new = (s["agents"]["alpha"]["state"]["count"] for s in (before, after))
    assert old != new
    assert count_row.locator("td").nth(2).inner_text() == str(old)
    assert count_row.locator("td").nth(3).inner_text() == str(new)
    # Side by side, the changed field is highlighted on both sides, added keys on the right.
    sides = section.locator(".side-by-side > div")
    assert f"count: {old}" in sides.nth(0).locator(".leaf.changed").first.inner_text()
    assert f"count: {new}" in sides.nth(1).locator(".leaf.changed").first.inner_text()
    assert sides.nth(1).locator(".added").count() > 0
    assert not problems


def test_the_tools_table_makes_unknown_outcomes_stand_out(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    open_view(page, served, f"/runs/{runs.counters}/tools")
    calls = api(served, page, f"/api/runs/{runs.counters}/tools")["calls"]
    rows = page.locator("table.tools tbody tr")
    assert rows.count() == len(calls) > 1
    unknown = page.locator("table.tools tbody tr.unknown")
    assert unknown.count() == 1
    assert unknown.get_attribute("data-key") == "stamp:lost"
    assert "outcome unknown" in unknown.inner_text()
    assert page.locator("p.warn").count() == 1
    # Filtering by status asks the server again.
    page.select_option("select[name=status]", "succeeded")
    page.click("form.filters button[type=submit]")
    page.wait_for_function("() => location.hash.includes('status=succeeded')")
    page.wait_for_selector("#view[data-loaded='true']")
    statuses = page.locator("table.tools tbody tr .badge").all_inner_texts()
    assert statuses
    assert set(statuses) == {"succeeded"}
    assert page.locator("table.tools tbody tr.unknown").count() == 0
    assert not problems


def fork_page(page: Page, served: Served, runs: Runs) -> dict[str, Any]:
    snapshots = api(served, page, f"/api/runs/{runs.counters}/snapshots")["snapshots"]
    chosen: dict[str, Any] = next(
        s for s in reversed(snapshots) if s["status"] == "complete" and "alpha" in s["recorded"]
    )
    open_view(page, served, f"/runs/{runs.counters}/fork/{chosen['id']}")
    page.wait_for_selector("textarea.json-edit[data-agent='alpha']")
    return chosen


def edit_state(page: Page, agent: str, change: dict[str, Any]) -> None:
    area = page.locator(f"textarea.json-edit[data-agent='{agent}']")
    state = json.loads(area.input_value())
    state.update(change)
    area.fill(json.dumps(state, indent=2))


def test_a_fork_with_a_valid_edited_state(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    detail = api(served, page, f"/api/runs/{runs.counters}")
    assert "alpha" in detail["schemas"], "the run stored its agents' state schemas"
    chosen = fork_page(page, served, runs)
    edit_state(page, "alpha", {"count": 100, "label": "edited in the inspector"})
    block = page.locator(".fork-agent[data-agent='alpha']")
    assert block.locator(".badge").inner_text() == "edited, valid"
    page.fill("input[name=name]", "edited fork")
    page.click("form.fork-form button[type=submit]")
    created = page.locator("a.fork-link")
    created.wait_for()
    assert created.inner_text() == "edited fork"
    assert f"S{chosen['seq']}" in page.locator(".fork-result").inner_text()
    created.click()
    # The fork page's header also matches until the new run's page replaces it: wait for the
    # new run's own header, which names its parent.
    page.wait_for_function(f"() => (location.hash.split('/')[2] || '') !== '{runs.counters}'")
    page.wait_for_selector("#view[data-loaded='true'] .run-header .lineage:has-text('forked from')")
    fork_id = page.evaluate("() => location.hash.split('/')[2]")
    assert fork_id != runs.counters
    fork = api(served, page, f"/api/runs/{fork_id}")
    assert fork["parent_run_id"] == runs.counters
    assert fork["parent_snapshot_id"] == chosen["id"]
    snapshots = api(served, page, f"/api/runs/{fork_id}/snapshots")["snapshots"]
    first = api(served, page, f"/api/runs/{fork_id}/snapshots/{snapshots[0]['id']}")
    assert first["agents"]["alpha"]["state"]["count"] == 100
    assert first["agents"]["alpha"]["state"]["label"] == "edited in the inspector"
    assert not problems


def test_a_fork_with_an_invalid_state_is_refused(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    forks_before = api(served, page, f"/api/runs/{runs.counters}")["forks"]
    fork_page(page, served, runs)
    submit = page.locator("form.fork-form button[type=submit]")
    # Against the stored schema: count must be >= 0 and an integer.
    edit_state(page, "alpha", {"count": -1})
    block = page.locator(".fork-agent[data-agent='alpha']")
    assert block.locator(".badge").inner_text() == "invalid"
    assert "$.count" in block.locator("ul.problems").inner_text()
    assert "at least 0" in block.locator("ul.problems").inner_text()
    assert submit.is_disabled()
    edit_state(page, "alpha", {"count": "many"})
    assert "must be integer" in block.locator("ul.problems").inner_text()
    assert submit.is_disabled()
    # Not JSON at all.
    page.locator("textarea.json-edit[data-agent='alpha']").fill('{"count": ')
    assert "not JSON" in block.locator("ul.problems").inner_text()
    assert submit.is_disabled()
    # Fixed again, the form may be sent.
    page.locator("textarea.json-edit[data-agent='alpha']").fill("{}")
    assert block.locator(".badge").inner_text() != "invalid"
    assert submit.is_enabled()
    assert api(served, page, f"/api/runs/{runs.counters}")["forks"] == forks_before
    assert not problems


def test_the_page_shows_why_the_server_refuses_a_fork(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    # The page gets the run without its schemas, so only the server can check the state:
    # its 422 problems are shown next to the agent.
    def without_schemas(route: Route) -> None:
        answer = route.fetch()
        body = answer.json()
        body["schemas"] = {}
        route.fulfill(response=answer, json=body)

    page.route(f"**/api/runs/{runs.counters}", without_schemas)
    forks_before = api(served, page, f"/api/runs/{runs.counters}")["forks"]
    fork_page(page, served, runs)
    edit_state(page, "alpha", {"count": -5})
    block = page.locator(".fork-agent[data-agent='alpha']")
    assert block.locator(".badge").inner_text() == "edited (no stored schema)"
    page.click("form.fork-form button[type=submit]")
    server = block.locator("ul.problems li.server")
    server.first.wait_for()
    assert "count" in server.first.inner_text()
    assert block.locator(".badge").inner_text() == "invalid"
    assert page.locator(".fork-result .error-box").count() == 1
    assert api(served, page, f"/api/runs/{runs.counters}")["forks"] == forks_before
    assert not problems


def test_a_server_without_forks_says_so(
    page: Page, runs_db: tuple[str, Runs], problems: PageProblems
) -> None:
    url, made = runs_db
    server = Served(url, allow_fork=False)
    try:
        snapshots = api(server, page, f"/api/runs/{made.counters}/snapshots")["snapshots"]
        chosen = next(s for s in snapshots if s["status"] == "complete")
        open_view(page, server, f"/runs/{made.counters}/fork/{chosen['id']}")
        page.wait_for_selector("textarea.json-edit[data-agent='alpha']")
        page.click("form.fork-form button[type=submit]")
        refusal = page.locator(".fork-result .error-box")
        refusal.wait_for()
        assert "--allow-fork" in refusal.inner_text()
    finally:
        server.stop()
    assert not problems


def test_bisect_finds_the_first_bad_snapshot(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    open_view(page, served, f"/runs/{runs.counters}/bisect")
    page.fill("input[name=path]", "$.alpha.count")
    page.select_option("select[name=op]", "<")
    page.fill("input[name=value]", "7")
    page.click(".panel form button[type=submit]")
    page.wait_for_selector(".bisect-first-bad a")
    body = page.request.post(
        f"{served.base}/api/runs/{runs.counters}/bisect",
        data={"path": "$.alpha.count", "op": "<", "value": 7},
    ).json()
    first_bad = page.locator(".bisect-first-bad a").inner_text()
    assert first_bad == f"S{body['first_bad']['seq']}"
    if body["last_good"] is not None:
        assert page.locator(".bisect-last-good a").inner_text() == f"S{body['last_good']['seq']}"
    assert f"{body['checked']} snapshot(s) checked" in page.locator(".bisect-result").inner_text()
    assert not problems


def no_script_ran(page: Page) -> None:
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator("#view img, #view script, #view b").count() == 0


def test_hostile_text_is_shown_as_text(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    open_view(page, served, "/runs")
    assert page.locator(f"tr[data-run='{runs.hostile}'] a.run-link").inner_text() == HOSTILE_RUN
    assert page.locator(f"tr[data-run='{runs.hostile}'] .tag").inner_text() == "<b>tag</b>=1"
    no_script_ran(page)
    open_view(page, served, f"/runs/{runs.hostile}")
    wait_drawn(page)
    assert page.locator(".run-header .run-name").inner_text() == HOSTILE_RUN
    labels = page.locator(".lane-label").all_inner_texts()
    assert HOSTILE_AGENT in labels
    assert HOSTILE_PEER in labels
    no_script_ran(page)
    # The forged cut, its states and the history of an agent named in HTML.
    snapshots = api(served, page, f"/api/runs/{runs.hostile}/snapshots")["snapshots"]
    forged = next(s for s in snapshots if s["initiator"] == HOSTILE_AGENT)
    open_view(page, served, f"/runs/{runs.hostile}/snapshots/{forged['id']}")
    page.wait_for_selector(".agent-state")
    assert HOSTILE_PEER in page.locator(".agent-state strong").all_inner_texts()
    assert json.dumps(HOSTILE_TEXT) in page.locator("#panel").inner_text()
    no_script_ran(page)
    page.locator(".lane-label", has_text=HOSTILE_AGENT).click()
    page.wait_for_selector("#view[data-loaded='true'] .history-item")
    assert page.locator(".agent-name").inner_text() == HOSTILE_AGENT
    no_script_ran(page)
    # A message's payload.
    open_view(page, served, f"/runs/{runs.hostile}/messages/sender/receiver/1")
    assert json.dumps(HOSTILE_TEXT) in page.locator("#panel").inner_text()
    no_script_ran(page)
    assert not problems


@pytest.fixture(scope="module")
def exported(runs_db: tuple[str, Runs], tmp_path_factory: pytest.TempPathFactory) -> Path:
    url, made = runs_db

    async def go() -> str:
        store = SqlStore(url, create=False)
        try:
            return render_html(await load_timeline(store, made.hostile))
        finally:
            await store.close()

    path = tmp_path_factory.mktemp("export") / "hostile.html"
    path.write_text(in_thread(go), encoding="utf-8")
    return path


def test_the_exported_page_draws_the_run_without_a_server(
    page: Page, exported: Path, problems: PageProblems
) -> None:
    page.route(
        "**/*",
        lambda route: route.abort() if route.request.url.startswith("http") else route.continue_(),
    )
    page.goto(exported.as_uri())
    page.wait_for_selector("#view[data-loaded='true']")
    wait_drawn(page)
    canvas = page.locator("canvas.st-canvas")
    assert canvas.get_attribute("data-mode") == "exact"
    assert int(canvas.get_attribute("data-drawn") or "") > 0
    assert page.locator(".run-name").inner_text() == HOSTILE_RUN
    assert HOSTILE_AGENT in page.locator(".lane-label").all_inner_texts()
    start, end = window(page)
    canvas.focus()
    page.keyboard.press("+")
    assert window(page)[1] - window(page)[0] < end - start
    page.keyboard.press("0")
    assert window(page) == (start, end)
    no_script_ran(page)
    assert not problems


def test_a_cut_and_an_agent_show_their_model_calls(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    base = f"/api/runs/{runs.demo}"
    snapshots = api(served, page, f"{base}/snapshots")["snapshots"]
    sid, since = next(
        (s["id"], found)
        for s in snapshots
        if (found := api(served, page, f"{base}/model-calls?snapshot={s['id']}"))["calls"]
    )
    open_view(page, served, f"/runs/{runs.demo}/snapshots/{sid}")
    section = page.locator(".model-calls-since")
    assert section.get_attribute("data-count") == str(len(since["calls"]))
    rows = section.locator("table.model-calls tbody tr")
    assert rows.count() == len(since["calls"])
    call = since["calls"][0]
    first = rows.first
    assert call["agent"] in first.inner_text()
    assert call["model"] in first.inner_text()
    first.locator("details.model-call > summary").click()
    assert first.locator("details.model-call[open] > .json").count() == 2, "request and answer"

    agent = call["agent"]
    mine = api(served, page, f"{base}/model-calls?agent={agent}")["calls"]
    history = {s["id"] for s in api(served, page, f"{base}/agents/{agent}/history")["snapshots"]}
    shown = [c for c in mine if c["snapshot_id"] is None or c["snapshot_id"] in history]
    open_view(page, served, f"/runs/{runs.demo}/agents/{agent}")
    assert page.locator("table.model-calls tbody tr").count() == len(shown) > 0
    discarded = sum(c["discarded"] for c in shown)
    assert page.locator("table.model-calls tr.discarded").count() == discarded
    assert not problems


def test_a_diff_from_the_cut_page_is_older_against_newer_and_shows_empty_strings(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    snapshots = api(served, page, f"/api/runs/{runs.counters}/snapshots")["snapshots"]
    complete = [s for s in snapshots if s["status"] == "complete"]
    first, last = complete[0], complete[-1]
    state = api(served, page, f"/api/runs/{runs.counters}/snapshots/{first['id']}")
    assert state["agents"]["alpha"]["state"]["label"] == "", "the first cut is before any work"
    # From the first cut's page, compare with the last: the diff is first -> last.
    open_view(page, served, f"/runs/{runs.counters}/snapshots/{first['id']}")
    page.select_option("select[aria-label='Compare with']", last["id"])
    page.click("button:has-text('Diff with this cut')")
    page.wait_for_function("() => location.hash.includes('/diff?')")
    page.wait_for_selector("#view[data-loaded='true'] .agent-diff")
    assert f"a={first['id']}&b={last['id']}" in page.evaluate("() => location.hash")
    label = page.locator(".agent-diff[data-agent='alpha'] table.changes tr", has_text="label")
    assert label.locator("td").nth(2).inner_text() == '""'
    # Long values wrap inside the page: nothing makes it scroll sideways.
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    assert not problems


def test_a_fork_with_a_message_in_flight_dropped_and_one_added(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    snapshots = api(served, page, f"/api/runs/{runs.demo}/snapshots")["snapshots"]
    chosen = next(s for s in snapshots if s["status"] == "complete" and s["in_flight"])
    cut = api(served, page, f"/api/runs/{runs.demo}/snapshots/{chosen['id']}")
    flying = [m for c in cut["channels"] for m in c["in_flight"]]
    dropped = flying[0]
    open_view(page, served, f"/runs/{runs.demo}/fork/{cut['id']}")
    section = page.locator(".fork-messages")
    assert f"Messages in flight ({len(flying)})" in section.locator("h3").inner_text()
    page.check(f"input.drop-message[data-message='{dropped['id']}']")
    assert section.locator(
        f".fork-message[data-message='{dropped['id']}'] .badge"
    ).inner_text() == ("dropped")
    page.select_option("select[aria-label='New message from']", "$env")
    page.select_option("select[aria-label='New message to']", dropped["dst"])
    page.fill("textarea[aria-label='New message payload']", "not json")
    page.click("button.add-message")
    submit = page.locator("form.fork-form button[type=submit]")
    assert submit.is_disabled(), "an added payload that is not JSON"
    page.locator(".fork-message.added textarea").fill('{"added": "in the page"}')
    assert submit.is_enabled()
    page.fill("input[name=name]", "fork with edited messages")
    submit.click()
    created = page.locator("a.fork-link")
    created.wait_for()
    fork_id = (created.get_attribute("href") or "").split("/")[2]
    # What-if by default: the fork's tools are dry, and the page says how to go on.
    assert "Its tools are dry" in page.locator(".fork-next").inner_text()
    commands = page.locator(".fork-next code").all_inner_texts()
    assert f"agentsnap resume {fork_id} --app MODULE:FACTORY" in commands
    assert f'Runtime(store=..., run_id="{fork_id}").resume()' in commands
    assert api(served, page, f"/api/runs/{fork_id}")["metadata"] == {"agentsnap.tools": "dry"}
    (first,) = api(served, page, f"/api/runs/{fork_id}/snapshots")["snapshots"]
    copy = api(served, page, f"/api/runs/{fork_id}/snapshots/{first['id']}")
    forked = [m for c in copy["channels"] for m in c["in_flight"]]
    expected = [m["payload"] for m in flying[1:]] + [{"added": "in the page"}]
    assert sorted(json.dumps(m["payload"]) for m in forked) == sorted(map(json.dumps, expected))
    (added,) = [m for m in forked if m["src"] == "$env"]
    assert added["dst"] == dropped["dst"]
    assert not problems


def test_the_topology_shows_who_talks_to_whom_and_filters_the_lanes(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    topology = api(served, page, f"/api/runs/{runs.counters}/topology")
    counts = {(c["src"], c["dst"]): c["messages"] for c in topology["channels"]}
    assert counts[("alpha", "beta")] > 0
    assert counts[("$env", "alpha")] > 0
    open_view(page, served, f"/runs/{runs.counters}")
    graph = page.locator(".topology-graph")
    assert graph.locator(".topology-agent").count() == len(topology["agents"])
    edge = graph.locator(".topology-edge[data-src='alpha'][data-dst='beta']")
    assert f"{counts[('alpha', 'beta')]} message(s)" in (edge.locator("title").text_content() or "")
    wait_drawn(page)  # every lane is laid out
    lanes = page.locator(".lane-label")
    every = lanes.count()
    assert every > 2
    edge.dispatch_event("click")
    page.wait_for_function("() => document.querySelectorAll('.lane-label').length === 2")
    assert sorted(lanes.all_inner_texts()) == ["alpha", "beta"]
    assert "alpha and beta" in page.locator(".topology-focus").inner_text()
    page.click("button.topology-all")
    page.wait_for_function(f"() => document.querySelectorAll('.lane-label').length === {every}")
    # An agent: itself and the agents it talks with.
    graph.locator(".topology-agent[data-agent='beta']").dispatch_event("click")
    page.wait_for_function("() => document.querySelectorAll('.lane-label').length === 2")
    assert sorted(lanes.all_inner_texts()) == ["alpha", "beta"]
    assert not problems


def test_cut_and_rollback_labels_never_overlap_and_stay_whole(
    page: Page, served: Served, runs: Runs, problems: PageProblems
) -> None:
    open_view(page, served, f"/runs/{runs.counters}")
    wait_drawn(page)
    drawn = page.evaluate(
        """() => {
            const t = window.agentsnap.timeline;
            return {
                width: t.width,
                cuts: t.labelBoxes.map((r) => r.spans),
                rollbacks: t.rollbackLabelBoxes.map((r) => r.spans),
                shown: t.labelsShown,
            };
        }"""
    )
    assert drawn["shown"] >= 1
    assert sum(len(row) for row in drawn["rollbacks"]) == 1, "the run's one rollback"
    for row in drawn["cuts"] + drawn["rollbacks"]:
        ordered = sorted(row)
        for (_a0, a1), (b0, _b1) in itertools.pairwise(ordered):
            assert a1 <= b0, f"labels overlap: {ordered}"
        for start, end in row:
            assert 0 <= start < end <= drawn["width"], "a label cut by the canvas's edge"
    assert not problems
