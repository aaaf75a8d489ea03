"""Which rules are enabled: `select`/`ignore`/`extend-select`/`per-file-ignores` resolution.

Selectors are code prefixes ("TL1" picks TL100-TL199, "TL" or "ALL" picks everything), as in
ruff. The most specific selector wins, so `select = ["TL"]`, `ignore = ["TL2"]`,
`extend-select = ["TL203"]` enables TL203 and nothing else of TL2xx.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath


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


@dataclass(frozen=True)
class RuleSelection:
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


def _path_matches(filename: str, pattern: str) -> bool:
    path = PurePath(filename)
    posix = path.as_posix()
    return (
        fnmatch.fnmatch(posix, pattern)
        or fnmatch.fnmatch(path.name, pattern)
        or fnmatch.fnmatch(posix, f"*/{pattern}")
    )
