"""Acting on runs from the inspector, in Chromium: a SIGKILLed run resumed from the page pays
every employee once; a running run cancelled from the page stops and shows ``cancelled``;
without ``--allow-run`` the page shows the commands instead of buttons."""

from __future__ import annotations

import json
import signal
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .conftest import PageProblems, Served
from .test_browser import open_view

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from test_run_command import (  # noqa: E402
    DEADLINE,
    EMPLOYEES,
    Payroll,
    killed_on_exit,
    wait_until,
)

if TYPE_CHECKING:
    from playwright.sync_api import Page

APP = "payroll_app:make_app"


@pytest.fixture
def payroll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chromium_path: str) -> Payroll:
    made = Payroll(tmp_path)
    # What the server's `agentsnap resume` process inherits: the app's module and service.
    for name in ("PYTHONPATH", "PAYROLL_SERVICE", "PAYROLL_PROGRESS", "PAYROLL_DELAY"):
        monkeypatch.setenv(name, made.env[name])
    return made


def killed_run(payroll: Payroll) -> str:
    run_id = uuid.uuid4().hex
    with killed_on_exit(
        payroll.start(
            "run", "--app", APP, "--input", json.dumps({"employees": EMPLOYEES}), "--run-id", run_id
        )
    ) as first:
        wait_until(lambda: payroll.progress_lines() >= 2, "a payment", first)
        first.send_signal(signal.SIGKILL)
        first.wait(DEADLINE)
    assert len(payroll.paid()) < EMPLOYEES, "the kill came after the run's last payment"
    return run_id


def test_a_killed_run_resumed_from_the_page_pays_everyone_once(
    page: Page, payroll: Payroll, problems: PageProblems
) -> None:
    run_id = killed_run(payroll)
    server = Served(payroll.db, allow_fork=False, allow_run=True, app_spec=APP)
    try:
        open_view(page, server, f"/runs/{run_id}")
        page.wait_for_selector(".run-header .badge.s-interrupted", timeout=30_000)
        page.click("button.action-resume")
        confirmation = page.locator(".action-confirm")
        assert "from the run's last complete snapshot" in confirmation.inner_text()
        page.click("button.confirm-resume")
        page.wait_for_selector(".run-header .badge.s-succeeded", timeout=DEADLINE * 1000)
    finally:
        server.stop()
    paid = payroll.paid()
    assert sorted(employee for _, employee in paid) == sorted(f"e{i}" for i in range(EMPLOYEES))
    assert len({key for key, _ in paid}) == EMPLOYEES, "one payment per employee"
    assert not problems


def test_a_running_run_cancelled_from_the_page_stops(
    page: Page, payroll: Payroll, problems: PageProblems
) -> None:
    hold = payroll.tmp / "hold"
    hold.touch()  # the payer waits after its first payment, until the run is cancelled
    payroll.env["PAYROLL_HOLD"] = str(hold)
    run_id = uuid.uuid4().hex
    with killed_on_exit(
        payroll.start(
            "run", "--app", APP, "--input", json.dumps({"employees": 40}), "--run-id", run_id
        )
    ) as running:
        wait_until(lambda: payroll.progress_lines() >= 1, "a payment", running)
        server = Served(payroll.db, allow_fork=False, allow_run=True, app_spec=APP)
        try:
            open_view(page, server, f"/runs/{run_id}")
            page.click("button.action-cancel")
            assert "recorded cancelled" in page.locator(".action-confirm").inner_text()
            page.click("button.confirm-cancel")
            page.wait_for_selector(".run-header .badge.s-cancelled", timeout=DEADLINE * 1000)
            running.wait(DEADLINE)
            assert running.returncode == 1
        finally:
            server.stop()
    assert [employee for _, employee in payroll.paid()] == ["e0"]
    assert not problems


def test_without_allow_run_the_page_shows_the_command(
    page: Page, payroll: Payroll, problems: PageProblems
) -> None:
    run_id = killed_run(payroll)
    server = Served(payroll.db, allow_fork=False)
    try:
        open_view(page, server, f"/runs/{run_id}")
        command = page.locator(".run-actions code.action-command").inner_text()
        assert command.startswith(f"agentsnap resume {run_id} --app MODULE:FACTORY --db sqlite")
        assert page.locator("button.action-resume").count() == 0
    finally:
        server.stop()
    assert not problems
