"""The ``agentsnap`` command line."""

from __future__ import annotations

import click

from agentsnap import __version__

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentsnap")
def main() -> None:
    """Inspect and drive agentsnap runs."""
