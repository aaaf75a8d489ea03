"""Which rules are enabled: `select`/`ignore`/`extend-select`/`per-file-ignores` resolution.

Selectors are code prefixes ("TL1" picks TL100-TL199, "TL" or "ALL" picks everything), as in
ruff. The most specific selector wins, so `select = ["TL"]`, `ignore = ["TL2"]`,
`extend-select = ["TL203"]` enables TL203 and nothing else of TL2xx.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import PurePath

from torchls.records import field, record


def normalise_selectors(selectors: Iterable[str]) -> tuple[str, ...]:
    out = []
    for selector in selectors:
        selector = selector.strip().upper()
        if selector:
            out.append("" if selector == "ALL" else selector)
    return tuple(out)


def _best_match(code: str, selectors: Iterable[str]) -> int:
    """Length of the longest selector that is a prefix of `code`, -1 if none."""
    return max((len(s) for s in selectors if code.startswith(s)), default=-1)


@record(frozen=True)
class RuleSelection:
    """The selectors in force: which codes are enabled, for which files."""

    select: tuple[str, ...] = ("",)
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    per_file_ignores: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_lists(
        cls,
        select: Iterable[str] | None = None,
        ignore: Iterable[str] | None = None,
        extend_select: Iterable[str] | None = None,
        per_file_ignores: Mapping[str, Iterable[str]] | None = None,
    ) -> RuleSelection:
        return cls(
            select=normalise_selectors(select) if select is not None else ("",),
            ignore=normalise_selectors(ignore or ()),
            extend_select=normalise_selectors(extend_select or ()),
            per_file_ignores={
                pattern: normalise_selectors(codes)
                for pattern, codes in (per_file_ignores or {}).items()
            },
        )

    def enabled(self, code: str, filename: str | None = None) -> bool:
        code = code.upper()
        chosen = max(_best_match(code, self.select), _best_match(code, self.extend_select))
        if chosen < 0 or _best_match(code, self.ignore) >= chosen:
            return False
        if filename and self.per_file_ignores:
            for pattern, codes in self.per_file_ignores.items():
                if _path_matches(filename, pattern) and _best_match(code, codes) >= 0:
                    return False
        return True

    def enabled_codes(self, codes: tuple[str, ...], filename: str | None = None) -> tuple[str, ...]:
        """Those of `codes` this selection enables for `filename` (in their order). A project
        check asks the same question for every file, so answers are remembered; the file name
        only matters when there are per-file ignores."""
        return _enabled_codes(
            self.select,
            self.ignore,
            self.extend_select,
            tuple(self.per_file_ignores.items()),
            codes,
            filename if self.per_file_ignores else None,
        )


@lru_cache(maxsize=1024)
def _enabled_codes(
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    extend_select: tuple[str, ...],
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...],
    codes: tuple[str, ...],
    filename: str | None,
) -> tuple[str, ...]:
    selection = RuleSelection(select, ignore, extend_select, dict(per_file_ignores))
    return tuple(code for code in codes if selection.enabled(code, filename))


def _path_matches(filename: str, pattern: str) -> bool:
    path = PurePath(filename)
    posix = path.as_posix()
    return (
        fnmatch.fnmatch(posix, pattern)
        or fnmatch.fnmatch(path.name, pattern)
        or fnmatch.fnmatch(posix, f"*/{pattern}")
    )
