"""Take the web inspector's screenshots of the how-to (docs/images/inspector-*.png).

    python scripts/inspector_screenshots.py [--chromium PATH] [-o docs/images]

It makes a few runs of a small payroll in a temporary SQLite database (one killed and
resumed by ``agentsnap resume``, one that fails, a dry fork with a payment dropped, a tool
call whose outcome is unknown), serves the inspector over them and photographs the views
with headless Chromium (Playwright). Chromium is ``--chromium``, else ``$CHROMIUM``, else
``/usr/bin/chromium``. The module is also the app those runs use
(``inspector_screenshots:make_app``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from agentsnap import Agent, AgentState, Context, HandlerFailed, Message, Runtime, tool
from agentsnap.distributed import App

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _note(employee: str) -> None:
    with Path(os.environ["PAYROLL_LEDGER"]).open("a", encoding="utf-8") as file:
        file.write(f"{employee}\n")


@tool(
    side_effect=True,
    rerun_if_unknown=True,
    dry_run=lambda arguments: f"would pay {arguments['employee']}",
)
async def pay(employee: str, amount: int) -> str:
    """Pay ``employee`` (a note in the file ``PAYROLL_LEDGER``)."""
    await asyncio.sleep(float(os.environ.get("PAYROLL_DELAY", "0")))
    if employee == "boom":
        try:
            raise KeyError(employee)
        except KeyError as exc:
            raise ValueError(f"the bank refused to pay {employee}") from exc
    await asyncio.to_thread(_note, employee)
    return f"paid {amount} to {employee}"


class Clerk(Agent[AgentState]):
    """Sends a payment per name to the payer."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:  # noqa: D102
        payload = cast("dict[str, Any]", message.payload)
        for name in payload["names"]:
            ctx.send("payer", {"employee": name, "amount": 100}, kind="pay")


class Payer(Agent[AgentState]):
    """Pays, and tells the auditor."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:  # noqa: D102
        payload = cast("dict[str, Any]", message.payload)
        receipt = await pay(ctx, employee=payload["employee"], amount=payload["amount"])
        ctx.state.memory[payload["employee"]] = receipt
        ctx.send("auditor", {"receipt": receipt, "amount": payload["amount"]}, kind="paid")


class AuditState(AgentState):
    """What the auditor counted."""

    paid: int = 0
    total: int = 0


class Auditor(Agent[AuditState]):
    """Adds the payments up."""

    async def handle(self, message: Message, ctx: Context[AuditState]) -> None:  # noqa: D102
        self.state.paid += 1
        self.state.total += int(cast("dict[str, Any]", message.payload)["amount"])


def make_app() -> App:
    """The clerk, the payer and the auditor."""
    return App(agents=[Clerk("clerk"), Payer("payer"), Auditor("auditor", AuditState())])


NAMES = ["ann", "bo", "cy", "di", "ed", "flo", "gus", "hal"]


def agentsnap(db: str, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """Start ``agentsnap ARGS --db DB``."""
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "agentsnap", *args, "--db", db],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def killed_and_resumed(db: str, env: dict[str, str], ledger: Path) -> str:
    """A run killed after its third payment and resumed three seconds later."""
    run_id = uuid.uuid4().hex
    payload = json.dumps({"names": NAMES})
    app = "inspector_screenshots:make_app"
    first = agentsnap(db, env, "run", "--app", app, "--input", payload, "--run-id", run_id)
    deadline = time.monotonic() + 60
    while not ledger.exists() or len(ledger.read_text().splitlines()) < 3:
        if time.monotonic() > deadline or first.poll() is not None:
            raise SystemExit("the payroll run ended before it could be killed")
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(3)
    resumed = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "agentsnap", "resume", run_id, "--app", app, "--db", db],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if resumed.returncode != 0:
        raise SystemExit(f"agentsnap resume failed:\n{resumed.stdout}{resumed.stderr}")
    return run_id


async def in_process_runs(url: str) -> dict[str, str]:
    """A run with payments in flight at a cut, its dry fork, a failed run, an unknown call."""
    from agentsnap.fork import MessageEdits  # noqa: PLC0415
    from agentsnap.inspect import fork_run  # noqa: PLC0415
    from agentsnap.ledger import LedgerEntry, ToolCallStatus, fingerprint  # noqa: PLC0415
    from agentsnap.records import utcnow  # noqa: PLC0415
    from agentsnap.store.ledger import ledger_for  # noqa: PLC0415
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    store = SqlStore(url)
    try:
        async with Runtime(store=store, name="payroll of March") as parent:
            for agent in make_app().agents:
                parent.add(agent)
            parent.send("clerk", {"names": NAMES[:5]})
            handle = parent.snapshot()
            await parent.run_until_idle()
            cut = await handle
            await parent.snapshot()
        flying = [m for c in cut.channels if c.dst == "payer" for m in c.messages]
        dropped = flying[0]
        who = cast("dict[str, Any]", dropped.payload)["employee"]
        fork = await fork_run(
            store,
            cut.id,
            tools="dry",
            name=f"what if {who} was not paid",
            messages=MessageEdits(drop=[dropped.id]),
        )
        async with Runtime(store=store, run_id=fork.id) as continued:
            for agent in make_app().agents:
                continued.add(agent)
            await continued.resume()
            await continued.run_until_idle()
            await continued.snapshot()
        failing = Runtime(store=store, name="payroll with a refused payment")
        with contextlib.suppress(HandlerFailed):  # the failure is what is photographed
            async with failing:
                for agent in make_app().agents:
                    failing.add(agent)
                failing.send("clerk", {"names": ["ann", "boom"]})
                await failing.run_until_idle()
        ledger = ledger_for(store)
        assert ledger is not None
        now = utcnow()
        arguments: dict[str, Any] = {"employee": "ivy", "amount": 100}
        lost = LedgerEntry(
            key=f"pay:{parent.run_id[:8]}:ivy",
            tool="pay",
            fingerprint=fingerprint(arguments),
            arguments=arguments,
            status=ToolCallStatus.IN_PROGRESS,
            created_at=now,
            updated_at=now,
            run_id=parent.run_id,
            agent="payer",
            message_id="clerk>payer#1",
            owner="payroll-host:999999999:gone",
        )
        await ledger.claim(dataclasses.replace(lost, lease_until=now - timedelta(seconds=1)))
        await ledger.close()
        return {"parent": parent.run_id, "fork": fork.id, "failed": failing.run_id}
    finally:
        await store.close()


class Served:
    """The inspector over ``url`` in a thread."""

    def __init__(self, url: str) -> None:
        import uvicorn  # noqa: PLC0415

        from agentsnap.store.sql import SqlStore  # noqa: PLC0415
        from agentsnap.ui.server import create_app  # noqa: PLC0415

        self.store = SqlStore(url, create=False)
        app = create_app(self.store, allow_fork=True, allow_run=True, app_spec="MODULE:FACTORY")
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=8765, log_level="warning")
        )
        self.base = "http://127.0.0.1:8765"
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()))
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop serving."""
        self.server.should_exit = True
        self.thread.join()


def photograph(base: str, runs: dict[str, str], chromium: str, out: Path) -> None:
    """Photograph the new views into ``out``."""
    from playwright.sync_api import sync_playwright  # noqa: PLC0415

    def shot(  # noqa: PLR0917
        page: Any, route: str, name: str, ready: str, act: Any = None, part: str | None = None
    ) -> None:
        page.goto(f"{base}/#{route}")
        page.wait_for_selector("#view[data-loaded='true']")
        page.wait_for_selector(ready)
        if act is not None:
            act(page)
        page.wait_for_timeout(300)
        if part is None:
            page.screenshot(path=str(out / name))
        else:
            page.locator(part).screenshot(path=str(out / name))
        print(f"wrote {out / name}")

    def resolve_form(page: Any) -> None:
        page.click("button.action-resolve")
        page.wait_for_selector("form.resolve-form")
        page.fill("textarea.resolve-result", '"paid 100 to ivy"')

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 820})
        shot(
            page,
            f"/runs/{runs['killed']}",
            "inspector-incidents.png",
            "canvas.st-canvas[data-folds]",
            part=".spacetime",
        )
        shot(
            page,
            f"/runs/{runs['killed']}/events?agent=payer",
            "inspector-events.png",
            "table.events",
        )
        shot(page, f"/runs/{runs['failed']}", "inspector-failure.png", ".run-failure")
        shot(
            page,
            f"/runs/{runs['parent']}/tools?status=unknown",
            "inspector-resolve.png",
            "table.tools",
            resolve_form,
        )
        shot(page, f"/runs/{runs['fork']}/compare", "inspector-compare.png", ".compare-cut")
        browser.close()


def main() -> None:
    """Make the runs, serve them, photograph the views."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM") or "/usr/bin/chromium")
    parser.add_argument("-o", "--out", type=Path, default=ROOT / "docs" / "images")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'runs.db'}"
        ledger = Path(tmp) / "paid.txt"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
            "PAYROLL_LEDGER": str(ledger),
            "PAYROLL_DELAY": "0.15",
        }
        killed = killed_and_resumed(db, env, ledger)
        os.environ["PAYROLL_LEDGER"] = str(ledger)
        runs = asyncio.run(in_process_runs(db))
        runs["killed"] = killed
        served = Served(db)
        try:
            photograph(served.base, runs, options.chromium, options.out)
        finally:
            served.stop()


if __name__ == "__main__":
    main()
