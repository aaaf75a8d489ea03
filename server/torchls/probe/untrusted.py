"""Text that came from a run is untrusted input: make it harmless before a person sees it.

A repro runs the user's script in the user's interpreter, so everything it sends back (printed
output, exception messages, module and op names, progress messages, the report itself) may have
been written by hostile code. In: such text. Out: the same text for one destination:

- `terminal(text)`: no control characters (C0 other than newline and tab, DEL, C1, ESC), so
  nothing can move the cursor, clear the screen, write the clipboard (OSC 52) or make links
  (OSC 8) in the user's terminal or CI log;
- `one_line(text)`: the same, on one line, bounded (progress lines, status messages);
- `markdown(text)`: literal text inside Markdown: every character Markdown or HTML gives a
  meaning to is escaped, so run data never becomes a link, an image, emphasis or a table cell;
- `code(text)`: a Markdown code span (nothing inside is interpreted), safe in a table cell;
- `notification(text)`: plain text for `window/showMessage`, where clients render link syntax
  (`[label](https://...)`, `[label](command:...)`): the syntax is broken, the words stay.

Every exit of run-derived text in the CLI and the server goes through one of these.
"""

from __future__ import annotations

import re

# C0 controls except tab and newline, DEL, the C1 block (which holds CSI and OSC as single
# characters), and the Unicode bidirectional overrides that can reorder what is displayed.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# Whole escape sequences go first (CSI such as colours, OSC such as links and the clipboard,
# and two-character escapes), so that what they were wrapped around reads as plain words and
# no `[1m` residue is left once the ESC itself is removed.
_ESCAPES = re.compile(
    "\x1b\\[[0-?]{0,64}[ -/]{0,16}[@-~]"  # CSI: colours, cursor moves, erasing
    "|\x1b\\][^\x07\x1b]{0,4096}(?:\x07|\x1b\\\\)?"  # OSC: links, the clipboard, titles
    "|\x1b[@-Z\\\\-_]"  # the other two-character escapes
)
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~&\"'=:$^])")


def terminal(text: object) -> str:
    """`text` without any character a terminal would act on (newline and tab kept)."""
    text = _ESCAPES.sub("", str(text))
    return _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))


def one_line(text: object, limit: int = 500) -> str:
    """`terminal(text)` folded onto one line and cut to `limit` characters."""
    folded = " ".join(terminal(text).split())
    return folded if len(folded) <= limit else folded[: limit - 1] + "…"


def markdown(text: object) -> str:
    """`text` as literal Markdown: no link, image, emphasis, HTML or table syntax survives."""
    escaped = _MARKDOWN_SPECIAL.sub(r"\\\1", terminal(text)).replace("\n", " ")
    # Renderers that linkify bare addresses would still make one clickable: break the scheme.
    return escaped.replace("\\://", "\\:\u200b//")


def code(text: object, limit: int | None = None) -> str:
    """`text` as a Markdown code span on one line (safe inside a table cell)."""
    folded = one_line(text, limit or 10_000)
    # A code span ends at a backtick run as long as its fence; a pipe ends a table cell even
    # inside a span (GFM), unless escaped.
    folded = folded.replace("`", "'").replace("|", "\\|")
    return f"`{folded}`" if folded else "` `"


def notification(text: object, limit: int = 500) -> str:
    """Plain text for a client notification: link and autolink syntax broken, words kept."""
    plain = one_line(text, limit)
    return plain.replace("](", "] (").replace("<", "\u2039").replace(">", "\u203a")
