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


def noqa_map(lines: list[str]) -> dict[int, set[str]]:
    """Map 1-based row → silenced codes ({"*"} for a bare noqa)."""
    silenced: dict[int, set[str]] = {}
    for row, line in enumerate(lines, start=1):
        if "noqa" not in line and "NOQA" not in line.upper():
            continue
        match = NOQA_RE.search(line)
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
    """The line with `code` added to its noqa comment (or a new `# noqa: CODE` appended)."""
    match = NOQA_RE.search(line)
    if match is None:
        return f"{line.rstrip()}  # noqa: {code}"
    codes = match.group("codes")
    if not codes:
        return line  # a bare noqa already silences everything
    existing = re.findall(r"[A-Za-z]+[0-9]+", codes)
    if code in (c.upper() for c in existing):
        return line
    return line[: match.end("codes")] + f", {code}" + line[match.end("codes") :]
