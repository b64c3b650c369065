"""Tables that fit the width they are printed in: columns wrap or give way, in order.

Rich narrows a table that is too wide by shrinking its wrappable columns and,
once they run out, by cutting every column alike: at 80 columns `jobdist show`
lost its `#` and `COMMAND` columns and cut `finished` to `finish`. Here each
column says how it gives way: it keeps its width (ids, statuses, counts: never
cut), wraps down to a floor (times, targets, commands, details) or, in a
summary, is shortened to one line ending in "…"; the least useful columns are
left out when even the floors do not fit. The widths are chosen at render
time, so a live view follows the terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.table import Table
from rich.text import Text

GAP = 2  # cells between columns (rich's default padding of 1 on each side)


@dataclass(frozen=True)
class Col:
    header: str
    floor: int | None = None  # None: keeps its width; else it may wrap down to `floor` cells
    # Gives all it can at once: a time wraps into its date and its clock, and any width
    # between the two is wasted.
    at_once: bool = False
    drop: int = 0  # > 0: left out when the table cannot fit otherwise, the highest first
    cut: bool = False  # narrowed to one line ending in "…" rather than wrapped (a summary)
    justify: JustifyMethod = "left"


Cell = str | Text


@dataclass(frozen=True)
class FittedTable:
    """A table laid out for the width it is rendered in (see the module's doc)."""

    columns: Sequence[Col]
    rows: Sequence[Sequence[Cell]]
    title: str | None = None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.layout(options.max_width)

    def layout(self, width: int) -> Table:
        """The rich Table for `width` cells."""
        natural = [self.natural(i) for i in range(len(self.columns))]
        shown = list(range(len(self.columns)))
        while (widths := allot([self.columns[i] for i in shown],
                               [natural[i] for i in shown], width)) is None:
            droppable = [i for i in shown if self.columns[i].drop]
            if not droppable:  # narrower than any layout: the floors, and rich cuts the rest
                widths = [self.columns[i].floor or natural[i] for i in shown]
                break
            shown.remove(max(droppable, key=lambda i: self.columns[i].drop))
        return self.build(shown, widths)

    def natural(self, index: int) -> int:
        """The widest line of the column, header included."""
        cells = [self.columns[index].header, *(row[index] for row in self.rows)]
        return max(cell_len(line) for cell in cells for line in plain_text(cell).split("\n"))

    def build(self, shown: list[int], widths: list[int]) -> Table:
        table = Table(title=self.title, title_justify="left", box=None, pad_edge=False,
                      expand=False)
        for index, width in zip(shown, widths, strict=True):
            column = self.columns[index]
            table.add_column(column.header, width=width,
                             no_wrap=column.floor is None or column.cut,
                             overflow="ellipsis" if column.cut else "fold",
                             justify=column.justify)
        for row in self.rows:
            table.add_row(*(row[index] for index in shown))
        return table


def plain_text(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def allot(columns: Sequence[Col], natural: Sequence[int], width: int) -> list[int] | None:
    """Column widths within `width`, or None when even the floors do not fit.

    The widest wrapping column gives a cell at a time (of equals, the later one:
    commands and details come last), all it can if `at_once`, none below its
    floor; what an `at_once` column freed beyond the need goes back to the others.
    """
    widths = list(natural)
    excess = sum(widths) + GAP * (len(widths) - 1) - width
    while excess > 0:
        shrinkable = [i for i, column in enumerate(columns)
                      if column.floor is not None and widths[i] > column.floor]
        if not shrinkable:
            return None
        widest = max(shrinkable, key=lambda i: (widths[i], i))  # a tie: the later one
        floor = columns[widest].floor
        assert floor is not None
        given = widths[widest] - floor if columns[widest].at_once else 1
        widths[widest] -= given
        excess -= given
    for i, column in enumerate(columns):
        if not column.at_once and excess < 0:
            back = min(-excess, natural[i] - widths[i])
            widths[i] += back
            excess += back
    return widths
