"""Tables and colour for the ``agentsnap`` command line.

A table is fitted to the terminal: when it is wider, its columns give way in a fixed order,
by their [`Kind`][agentsnap.console.Kind], until it fits:

1. ids are cut to a prefix of 8 characters (commands take a prefix wherever they take an id);
2. lists (agents, tags) are cut after an item, saying how many are hidden: `a,b,…+18`;
3. prose (reasons, errors) is wrapped onto lines of at least 20 characters;
4. times are shown to the minute, without their offset;
5. names are cut to 10 characters (or the width of their header);
6. then, on a narrower terminal, ids are cut to 6 characters, prose wrapped at 12, times
   shown as their day, lists and names cut further, headers cut to their values' width, and
   everything down to a character; last, columns on the right are left out.

Each step goes only as far as the table needs, and takes from the widest columns first.

A cut value ends with an ellipsis (`…`). The functions here are pure: they take the width
and return the lines. Colour is written as ANSI codes, which ``click.echo`` removes when the
output is not a terminal, or colour is turned off.
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import IO

import click

__all__ = [
    "ELLIPSIS",
    "GAP",
    "Kind",
    "cut",
    "cut_list",
    "ellipsis_for",
    "fit_widths",
    "kind_of",
    "paint_diff_line",
    "paint_header",
    "paint_warning",
    "paint_word",
    "render_table",
    "table_width",
    "text_width",
    "wrap",
]

ELLIPSIS = "…"
"""What ends a value that was cut."""

GAP = 2
"""Spaces between two columns."""


_MINUTE = len("2026-11-24 21:05")
"""The width of a time shown to the minute, without its offset."""
_DAY = len("2026-11-24")
"""The width of a time shown as its day."""


class Kind(enum.Enum):
    """How a column gives way when its table is wider than the terminal."""

    ID = "id"
    """An id: cut to a prefix (commands take any unique prefix of an id)."""
    LIST = "list"
    """A comma-separated list: cut after an item, with how many are hidden."""
    PROSE = "prose"
    """Words (a reason, an error): wrapped onto more lines."""
    TEXT = "text"
    """A name: cut at its end."""
    TIME = "time"
    """A time: shown to the minute once ids, lists and prose gave, as its day after names."""
    FIXED = "fixed"
    """A short value (a status, a number): cut only as a last resort."""


_HEADER, _LEAST, _NOTHING = "header", "least", "nothing"

_STEPS: tuple[tuple[Kind | None, int, str], ...] = (
    (Kind.ID, 9, _HEADER),
    (Kind.LIST, 8, _HEADER),
    (Kind.PROSE, 20, _HEADER),
    (Kind.TIME, _MINUTE, _HEADER),
    (Kind.TEXT, 10, _HEADER),
    (Kind.ID, 7, _NOTHING),
    (Kind.PROSE, 12, _NOTHING),
    (Kind.TIME, _DAY, _NOTHING),
    (Kind.LIST, 5, _NOTHING),
    (Kind.TEXT, 5, _NOTHING),
    (Kind.FIXED, 4, _LEAST),
    (Kind.PROSE, 8, _NOTHING),
    (Kind.ID, 5, _NOTHING),
    (None, 2, _NOTHING),
    (None, 1, _NOTHING),
)
"""The order in which columns give way: (kind, or every kind; the narrowest it may get;
what else it keeps whole: its header and its least useful width, that width only, or
nothing). A step is taken only while the table is still too wide."""


def _kept(keeping: str, header: int, least: int) -> tuple[int, int]:
    """The widths a step keeps of a column: of its header, and its least useful width."""
    return (header if keeping == _HEADER else 0, 0 if keeping == _NOTHING else least)


_KINDS_BY_HEADER = {
    "ID": Kind.ID,
    "RUN": Kind.ID,
    "PARENT": Kind.ID,
    "SNAPSHOT": Kind.ID,
    "CHECKPOINT": Kind.ID,
    "KEY": Kind.ID,
    "AGENTS": Kind.LIST,
    "TAGS": Kind.LIST,
    "REASON": Kind.PROSE,
    "ERROR": Kind.PROSE,
    "MESSAGE": Kind.PROSE,
}

_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d")
_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def kind_of(header: str, cells: Sequence[str] = ()) -> Kind:
    """The kind of a column, by its header, else by what its cells hold.

    Args:
        header: The column's header: `ID`, `PARENT`, `KEY` … are ids, `AGENTS` and `TAGS`
            lists, a header with `REASON` or `ERROR` in it prose, `STATUS` fixed (prose when
            a status is followed by why).
        cells: The column's values, for a header not known: numbers are fixed, times are
            times, values with commas and no spaces lists, values with spaces prose, anything
            else a name.

    Returns:
        How the column gives way.
    """
    name = header.strip().upper()
    if name == "STATUS":  # a status, or a status and why: `failed: the critic said so`
        return Kind.PROSE if any(" " in cell for cell in cells) else Kind.FIXED
    if name in _KINDS_BY_HEADER:
        return _KINDS_BY_HEADER[name]
    if name.endswith(("_ID", " ID", "-ID")):
        return Kind.ID
    if "REASON" in name or "ERROR" in name:
        return Kind.PROSE
    values = [cell for cell in cells if cell not in {"", "-"}]
    if not values or all(_NUMBER.fullmatch(value) or len(value) <= 2 for value in values):
        return Kind.FIXED
    if all(_TIME.match(value) for value in values):
        return Kind.TIME
    if any(" " in value for value in values):
        return Kind.PROSE
    if any("," in value for value in values):
        return Kind.LIST
    return Kind.TEXT


def text_width(text: str) -> int:
    """How many terminal columns ``text`` takes: wide characters count two, ANSI codes none.

    Args:
        text: One line of text.

    Returns:
        Its width in terminal columns.
    """
    return sum(_char_width(char) for char in _ANSI.sub("", text))


def _char_width(char: str) -> int:
    if unicodedata.combining(char) or unicodedata.category(char) in {"Mn", "Me", "Cf"}:
        return 0
    return 2 if unicodedata.east_asian_width(char) in {"W", "F"} else 1


def cut(text: str, width: int, ellipsis: str = ELLIPSIS) -> str:
    """``text`` cut to ``width`` terminal columns, ending with ``ellipsis`` if it was cut.

    Args:
        text: One line of text (without ANSI codes).
        width: The most columns it may take.
        ellipsis: What marks the cut.

    Returns:
        ``text`` itself when it fits, else its beginning and ``ellipsis``.
    """
    if text_width(text) <= width:
        return text
    room = width - text_width(ellipsis)
    if room < 0:
        return _head(ellipsis, width)
    return _head(text, room) + ellipsis


def _head(text: str, width: int) -> str:
    """The longest beginning of ``text`` that takes at most ``width`` columns."""
    used = 0
    for index, char in enumerate(text):
        used += _char_width(char)
        if used > width:
            return text[:index]
    return text


def cut_list(text: str, width: int, ellipsis: str = ELLIPSIS) -> str:
    """A comma-separated list cut after an item to fit ``width``, with how many are hidden.

    ``planner,researcher,writer,critic`` in 20 columns is ``planner,…+3``, in 26
    ``planner,researcher,…+2``; when not even one item fits, the list is cut like any text.

    Args:
        text: Items separated by commas.
        width: The most columns it may take.
        ellipsis: What marks the cut.

    Returns:
        ``text`` itself when it fits, else as many first items as fit and how many are left.
    """
    if text_width(text) <= width:
        return text
    items = text.split(",")
    for shown in range(len(items) - 1, 0, -1):
        candidate = ",".join(items[:shown]) + f",{ellipsis}+{len(items) - shown}"
        if text_width(candidate) <= width:
            return candidate
    return cut(text, width, ellipsis)


def wrap(text: str, width: int) -> list[str]:
    """``text`` broken into lines of at most ``width`` columns, at spaces where it can be.

    Args:
        text: Words; newlines in it start new lines.
        width: The most columns a line may take (at least 1).

    Returns:
        The lines, without trailing spaces (at least one).
    """
    width = max(width, 1)
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            candidate = f"{line} {word}" if line else word
            if text_width(candidate) <= width:
                line = candidate
                continue
            if line:
                lines.append(line)
            rest = word
            while text_width(rest) > width:  # longer than a line: break it anywhere
                head = _head(rest, width)
                if not head:  # a wide character in a column of one: marked as cut
                    head = rest[0]
                    lines.append(cut(head, width))
                else:
                    lines.append(head)
                rest = rest[len(head) :]
            line = rest
        lines.append(line)
    return lines


def fit_widths(
    headers: Sequence[str],
    natural: Sequence[int],
    kinds: Sequence[Kind],
    width: int,
    *,
    least: Sequence[int] | None = None,
) -> list[int]:
    """The width of each column so that the table takes at most ``width`` columns.

    Columns give way in the order the module describes (ids first, fixed values last);
    columns of one kind give way together, the widest first. A time's column is then set to
    the width of a time to the minute or the day, and what that frees goes back to the
    columns that were cut. A width of 0 leaves the column out: that happens only when not
    even one character per column fits.

    Args:
        headers: The columns' headers.
        natural: Each column's widest value (its header included).
        kinds: Each column's kind.
        width: The width of the terminal.
        least: Each column's narrowest useful width, kept until the later steps: a list's
            first item and how many are hidden, a fixed column's widest value (without its
            header); 0 for none.

    Returns:
        Each column's width, at most its natural width.
    """
    widths = list(natural)
    least_of = [0] * len(widths) if least is None else list(least)

    def excess() -> int:
        shown = [w for w in widths if w > 0]
        return sum(shown) + GAP * max(len(shown) - 1, 0) - width

    if excess() <= 0:
        return widths
    for kind, narrowest, keeping in _STEPS:
        if excess() <= 0:
            break
        floors = {
            i: min(natural[i], max(narrowest, *_kept(keeping, text_width(headers[i]), least_of[i])))
            for i in range(len(widths))
            if kind is None or kinds[i] is kind
        }
        _shrink(widths, floors, excess())
    for i in reversed(range(1, len(widths))):  # still too wide: leave out columns on the right
        if excess() <= 0:
            break
        widths[i] = 0
    if excess() > 0:
        widths[0] = max(width, 0)
    # A time is shown to the minute or the day: what its column has beyond that goes to the
    # columns that were cut, those that show more with it first.
    for i, kind in enumerate(kinds):
        if kind is Kind.TIME and 0 < widths[i] < natural[i]:
            widths[i] = next((w for w in (_MINUTE, _DAY) if w <= widths[i]), widths[i])
    for taker in (Kind.LIST, Kind.PROSE, Kind.TEXT, Kind.ID):
        for i, kind in enumerate(kinds):
            if kind is taker and 0 < widths[i] < natural[i] and excess() < 0:
                widths[i] += min(natural[i] - widths[i], -excess())
    return widths


def _shrink(widths: list[int], floors: dict[int, int], amount: int) -> None:
    """Take ``amount`` columns from the columns in ``floors``, the widest first."""
    while amount > 0:
        movable = [i for i in floors if widths[i] > floors[i]]
        if not movable:
            return
        top = max(widths[i] for i in movable)
        at_top = [i for i in movable if widths[i] == top]
        lower = [widths[i] for i in movable if widths[i] < top]
        level = max([*lower, *(floors[i] for i in at_top)])
        if (top - level) * len(at_top) <= amount:
            for i in at_top:
                widths[i] = level
            amount -= (top - level) * len(at_top)
        else:
            each, extra = divmod(amount, len(at_top))
            for n, i in enumerate(at_top):
                widths[i] -= each + (1 if n < extra else 0)
            amount = 0


def render_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    width: int | None = None,
    kinds: Mapping[str, Kind] | None = None,
    ellipsis: str = ELLIPSIS,
    notes: Sequence[str | None] | None = None,
) -> list[str]:
    """The lines of a table: a bold header line, then the rows, columns aligned.

    Status words are coloured (see [`paint_word`][agentsnap.console.paint_word]). ``None``
    is shown as ``-``; a value with newlines takes several lines; control characters are
    shown escaped, so that a value cannot move the cursor or change colours. A row's note
    (prose too long for a cell, such as why a run failed) takes lines of its own under the
    row, indented, wrapped to ``width`` rather than cut.

    Args:
        headers: The columns' headers.
        rows: The rows, one value per column.
        width: Fit the table into this many terminal columns; ``None`` shows every value
            whole, however wide.
        kinds: How columns give way, by header, for those whose kind
            [`kind_of`][agentsnap.console.kind_of] would guess wrong.
        ellipsis: What marks a cut value.
        notes: For each row, the text shown under it, or ``None`` for none.

    Returns:
        The lines, with ANSI codes for colour and without trailing spaces.
    """
    table = [[_cell(value) for value in row] for row in rows]
    columns = range(len(headers))
    kind = [
        (kinds or {}).get(headers[i]) or kind_of(headers[i], [row[i] for row in table])
        for i in columns
    ]
    natural = [
        max(
            text_width(line)
            for text in [headers[i], *(row[i] for row in table)]
            for line in text.split("\n")
        )
        for i in columns
    ]
    least = [_least(kind[i], [row[i] for row in table], ellipsis) for i in columns]
    widths = natural if width is None else fit_widths(headers, natural, kind, width, least=least)
    shown = [i for i in columns if widths[i] > 0]
    lines = [_line([cut(headers[i], widths[i], ellipsis) for i in shown], widths, shown, bold=True)]
    for number, row in enumerate(table):
        cells = [_fit(row[i], widths[i], kind[i], ellipsis) for i in shown]
        for depth in range(max((len(cell) for cell in cells), default=1)):
            parts = [cell[depth] if depth < len(cell) else "" for cell in cells]
            lines.append(_line(parts, widths, shown, bold=False))
        note = None if notes is None else notes[number]
        if note:
            lines += _note(_cell(note), width)
    return lines


def _note(text: str, width: int | None) -> list[str]:
    """A row's note as the lines under it: indented by a gap, wrapped to ``width``."""
    indent = " " * GAP
    if width is None:
        return [f"{indent}{line}".rstrip() for line in text.split("\n")]
    return [f"{indent}{line}".rstrip() for line in wrap(text, width - GAP)]


def _cell(value: object) -> str:
    text = "-" if value is None else str(value)
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text.replace("\t", " "))


def _least(kind: Kind, cells: list[str], ellipsis: str) -> int:
    """The narrowest useful width of a column: see [`fit_widths`][agentsnap.console.fit_widths]."""
    if kind is Kind.LIST:
        return max((_least_list(cell, ellipsis) for cell in cells), default=0)
    if kind is Kind.FIXED:
        return max((text_width(line) for cell in cells for line in cell.split("\n")), default=0)
    return 0


def _least_list(text: str, ellipsis: str) -> int:
    """The width a list needs to show its first item and how many are hidden."""
    items = text.split(",")
    if len(items) < 2:
        return text_width(text)
    return text_width(f"{items[0]},{ellipsis}+{len(items) - 1}")


def _fit(text: str, width: int, kind: Kind, ellipsis: str) -> list[str]:
    """A cell's lines at ``width``: prose wrapped, lists cut after an item, the rest cut."""
    if kind is Kind.PROSE:
        return wrap(text, width) if text_width(text) > width else text.split("\n")
    if kind is Kind.TIME and text_width(text) > width and _TIME.match(text):
        if width >= _MINUTE:  # to the minute, or the day: a whole time, no cut to mark
            return [text[:_MINUTE]]
        if width >= _DAY:
            return [text[:_DAY]]
    fitter: Callable[[str, int, str], str] = cut_list if kind is Kind.LIST else cut
    return [fitter(line, width, ellipsis) for line in text.split("\n")]


def _line(parts: list[str], widths: list[int], shown: list[int], *, bold: bool) -> str:
    out = []
    for n, (part, i) in enumerate(zip(parts, shown, strict=True)):
        pad = "" if n == len(parts) - 1 else " " * (widths[i] - text_width(part))
        painted = (click.style(part, bold=True) if part else part) if bold else paint_word(part)
        out.append(painted + pad)
    return (" " * GAP).join(out).rstrip()


_COLOURS = {
    "succeeded": "green",
    "complete": "green",
    "running": "yellow",
    "interrupted": "red",
    "in_progress": "yellow",
    "failed": "red",
    "damaged": "red",
    "unknown": "red",
    "abandoned": "magenta",
    "cancelled": "magenta",
    "retryable": "yellow",
    "compensating": "yellow",
    "compensated": "magenta",
    "compensation_failed": "red",
}
"""Colours of the words that matter at a glance."""


def paint_word(word: str) -> str:
    """``word`` coloured if it is a status that has a colour (``failed`` red …), else as is.

    In a cell that is a status and why (``failed: the critic said so``), the status is
    coloured.

    Args:
        word: A whole cell, or the line of a cell.

    Returns:
        ``word``, with ANSI codes around its status when it has a colour.
    """
    status, colon, rest = word.partition(":")
    colour = _COLOURS.get(status)
    if colour is None:
        return word
    return click.style(status, fg=colour) + colon + rest


_DIFF_COLOURS = {"+": "green", "-": "red", "~": "yellow"}


def paint_diff_line(line: str) -> str:
    """A line of a state diff coloured by its mark: ``+`` green, ``-`` red, ``~`` yellow.

    Args:
        line: A line that starts with its mark (leading spaces allowed).

    Returns:
        ``line``, with ANSI codes around it when it starts with a mark.
    """
    colour = _DIFF_COLOURS.get(line.lstrip()[:1])
    return line if colour is None else click.style(line, fg=colour)


def paint_header(line: str) -> str:
    """``line`` in bold: the line that heads what follows it.

    Args:
        line: The text.

    Returns:
        ``line``, with ANSI codes around it.
    """
    return click.style(line, bold=True)


def paint_warning(line: str) -> str:
    """``line`` in red: something is wrong (a damaged snapshot, calls with unknown outcomes).

    Args:
        line: The text.

    Returns:
        ``line``, with ANSI codes around it.
    """
    return click.style(line, fg="red")


def table_width(stream: IO[str] | None, *, wide: bool = False) -> int | None:
    """The width to fit tables to, or ``None`` for tables that show every value whole.

    Tables are fitted when ``stream`` is a terminal or ``COLUMNS`` is set, to the width
    ``shutil.get_terminal_size()`` gives (``COLUMNS`` first, then the terminal's, else 80).
    Output to a pipe or a file without ``COLUMNS`` is not fitted, so that scripts see whole
    values.

    Args:
        stream: Where the table goes (standard output).
        wide: Never fit (``--wide``).

    Returns:
        The width, or ``None``.
    """
    if wide:
        return None
    if not _columns_set() and not _isatty(stream):
        return None
    return max(shutil.get_terminal_size().columns, 1)


def _columns_set() -> bool:
    try:
        return int(os.environ.get("COLUMNS", "")) > 0
    except ValueError:
        return False


def _isatty(stream: IO[str] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except ValueError:  # closed
        return False


def ellipsis_for(stream: IO[str] | None) -> str:
    """``…``, or ``...`` when ``stream``'s encoding cannot write it.

    Args:
        stream: Where the text goes.

    Returns:
        The ellipsis to mark cut values with.
    """
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        ELLIPSIS.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return "..."
    return ELLIPSIS
