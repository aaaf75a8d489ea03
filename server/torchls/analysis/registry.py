"""The rule registry: each rule is one function plus its metadata, registered by `@rule`.

A rule function receives the file's `Facts` and yields `Hit`s; the registry turns hits into
`Finding`s with the rule's code and severity. The function's docstring is the rule's full
documentation (what it catches, why, an example, the fix), printed by `torchls rule CODE`.
A predicate that keeps a rule quiet on correct code is registered with `@exemption(code,
fixture)`: its docstring becomes a line of the rule's "Not reported" section and the negative
fixture it names is the one a test shows it protects (the fixture is reported without it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

from torchls.analysis.findings import Fix, Related, Severity, Span
from torchls.records import field, record

if TYPE_CHECKING:
    import ast

    from torchls.analysis.facts import Facts

FixAvailability = Literal["safe", "unsafe", "none"]

SEVERITY_LETTERS: dict[str, Severity] = {"E": "error", "W": "warning", "I": "information"}


@record(frozen=True)
class Hit:
    """What a rule reports: where (a node or a span), what, and optionally how to fix it."""

    where: ast.AST | Span
    message: str
    fix: Fix | None = None
    related: tuple[Related, ...] = field(default=())
    end: ast.AST | None = None


CheckFunction = Callable[["Facts"], Iterable[Hit]]


@record(frozen=True)
class Rule:
    """A registered rule: its catalog entry (code, name, severity, summary, doc) and the function
    that checks a file's facts."""

    code: str
    name: str
    severity: Severity
    summary: str
    fix: FixAvailability
    docstring: str  # as written: `doc` is the cleaned text
    check: CheckFunction
    # The rule's findings in one statement can depend on statements it reaches by no name
    # (a file-wide habit, a decorator anywhere): an editor's incremental analysis runs it on
    # the whole file (see `incremental.py`; its parity test finds rules that need this). A
    # tuple of strings: only when the text holds one of them (the rule reports nothing on
    # a text without them), so files that cannot concern it pay nothing.
    whole_file: bool | tuple[str, ...] = False

    @property
    def doc(self) -> str:
        """The documentation `torchls rule` prints: the docstring, dedented, and a "Not
        reported" section listing the rule's registered exemptions. Cleaned when asked, so a
        check's process does not import `inspect` for text it never shows."""
        import inspect

        doc = inspect.cleandoc(self.docstring)
        exemptions = EXEMPTIONS.get(self.code)
        if not exemptions:
            return doc
        lines = ["## Not reported"]
        for exempt in exemptions:
            text = " ".join(inspect.cleandoc(exempt.docstring).split())
            lines.append(f"- {text} (`{exempt.name}`, fixture `{exempt.fixture}`)")
        return doc + "\n\n" + "\n".join(lines)

    def needs_whole_file(self, text: str) -> bool:
        if isinstance(self.whole_file, tuple):
            return any(marker in text for marker in self.whole_file)
        return self.whole_file


RULES: dict[str, Rule] = {}


@record(frozen=True)
class Exemption:
    """A predicate that keeps rule `code` quiet on correct code (it returns True when the
    finding must not be reported), and the negative fixture in `tests/rules/fixtures/<code>/`
    that it protects."""

    code: str
    module: str
    name: str
    fixture: str
    docstring: str


EXEMPTIONS: dict[str, list[Exemption]] = {}

Predicate = Callable[..., bool]


def exemption(code: str, fixture: str) -> Callable[[Predicate], Predicate]:
    """Register the decorated predicate as one of rule `code`'s exemptions, protecting the
    negative fixture `fixture` (a `neg_*.py` file name). The predicate is returned unchanged;
    its docstring (one or two sentences: what correct code it recognises) is documentation."""

    def register(predicate: Predicate) -> Predicate:
        if not fixture.startswith("neg_") or not fixture.endswith(".py"):
            raise ValueError(f"{predicate.__name__}: {fixture!r} is not a negative fixture")
        if not predicate.__doc__:
            raise ValueError(f"{predicate.__name__}: an exemption needs a docstring")
        EXEMPTIONS.setdefault(code, []).append(
            Exemption(code, predicate.__module__, predicate.__name__, fixture, predicate.__doc__)
        )
        return predicate

    return register


def rule(
    code: str,
    name: str,
    severity: str,
    summary: str,
    fix: FixAvailability = "none",
    whole_file: bool | tuple[str, ...] = False,
) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check function under `code`; `severity` is "E", "W" or "I". `whole_file`:
    see `Rule.whole_file`."""

    def register(check: CheckFunction) -> CheckFunction:
        if code in RULES:
            raise ValueError(f"rule {code} registered twice")
        severity_ = SEVERITY_LETTERS[severity]
        doc = check.__doc__ or ""
        RULES[code] = Rule(code, name, severity_, summary, fix, doc, check, whole_file)
        return check

    return register
