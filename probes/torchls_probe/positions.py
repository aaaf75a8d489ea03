"""Turn probe locations into report positions: 1-based lines, 1-based code-point columns.

In: `Location`s whose columns are UTF-8 byte offsets (what `co_positions()` and `ast` give).
Out: dicts with `filename`, `line`, `column`, `end_line`, `end_column` in the unit the rest of
torchls uses (like `torchls check --output-format json`: columns count code points from 1, the
end column is one past the last character). Without columns (Python < 3.10's frames, or a
multi-line expression) the span is the line's text without its indentation.
"""

from __future__ import annotations

import linecache
from typing import Any

from torchls_probe.attribution import Location


def source_line(filename: str, line: int) -> str:
    return linecache.getline(filename, line).rstrip("\r\n")


def position(loc: Location) -> dict[str, Any]:
    text = source_line(loc.filename, loc.line)
    raw = text.encode("utf-8")
    if loc.col is None:
        start = len(text) - len(text.lstrip())
        end = len(text)
    else:
        start = len(raw[: loc.col].decode("utf-8", "replace"))
        if loc.end_col is None:
            end = len(text)
        else:
            end = len(raw[: loc.end_col].decode("utf-8", "replace"))
    end = max(end, start)
    return {
        "filename": loc.filename,
        "line": loc.line,
        "column": start + 1,
        "end_line": loc.line,
        "end_column": end + 1,
    }


def columns(loc: Location) -> tuple[int, int]:
    found = position(loc)
    return found["column"], found["end_column"]
