"""``python -m agentsnap``: the command line, for an installation without the script."""

from agentsnap.cli import main

if __name__ == "__main__":
    main(prog_name="agentsnap")
