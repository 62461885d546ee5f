"""The inspector, served for real over runs made by real runtimes, driven in Chromium.

Chromium is ``$CHROMIUM`` or ``/usr/bin/chromium`` (Playwright's own browser download is not
used). Without it, or without Playwright, the browser tests skip and say why; with
``CI=true`` they fail instead, so that a CI machine cannot pass them by lacking a browser.
A failing test leaves a screenshot of the page in its temporary directory (or in
``$AGENTSNAP_UI_SCREENSHOTS`` when set), named after the test.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from .workflows import Runs, fill

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

T = TypeVar("T")

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def unavailable(reason: str) -> None:
    """Skip, or fail under CI, when the browser tests cannot run here."""
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"{reason}; CI must run the browser tests", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not Path(CHROMIUM).is_file():
        unavailable(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("Playwright for Python is not installed (pip install -e '.[dev]')")
    return CHROMIUM


@pytest.fixture(scope="session")
def runs_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Runs]:
    url = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'runs.db'}"
    return url, in_thread(lambda: fill(url))


def in_thread(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine ``make()`` makes to completion in a thread of its own.

    The test session may hold an event loop of its own (pytest-asyncio) in this thread.
    """
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Served:
    """An inspector app served by uvicorn in a thread, stopped by ``stop``."""

    def __init__(
        self, url: str, *, allow_fork: bool, allow_answer: bool = False, **options: Any
    ) -> None:
        import uvicorn

        from agentsnap.store.sql import SqlStore
        from agentsnap.ui.server import create_app

        self.store = SqlStore(url, create=False)
        app = create_app(self.store, allow_fork=allow_fork, allow_answer=allow_answer, **options)
        port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.base = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self._serve, name="inspector", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the inspector did not start")
            time.sleep(0.05)

    def _serve(self) -> None:
        async def serve() -> None:
            try:
                await self.server.serve()
            finally:
                await self.store.close()

        asyncio.run(serve())

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="session")
def served(runs_db: tuple[str, Runs], chromium_path: str) -> Iterator[Served]:
    server = Served(runs_db[0], allow_fork=True)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def runs(runs_db: tuple[str, Runs]) -> Runs:
    return runs_db[1]


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Browser]:
    # Module-scoped: while Playwright's sync API is open, an event loop runs in this thread
    # and the asyncio tests of other modules could not start theirs.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_path)
        yield launched
        launched.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


class PageProblems(list[str]):
    """Script errors and dialogs seen on a page: a page that works has none."""


@pytest.fixture
def problems() -> PageProblems:
    return PageProblems()


@pytest.fixture
def page(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path, problems: PageProblems
) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    opened.on("pageerror", lambda error: problems.append(f"page error: {error}"))

    def console(message: Any) -> None:
        # A refused request (403, 422) is logged by the browser: that is not a script error.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            problems.append(f"console: {message.text}")

    opened.on("console", console)

    def dialog(shown: Any) -> None:
        problems.append(f"dialog: {shown.message}")
        shown.dismiss()

    opened.on("dialog", dialog)
    yield opened
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        folder = Path(os.environ.get("AGENTSNAP_UI_SCREENSHOTS") or tmp_path)
        folder.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^\w.-]+", "_", request.node.name)
        opened.screenshot(path=str(folder / f"{name}.png"), full_page=True)
    context.close()
