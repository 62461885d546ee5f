"""Which worker hosts which agent: by name, or by a stable hash of the name into groups.

``--group N/M`` places agent ``a`` in group ``N`` (numbered from 0) of ``M`` when
``group_of(a, M) == N``: the first eight bytes of the BLAKE2b digest of the name's UTF-8
bytes, read as a big-endian unsigned integer, modulo ``M``. The same name falls in the same
group on every machine and every Python version (unlike ``hash()``), so ``M`` workers started
with ``--group 0/M`` … ``--group M-1/M`` host every agent exactly once.

```python
from agentsnap.distributed import group_of, place

assert group_of("teller-1", 3) == group_of("teller-1", 3)
names = [f"teller-{i}" for i in range(9)]
groups = [place(names, group="%d/3" % n) for n in range(3)]
assert sorted(sum(groups, [])) == sorted(names)
```
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

from agentsnap.exceptions import ConfigurationError

__all__ = ["group_of", "parse_group", "place"]


def group_of(name: str, groups: int) -> int:
    """The group (``0`` to ``groups - 1``) agent ``name`` falls in."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % groups


def parse_group(text: str) -> tuple[int, int]:
    """``"N/M"`` as ``(N, M)``.

    Raises:
        ConfigurationError: ``text`` is not two integers ``N/M`` with ``0 <= N < M``.
    """
    number, slash, total = text.partition("/")
    try:
        n, m = int(number), int(total)
    except ValueError:
        n = m = -1
    if not slash or m < 1 or not 0 <= n < m:
        raise ConfigurationError(
            f"--group {text!r} is not N/M with 0 <= N < M (e.g. 0/3, 1/3 and 2/3 for three workers)"
        )
    return n, m


def place(
    names: Sequence[str], *, agents: Collection[str] | None = None, group: str | None = None
) -> list[str]:
    """The agents of ``names`` a worker hosts: those named in ``agents``, or those in ``group``.

    Args:
        names: Every agent of the run, as the app makes them.
        agents: Agents named explicitly.
        group: ``"N/M"``: the agents in group ``N`` of ``M`` (see the module's description).

    Returns:
        The agents hosted, in the app's order.

    Raises:
        ConfigurationError: Both or neither of ``agents`` and ``group`` are given; an agent
            named is not one of the app's; the group is malformed, or holds no agent.
    """
    if (agents is None) == (group is None):
        raise ConfigurationError(
            "name the agents this worker hosts with --agents a,b or --group N/M (one of them)"
        )
    if agents is not None:
        wanted = set(agents)
        unknown = sorted(wanted - set(names))
        if unknown:
            raise ConfigurationError(
                f"the app has no agent {', '.join(map(repr, unknown))} (its agents: "
                f"{', '.join(names) or 'none'})"
            )
        if not wanted:
            raise ConfigurationError("--agents names no agent")
        return [name for name in names if name in wanted]
    assert group is not None
    n, m = parse_group(group)
    chosen = [name for name in names if group_of(name, m) == n]
    if not chosen:
        raise ConfigurationError(
            f"group {n}/{m} holds none of the app's {len(names)} agents: use fewer groups"
        )
    return chosen
