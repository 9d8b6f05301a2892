"""The plain-text tables the benchmarks print: numbers with a dash for none, columns aligned."""

from __future__ import annotations


def fmt(value: float | None, digits: int = 1) -> str:
    """A number for the table, or a dash when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def print_aligned(lines: list[list[str]]) -> None:
    """`lines` (the first one the header) right-aligned in columns, a rule under the header."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for i, line in enumerate(lines):
        print(" | ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
        if i == 0:
            print("-+-".join("-" * width for width in widths))
