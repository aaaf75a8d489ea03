"""Which frames are the user's, and where exactly in their source a frame is executing.

In: frames and tracebacks. Out: `Location`s (file, 1-based line, byte columns from
`co_positions()` on 3.11+) for the innermost frame that belongs to the user's project. User code
is every file under the project roots, minus torch, every site-packages/dist-packages directory,
the standard library and this probe. Verdicts are cached per code object, so the per-op cost is a
few `f_back` hops and dict lookups.
"""

from __future__ import annotations

import contextlib
import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from types import CodeType, FrameType, TracebackType


@dataclass(frozen=True)
class Location:
    filename: str
    line: int
    # UTF-8 byte offsets into the line (what co_positions gives); None on Python < 3.11.
    col: int | None = None
    end_line: int | None = None
    end_col: int | None = None

    def key(self) -> tuple[str, int]:
        return (self.filename, self.line)


def _excluded_dirs(extra: list[str]) -> list[str]:
    dirs: list[str] = []
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            dirs.append(path)
    with contextlib.suppress(AttributeError):  # some virtualenv builds lack it
        dirs.extend(site.getsitepackages())
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    if user_site:
        dirs.append(user_site)
    dirs.append(os.path.dirname(os.path.abspath(__file__)))
    dirs.extend(extra)
    return sorted({os.path.realpath(d) + os.sep for d in dirs})


_UNSEEN = object()


class UserCode:
    """Decides, once per code object, whether a frame runs the user's code."""

    def __init__(self, roots: list[str], files: list[str], exclude: list[str]) -> None:
        self._roots = [os.path.realpath(r) + os.sep for r in roots if r]
        self._files = {os.path.realpath(f) for f in files}
        self._excluded = _excluded_dirs(exclude)
        self._by_code: dict[CodeType, str | None] = {}
        self._by_name: dict[str, str | None] = {}
        self._locations: dict[tuple[CodeType, int], Location] = {}

    def filename(self, code: CodeType) -> str | None:
        """The real path of `code`'s file if it is user code, else None."""
        try:
            return self._by_code[code]
        except KeyError:
            pass
        verdict = self._classify(code.co_filename)
        self._by_code[code] = verdict
        return verdict

    def _classify(self, name: str) -> str | None:
        if name in self._by_name:
            return self._by_name[name]
        verdict: str | None = None
        if name and not name.startswith("<"):
            real = os.path.realpath(name)
            if real in self._files or (
                any(real.startswith(r) for r in self._roots)
                and not any(real.startswith(d) for d in self._excluded)
            ):
                verdict = real
        self._by_name[name] = verdict
        return verdict

    def innermost(self, frame: FrameType | None) -> FrameType | None:
        """The first user frame walking outward from `frame` (the deepest user frame)."""
        known = self._by_code  # the per-op path: a dict lookup per frame, no method call
        while frame is not None:
            code = frame.f_code
            verdict = known.get(code, _UNSEEN)
            if verdict is _UNSEEN:
                verdict = self.filename(code)
            if verdict is not None:
                return frame
            frame = frame.f_back
        return None

    def location(self, frame: FrameType) -> Location:
        code, lasti = frame.f_code, frame.f_lasti
        found = self._locations.get((code, lasti))
        if found is None:  # one `Location` per call site: the hooks ask at every step
            filename = self.filename(code) or code.co_filename
            found = self._locations[(code, lasti)] = _position(
                code, lasti, frame.f_lineno, filename
            )
        return found

    def here(self, depth: int = 1) -> Location | None:
        """The innermost user location of the current call stack."""
        frame = self.innermost(sys._getframe(depth))
        return self.location(frame) if frame is not None else None

    def traceback_location(self, tb: TracebackType | None) -> Location | None:
        """The innermost user frame of a traceback (the last one, in call order)."""
        found: Location | None = None
        while tb is not None:
            code = tb.tb_frame.f_code
            filename = self.filename(code)
            if filename is not None:
                found = _position(code, tb.tb_lasti, tb.tb_lineno, filename)
            tb = tb.tb_next
        return found


_POSITIONS: dict[tuple[CodeType, int], tuple[int | None, int | None, int | None, int | None]] = {}


def _position(code: CodeType, lasti: int, lineno: int | None, filename: str) -> Location:
    key = (code, lasti)
    pos = _POSITIONS.get(key)
    if pos is None:
        pos = (lineno, None, None, None)
        positions = getattr(code, "co_positions", None)
        if positions is not None and lasti >= 0:
            for index, item in enumerate(positions()):
                if index == lasti // 2:
                    pos = item
                    break
        _POSITIONS[key] = pos
    line, end_line, col, end_col = pos
    line = line or lineno or code.co_firstlineno
    if end_line is not None and end_line != line:
        # A multi-line expression: keep the start line's columns only, to the line end.
        end_col = None
    return Location(filename, line, col, line if col is not None else None, end_col)
