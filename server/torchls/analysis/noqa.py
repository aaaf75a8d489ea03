"""`# noqa` comments: which codes are silenced on which row.

In: the file's lines. Out: per row, either "everything" (bare `# noqa`) or a set of codes.
"""

from __future__ import annotations

import re

NOQA_RE = re.compile(
    r"#\s*noqa(?P<sep>\s*:\s*(?P<codes>[A-Za-z]+[0-9]+(?:\s*,?\s*[A-Za-z]+[0-9]+)*))?",
    re.IGNORECASE,
)
ALL = "*"


def _comment_start(line: str) -> int | None:
    """Index of the `#` that starts a real comment on `line`, skipping `#` inside string
    literals (single-line strings; a line inside a multi-line string is rare enough here)."""
    quote: str | None = None
    index = 0
    while index < len(line):
        char = line[index]
        if quote is not None:
            if char == "\\":
                index += 2
                continue
            if line.startswith(quote, index):
                index += len(quote)
                quote = None
                continue
        elif char in "\"'":
            quote = line[index : index + 3] if line.startswith(char * 3, index) else char
            index += len(quote)
            continue
        elif char == "#":
            return index
        index += 1
    return None


def _noqa_match(line: str) -> re.Match[str] | None:
    start = _comment_start(line)
    return NOQA_RE.search(line, start) if start is not None else None


def noqa_map(lines: list[str]) -> dict[int, set[str]]:
    """Map 1-based row → silenced codes ({"*"} for a bare noqa)."""
    silenced: dict[int, set[str]] = {}
    for row, line in enumerate(lines, start=1):
        if "noqa" not in line.lower():
            continue
        match = _noqa_match(line)
        if not match:
            continue
        codes = match.group("codes")
        if codes:
            silenced[row] = {code.upper() for code in re.findall(r"[A-Za-z]+[0-9]+", codes)}
        else:
            silenced[row] = {ALL}
    return silenced


def is_silenced(silenced: dict[int, set[str]], row: int, code: str) -> bool:
    codes = silenced.get(row)
    return bool(codes) and (ALL in codes or code in codes)


def add_code_to_line(line: str, code: str) -> str:
    """The line with `code` added to its noqa comment (or a new `# noqa: CODE` appended).

    A line ending in a backslash continuation cannot take a comment; it is returned unchanged
    (callers should not offer the action then)."""
    match = _noqa_match(line)
    if match is None:
        if line.rstrip().endswith("\\") and _comment_start(line) is None:
            return line
        return f"{line.rstrip()}  # noqa: {code}"
    codes = match.group("codes")
    if not codes:
        return line  # a bare noqa already silences everything
    existing = re.findall(r"[A-Za-z]+[0-9]+", codes)
    if code in (c.upper() for c in existing):
        return line
    return line[: match.end("codes")] + f", {code}" + line[match.end("codes") :]
