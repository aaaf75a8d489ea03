"""Markdown made readable as plain text, for clients that do not render Markdown.

The hovers and the rule documentation are written in Markdown. A client that accepts only
plain text (eglot without markdown-mode announces hover `contentFormat: ["plaintext"]`; every
client shows `window/showMessage` as it is) would otherwise show `**`, backticks, backslash
escapes and table pipes. In: the Markdown torchls itself writes (headings, paragraphs, lists,
emphasis, code spans and fences, links, GFM tables, thematic breaks; run-derived text in it is
already escaped by `torchls.probe.untrusted`). Out:

- `render(markdown)`: the same content as plain text: headings underlined, tables as aligned
  columns, code blocks indented, markers and escapes removed;
- `inline(text)`: for one-line messages: code spans and emphasis markers removed;
- `accepts_markdown(server)`: whether the client renders Markdown (its hover formats say).

Nothing here makes text safer or less safe: what reaches the client is plain text, which no
client interprets.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from lsprotocol import types
from pygls.capabilities import get_capability

RULE_WIDTH = 40

# A backslash before ASCII punctuation is an escape in CommonMark; elsewhere it is literal.
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_CODE_SPAN = re.compile(r"(?<!\\)(`+)(.+?)(?<!`)\1(?!`)")
_STRONG = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_EMPHASIS = re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])")
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)\s]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_BREAK = re.compile(r"^ {0,3}([-*_])(?:\s*\1){2,}\s*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_BULLET = re.compile(r"^(\s*)[*+-]\s+")
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_TABLE_RULE = re.compile(r"^\s*:?-+:?\s*$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")

# Escaped characters are parked in a private-use plane while emphasis and links are matched,
# so that `\*` never starts emphasis; they come back as the plain characters.
_PARK = 0xF0000
_HELD = 0x100000  # code spans, by number, while the text around them is read
_HELD_MAX = 0xFFFD  # spans one paragraph can hold out (the plane's size)


def accepts_markdown(server: Any) -> bool:
    """Whether the client renders Markdown: its hover formats include it, or it names none."""
    formats = get_capability(server.client_capabilities, "text_document.hover.content_format", None)
    return not formats or types.MarkupKind.Markdown in formats


def _park(match: re.Match[str]) -> str:
    return chr(_PARK + ord(match[1]))


def _unpark(text: str) -> str:
    return "".join(chr(ord(c) - _PARK) if _PARK <= ord(c) < _PARK + 128 else c for c in text)


def _prose(text: str) -> str:
    """Inline Markdown outside code spans as plain text."""
    text = _ESCAPE.sub(_park, text)
    text = _IMAGE.sub(r"\1", text)
    text = _LINK.sub(lambda m: m[1] if m[1] == m[2] else f"{m[1]} ({m[2]})", text)
    text = _AUTOLINK.sub(r"\1", text)
    text = _STRONG.sub(lambda m: m[1] or m[2], text)
    text = _EMPHASIS.sub(r"\1", text)
    return _unpark(text)


def _span_text(content: str) -> str:
    # CommonMark strips one space on each side of a span that has both.
    if len(content) > 1 and content.startswith(" ") and content.endswith(" "):
        return content[1:-1]
    return content


def inline(text: str) -> str:
    """One line (or paragraph) of Markdown without its markers: spans keep their words."""
    spans: list[str] = []

    def hold(match: re.Match[str]) -> str:
        if len(spans) >= _HELD_MAX:
            return _span_text(match[2])
        spans.append(_span_text(match[2]))
        return chr(_HELD + len(spans) - 1)

    # Spans are held out while the rest is read (their content is literal, and `**`x`**`
    # must still lose its stars), then put back.
    held = _CODE_SPAN.sub(hold, text)
    plain = _prose(held)
    return "".join(
        spans[ord(c) - _HELD] if _HELD <= ord(c) < _HELD + len(spans) else c for c in plain
    )


def width(text: str) -> int:
    """Columns `text` takes in a terminal-like display (wide East Asian characters count 2)."""
    total = 0
    for char in text:
        if unicodedata.combining(char) or char in "\u200b\u200d\ufe0f":
            continue
        total += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return total


def _cells(row: str) -> list[str]:
    body = row.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    # GFM unescapes `\|` in a cell before anything else, code spans included.
    return [inline(cell.strip().replace("\\|", "|")) for cell in _CELL_SPLIT.split(body)]


def _table(rows: list[str]) -> list[str]:
    """GFM table rows as aligned columns, the header underlined."""
    parsed = [_cells(row) for row in rows]
    header_rule = len(parsed) > 1 and all(
        _TABLE_RULE.match(c) for c in _CELL_SPLIT.split(rows[1].strip().strip("|"))
    )
    if header_rule:
        parsed.pop(1)
    columns = max(len(cells) for cells in parsed)
    for cells in parsed:
        cells.extend([""] * (columns - len(cells)))
    widths = [max(width(cells[i]) for cells in parsed) for i in range(columns)]

    def line(cells: list[str]) -> str:
        padded = [c + " " * (widths[i] - width(c)) for i, c in enumerate(cells)]
        return "  ".join(padded).rstrip()

    out = [line(cells) for cells in parsed]
    if header_rule:
        out.insert(1, "  ".join("-" * w for w in widths))
    return out


def render(markdown: str) -> str:
    """`markdown` as plain text that reads the way the rendered Markdown would."""
    out: list[str] = []
    lines = markdown.replace("\r\n", "\n").split("\n")
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        if fence:
            marker = fence[1]
            index += 1
            while index < len(lines) and not lines[index].lstrip().startswith(marker):
                out.append(f"    {lines[index]}".rstrip())
                index += 1
            index += 1  # the closing fence
            continue
        if _TABLE_ROW.match(line):
            rows = []
            while index < len(lines) and _TABLE_ROW.match(lines[index]):
                rows.append(lines[index])
                index += 1
            out.extend(_table(rows))
            continue
        heading = _HEADING.match(line)
        if heading:
            title = inline(heading[2])
            out.append(title)
            if len(heading[1]) <= 2:
                out.append(("=" if len(heading[1]) == 1 else "-") * max(width(title), 3))
        elif _BREAK.match(line):
            out.append("-" * RULE_WIDTH)
        else:
            line = _BULLET.sub(lambda m: f"{m[1]}- ", line)
            out.append(inline(line).rstrip())
        index += 1
    return "\n".join(out).strip("\n")
