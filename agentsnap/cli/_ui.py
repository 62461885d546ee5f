"""``agentsnap ui``: serve the web inspector."""

from __future__ import annotations

import sys

import click

from agentsnap.cli._common import APP, DB, RETRY, guard, read, state_models
from agentsnap.cli._main import main

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


@main.command()
@DB
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to listen on (0: any free port).",
)
@click.option(
    "--open/--no-open",
    "open_browser",
    default=None,
    help="Open the page in a browser (by default when standard output is a terminal).",
)
@click.option(
    "--allow-fork",
    is_flag=True,
    help="Let the page fork runs (with edited states); read-only otherwise.",
)
@click.option(
    "--allow-answer",
    is_flag=True,
    help="Let the page answer requests to people (approve, deny, answer); off otherwise.",
)
@click.option(
    "--allow-run",
    is_flag=True,
    help="Let the page resume runs (with --app, each in a process of its own) and cancel "
    "them; off otherwise (the page shows the commands instead).",
)
@click.option(
    "--token",
    envvar="AGENTSNAP_UI_TOKEN",
    default=None,
    help="A secret every write must present (X-Agentsnap-Token), typed into the page; "
    "needed to listen beyond this machine with forks, answers or runs allowed "
    "(default: $AGENTSNAP_UI_TOKEN).",
)
@APP
def ui(  # noqa: PLR0917
    db: str,
    host: str,
    port: int,
    open_browser: bool | None,
    allow_fork: bool,
    allow_answer: bool,
    allow_run: bool,
    token: str | None,
    app_spec: str | None,
) -> None:
    """Serve the web inspector for the runs in the database, until Ctrl-C.

    It listens on this machine only (127.0.0.1) unless --host says otherwise; anyone who
    can reach the address can read the runs (fork them with --allow-fork, answer their
    requests to people with --allow-answer, resume and cancel them with --allow-run, which
    resumes a run with --app's app in a process of its own). Every write carries a token
    the page gets from the server; listening beyond this machine with writes allowed needs
    --token, a secret typed into the page instead. The API is described at /docs. With --app,
    states are shown as the app's state classes read them now, and edited states of a fork
    are validated against them. Needs the ui extra: pip install 'agentsnap[ui]'.
    """
    import socket  # noqa: PLC0415

    from agentsnap import ui as inspector  # noqa: PLC0415

    guard(inspector.require)
    import uvicorn  # noqa: PLC0415

    from agentsnap.store.sql import SqlStore  # noqa: PLC0415
    from agentsnap.ui.server import create_app  # noqa: PLC0415

    writes = [
        name
        for name, allowed in (
            ("--allow-fork", allow_fork),
            ("--allow-answer", allow_answer),
            ("--allow-run", allow_run),
        )
        if allowed
    ]
    if host not in _LOOPBACK and writes and not token:
        raise click.UsageError(
            f"listening on {host} with {', '.join(writes)} lets anyone who reaches it change "
            "runs: give a secret with --token (or AGENTSNAP_UI_TOKEN), which every write "
            "must present, or listen on 127.0.0.1"
        )
    if token is not None and len(token) < 16:
        raise click.BadParameter("give a token of at least 16 characters", param_hint="--token")
    models = state_models(app_spec)
    read(db, lambda store: store.list_runs(limit=1))  # a clear error without a schema
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host!r}: {exc}; check --host") from exc
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise click.ClickException(
            f"cannot listen on {host} port {port} ({exc.strerror or exc}): it is taken or not "
            "yours; pick another with --port (0 for any free one)"
        ) from exc
    listener.listen(2048)  # requests wait from now on, while the server starts
    bound = listener.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/"
    if host not in _LOOPBACK:
        click.echo(
            f"warning: listening on {host}, not only on this machine: anyone who can reach it "
            "can read these runs"
            + (" and fork them" if allow_fork else "")
            + (" and answer their requests" if allow_answer else ""),
            err=True,
        )
    store = SqlStore(db, create=False, retry=RETRY)
    app = create_app(
        store,
        allow_fork=allow_fork,
        allow_answer=allow_answer,
        allow_run=allow_run,
        app_spec=app_spec,
        token=token,
        close_store=True,
        models=models,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    if open_browser is None:
        open_browser = sys.stdout is not None and sys.stdout.isatty()
    try:
        click.echo(f"agentsnap inspector at {url} (Ctrl-C to stop)")
        if open_browser:
            import threading  # noqa: PLC0415
            import webbrowser  # noqa: PLC0415

            threading.Timer(0.5, webbrowser.open, [url]).start()
        server.run(sockets=[listener])
    except KeyboardInterrupt:  # before the server took over Ctrl-C, or a second one
        pass
    finally:
        listener.close()
