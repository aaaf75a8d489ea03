"""Cross-file resolution: imported names → their definitions in the user's project.

In: the `Facts` of one file and a local name it imported (`from models import Net`). Out: the
`Facts` of the defining file and the class or function node, so the analysis can follow a model
class's `forward`, a factory returning an `nn.Sequential`, or a loss wrapper into `models.py`.

One `Workspace` serves the whole analysis. Its project index (`index.py`) names the file of
every project module from the file system, by any dotted tail, so a script that puts its own
folders on `sys.path` is followed too; jedi is asked only when there is no root folder or the
tree is too large for the index to walk. It caches, per file *content*, the parsed facts of
other files (and jedi's answers), so an edit to `models.py` (in the editor, through the
overlay, or on disk) is seen on the next request and unchanged files cost nothing. Only
definitions inside the workspace root count: libraries are not analysed.
"""

from __future__ import annotations

import ast
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from torchls.analysis.hashing import content_digest
from torchls.analysis.index import ProjectIndex
from torchls.analysis.objects import ClassRef, ObjectModel
from torchls.analysis.queries.vocabulary import LIBRARY_ROOTS
from torchls.records import record

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts, FunctionNode
    from torchls.analysis.source import ParsedSource

MAX_FOLLOW_DEPTH = 3
# Other project files whose facts stay cached: enough for the modules a project's scripts
# share (models, losses, utils), while a server with hundreds of files open stays small.
FACTS_LIMIT = 64
# A project of more modules is not searched for the callers of a function in another file.
CALLER_SEARCH_LIMIT = 400

Overlay = Callable[[Path], "str | None"]


@record(frozen=True)
class Definition:
    """A resolved name: `node` (ClassDef or FunctionDef) in the file whose facts are `facts`."""

    facts: Facts
    node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


Stamp = tuple[int, int, int, int]


def file_stamp(path: str | Path) -> Stamp | None:
    """What tells one version of a file from the next without reading it: modification time
    in nanoseconds, size, inode and device (None when the file cannot be looked at)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size, status.st_ino, status.st_dev)


def _read_source(path: Path) -> str | None:
    """The decoded text of `path` on disk; None when it cannot be read or decoded."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    from torchls.analysis.source import SourceError, decode_source

    try:
        return decode_source(data)
    except SourceError:
        return None


def _digest(text: str) -> str:
    return content_digest(text.encode("utf-8", "surrogatepass"))


class Workspace:
    """The project the analysed files belong to; thread-safe, caches per file content."""

    def __init__(
        self,
        root: str | Path | None = None,
        overlay: Overlay | None = None,
        share_parses: bool = False,
    ) -> None:
        self.root = Path(root).resolve() if root else None
        self.overlay = overlay
        # A project check parses each module once for its own check and once for the files
        # that import it: with this, both stand on one parse (and one syntax index).
        self.share_parses = share_parses
        self._lock = threading.RLock()
        # Least recently used first; at most FACTS_LIMIT files (a full tree and index each).
        self._facts: OrderedDict[Path, tuple[str, Facts]] = OrderedDict()
        # Facts taken out of the cache, released when no analysis is running (`analysing`).
        self._dropped: list[Facts] = []
        self._active = 0
        # Keyed by the import itself (file, local name, what it imports), not the file's whole
        # text, so typing elsewhere in the file keeps the answer.
        self._answers: dict[tuple[Path, str, str], tuple[Path, int] | None] = {}
        self._dependents: dict[Path, set[Path]] = {}
        self._real: dict[str | Path, Path] = {}
        # Least recently used first, as `_facts`: the parse of each file version.
        self._parses: OrderedDict[Path, tuple[str, ParsedSource]] = OrderedDict()
        # File -> (its stat stamp, the digest of the text read under that stamp).
        self._stamps: dict[Path, tuple[Stamp, str]] = {}
        self._scripts: dict[Path, tuple[str, object]] = {}
        self._project = None
        self._depth = threading.local()
        self.jedi_calls = 0
        # Plain project imports are named from the file system first; jedi only for the rest.
        self.index = ProjectIndex(self.root)

    # ------------------------------------------------------------------ files
    def text_of(self, path: Path) -> str | None:
        if self.overlay is not None:
            text = self.overlay(path)
            if text is not None:
                return text
        return _read_source(path)

    def real_path(self, path: str | Path) -> Path:
        """`path` with its links resolved, remembered until `invalidate()`: the same few files
        are named thousands of times in one check, and each resolution asks the file system
        about every folder on the way."""
        known = self._real.get(path)
        if known is None:
            known = self._real[path] = Path(path).resolve()
        return known

    def facts_for(self, path: Path) -> Facts | None:
        """The facts of another project file, rebuilt only when its content changed."""
        path = self.real_path(path)
        overlaid = self.overlay(path) if self.overlay is not None else None
        stamp = None
        if overlaid is not None:
            with self._lock:
                cached = self._facts.get(path)
                # The overlay handed back the very text these facts were built from.
                if cached is not None and cached[1].source.text is overlaid:
                    self._facts.move_to_end(path)
                    return cached[1]
        else:
            # A file whose stamp is that of the version already hashed is not read and
            # hashed again.
            stamp = file_stamp(path)
            if stamp is None:
                return None
            with self._lock:
                known = self._stamps.get(path)
                cached = self._facts.get(path)
                if known is not None and known[0] == stamp and cached is not None:
                    if cached[0] == known[1]:
                        self._facts.move_to_end(path)
                        return cached[1]
        text = overlaid if overlaid is not None else self.text_of(path)
        if text is None:
            return None
        digest = _digest(text)
        if stamp is not None:
            with self._lock:
                self._stamps[path] = (stamp, digest)
        with self._lock:
            cached = self._facts.get(path)
            if cached is not None and cached[0] == digest:
                self._facts.move_to_end(path)
                return cached[1]
            if cached is not None:
                self._evict(path)  # changed on disk: its importers' memos point at the old
        from torchls.analysis.facts import build_facts
        from torchls.analysis.source import SourceError

        try:
            facts = build_facts(self.parsed(path, text, digest), str(path), self)
        except (SourceError, RecursionError):
            return None
        with self._lock:
            self._facts[path] = (digest, facts)
            self._facts.move_to_end(path)
            while len(self._facts) > FACTS_LIMIT:
                self._evict(next(iter(self._facts)))
        return facts

    def parsed(self, path: str | Path, text: str, digest: str | None = None) -> ParsedSource:
        """The parse of `text`, the content of `path`: one parse per file version, shared by
        the file's own check and by every file that follows an import into it (a project
        check reads each module both ways). Syntax trees are never changed by the analysis,
        so two facts can stand on one. Raises `SourceError` as `parse_source` does."""
        from torchls.analysis.source import parse_source

        if not self.share_parses:
            return parse_source(text)
        real = self.real_path(path)
        digest = digest if digest is not None else _digest(text)
        with self._lock:
            cached = self._parses.get(real)
            if cached is not None and cached[0] == digest:
                self._parses.move_to_end(real)
                return cached[1]
        parsed = parse_source(text)
        with self._lock:
            self._parses[real] = (digest, parsed)
            self._parses.move_to_end(real)
            while len(self._parses) > FACTS_LIMIT:
                self._parses.popitem(last=False)
        return parsed

    def _evict(self, path: Path) -> None:
        """Drop the facts of `path` and of every cached file whose memos may point into them
        (the files that followed a name into it, and theirs): a kept importer would keep the
        evicted facts alive through its memos, and the bound would not bound anything."""
        todo = [path]
        while todo:
            current = todo.pop()
            dropped = self._facts.pop(current, None)
            if dropped is not None:
                self._dropped.append(dropped[1])
                todo.extend(self._dependents.get(current, ()))

    @contextmanager
    def analysing(self) -> Iterator[None]:
        """Around one analysis that may use this workspace's facts. Facts dropped from the
        cache are released (their cycles broken, see `Facts.release`) once no analysis is
        running: one may still be reading them until it ends."""
        with self._lock:
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                dropped = self._dropped if self._active == 0 else []
                if dropped:
                    self._dropped = []
            for facts in dropped:
                facts.release()

    def invalidate(self, path: str | Path | None = None) -> None:
        """Forget cached facts (of one file, or all); content hashing makes this an optimisation,
        not a correctness requirement."""
        with self._lock:
            if path is None:
                self._dropped.extend(facts for _, facts in self._facts.values())
                self._facts.clear()
                self._scripts.clear()
                self._answers.clear()
                self._real.clear()
                self._stamps.clear()
                self._parses.clear()
                self.index.forget()
            else:
                real = Path(path).resolve()
                self._evict(real)
                self._scripts.pop(real, None)
                self._stamps.pop(real, None)
                self._parses.pop(real, None)
                self._real.clear()
                # A file that appeared or vanished can change where any import points.
                self._answers.clear()
                self.index.forget()

    def contains(self, path: Path) -> bool:
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            return False
        if self.root is None:
            return True
        try:
            self.real_path(path).relative_to(self.root)
        except ValueError:
            return False
        return True

    # ------------------------------------------------------------------ names
    def cached_view(self) -> CachedView:
        """This workspace answering only from what it already knows (no jedi call); the view
        records whether an answer was missing, so a slower full pass can follow."""
        return CachedView(self)

    def calls_elsewhere(
        self, facts: Facts, function: FunctionNode, named: str | None = None
    ) -> list[tuple[Facts, ast.Call]] | None:
        """The calls, in the other files of the project, that run `function` of `facts`'s
        file (found through each file's own resolution of its callees). None when the
        project cannot be searched (no root, a tree too large, more than CALLER_SEARCH_LIMIT
        modules) or a file that imports it calls a method of that name on an object it
        cannot name (it may be a caller). `named`: the name the calls spell (a class's name
        for the constructions that run its `__init__`). Every module searched is recorded as
        something `facts`'s file depends on: a file that gains or loses such a call changes
        what its analysis may say."""
        if self.root is None or facts.filename.startswith("<"):
            return None
        modules = self.index.module_paths()
        if modules is None:
            return None
        paths = [path for entries in modules.values() for _, path in entries]
        if len(paths) > CALLER_SEARCH_LIMIT:
            return None
        own = self.real_path(facts.filename)
        tail = own.parent.name if own.name == "__init__.py" else own.stem
        wanted = named or function.name
        # A caller may import it through its package's `__init__` (`from pkg.engine import
        # run`, `pkg.engine.run(...)`), naming the package but not the module file: only
        # when that `__init__` names it (re-exports it), else every file naming the package
        # would be searched, and one unknown `.step()` among them stops the search.
        package = own.parent.name
        init_text = self.text_of(own.parent / "__init__.py") if own.name != "__init__.py" else None
        if init_text is None or wanted not in init_text:
            package = tail
        found: list[tuple[Facts, ast.Call]] = []
        for path in paths:
            path = self.real_path(path)
            if path == own:
                continue
            with self._lock:
                self._dependents.setdefault(path, set()).add(own)
            text = self.text_of(path)
            if text is None or wanted not in text or (tail not in text and package not in text):
                continue
            other = self.facts_for(path)
            if other is None:
                continue
            for call in other.calls:
                func = call.func
                named_here = (
                    func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                )
                if named_here != wanted:
                    continue
                target = other.callee(call)
                if target is None and isinstance(func, ast.Attribute):
                    # `self.updater.step(...)` with `self.updater = Updater(...)`.
                    method = other.get(ObjectModel).object_method(call)
                    target = (method[0], method[1], True) if method is not None else None
                if target is None and isinstance(func, ast.Attribute):
                    if _module_method(other, func):
                        continue  # `net.train()` of a module built here: `nn.Module`'s own
                    return None  # `evaluator.evaluate(model)` of an object we cannot name
                if (
                    target is not None
                    and self.real_path(target[0].filename) == own
                    and target[1].lineno == function.lineno
                ):
                    found.append((other, call))
        return found

    def subclasses_elsewhere(self, facts: Facts, klass: ast.ClassDef) -> list[tuple[Facts, str]]:
        """The classes, in the other files of the project, that have the class `klass` of
        `facts`'s file among their project bases (directly or through other classes): each
        as (facts of its file, class name). Empty when the project cannot be searched (as
        `calls_elsewhere`). Every module searched is recorded as something `facts`'s file
        depends on: a file that gains or loses such a subclass changes what may be said."""
        if self.root is None or facts.filename.startswith("<"):
            return []
        modules = self.index.module_paths()
        if modules is None:
            return []
        paths = [path for entries in modules.values() for _, path in entries]
        if len(paths) > CALLER_SEARCH_LIMIT:
            return []
        own = self.real_path(facts.filename)
        tail = own.parent.name if own.name == "__init__.py" else own.stem
        found: list[tuple[Facts, str]] = []
        for path in paths:
            path = self.real_path(path)
            if path == own:
                continue
            with self._lock:
                self._dependents.setdefault(path, set()).add(own)
            text = self.text_of(path)
            # A subclass's file names the base and the module it imports it from (a class
            # deriving from a subclass defined in a third file is not looked for).
            if text is None or klass.name not in text or tail not in text:
                continue
            other = self.facts_for(path)
            if other is None:
                continue
            model = other.get(ObjectModel)
            for info in other.classes.values():
                if not info.node.bases:
                    continue
                for ref in model.lineage(ClassRef(other, info))[1:]:
                    if (
                        ref.info.node.name == klass.name
                        and ref.info.node.lineno == klass.lineno
                        and self.real_path(ref.facts.filename) == own
                    ):
                        found.append((other, info.node.name))
                        break
        return found

    def dependents_of(self, path: str | Path) -> set[Path]:
        """Files whose analysis followed a name into `path` (they need re-checking when it
        changes)."""
        with self._lock:
            return set(self._dependents.get(self.real_path(path), ()))

    def resolve(
        self, facts: Facts, local_name: str, view: CachedView | None = None
    ) -> Definition | None:
        """The definition an imported `local_name` of `facts` refers to, if in the project."""
        imported = facts.imports.get(local_name)
        position = facts.import_positions.get(local_name)
        if imported is None or position is None or facts.filename.startswith("<"):
            return None
        if imported.split(".")[0] in LIBRARY_ROOTS:
            return None
        depth = getattr(self._depth, "value", 0)
        if depth >= MAX_FOLLOW_DEPTH:
            return None
        path = self.real_path(facts.filename)
        indexed = self._resolve_by_index(path, imported, depth, view)
        if indexed is not None:
            return indexed or None
        if self.index.module_paths() is not None:
            # The index has seen every module file under the root, by every dotted tail:
            # what it cannot place is no project file, and jedi could only name a library.
            return None
        key = (path, local_name, imported)
        with self._lock:
            known = key in self._answers
            answer = self._answers.get(key)
        if not known:
            if view is not None:
                view.missed = True
                return None
            answer = self._ask_jedi(path, facts.source.text, _digest(facts.source.text), position)
            with self._lock:
                self._answers[key] = answer
        if answer is None:
            return None
        target_path, line = answer
        with self._lock:
            self._dependents.setdefault(target_path, set()).add(path)
        self._depth.value = depth + 1
        try:
            other = self.facts_for(target_path)
        finally:
            self._depth.value = depth
        if other is None:
            return None
        return _definition_at(other, line, imported.rsplit(".", 1)[-1])

    def _resolve_by_index(
        self, path: Path, imported: str, depth: int, view: CachedView | None = None
    ) -> Definition | bool | None:
        """The definition the project index names for `imported` (False: the index found the
        module but not the name in it; None: the index cannot tell, ask jedi). A re-export is
        followed under the same `view`, so a keystroke pass never reaches jedi through it."""
        located = self.index.locate(path, imported)
        if located is None or located[1] is None:
            return None
        target_path, attribute = located
        if not self.contains(target_path):
            return None
        with self._lock:
            self._dependents.setdefault(target_path, set()).add(path)
        self._depth.value = depth + 1
        try:
            other = self.facts_for(target_path)
            if other is None:
                return False
            node = other.classes.get(attribute)
            found = node.node if node is not None else other.functions.get(attribute)
            if found is not None:
                return Definition(other, found)
            if attribute in other.imports:  # re-exported: `from .models import Net` in __init__
                return self.resolve(other, attribute, view) or False
            return False
        finally:
            self._depth.value = depth

    def module_facts(
        self, facts: Facts, local_name: str, dotted: str | None = None
    ) -> Facts | None:
        """The facts of the project module a plain `import utils` (or `from pkg import
        utils`) bound to `local_name`, or of the module named `dotted` (a star import's),
        named by the index; None for libraries."""
        imported = dotted if dotted is not None else facts.imports.get(local_name)
        if imported is None or facts.filename.startswith("<"):
            return None
        if imported.split(".")[0] in LIBRARY_ROOTS:
            return None
        depth = getattr(self._depth, "value", 0)
        if depth >= MAX_FOLLOW_DEPTH:
            return None
        path = self.real_path(facts.filename)
        located = self.index.locate(path, imported)
        if located is None or located[1] is not None or not self.contains(located[0]):
            return None
        with self._lock:
            self._dependents.setdefault(located[0], set()).add(path)
        self._depth.value = depth + 1
        try:
            return self.facts_for(located[0])
        finally:
            self._depth.value = depth

    def _ask_jedi(
        self, path: Path, text: str, digest: str, position: tuple[int, int]
    ) -> tuple[Path, int] | None:
        import jedi

        with self._lock:
            if self._project is None:
                self._project = jedi.Project(str(self.root or path.parent))
            cached = self._scripts.get(path)
            if cached is not None and cached[0] == digest:
                script = cached[1]
            else:
                script = jedi.Script(text, path=str(path), project=self._project)
                self._scripts[path] = (digest, script)
            self.jedi_calls += 1
            try:
                names = script.goto(position[0], position[1], follow_imports=True)  # type: ignore[attr-defined]
            except Exception:  # jedi raises assorted internal errors on odd code
                return None
        for name in names:
            module_path = name.module_path
            if module_path is None or name.line is None or name.type not in ("class", "function"):
                continue
            module_path = Path(module_path)
            if module_path.suffix != ".py" or not self.contains(module_path):
                continue
            return module_path.resolve(), name.line
        return None


class CachedView:
    """A `Workspace` stand-in that never calls jedi: unknown imports resolve to nothing and
    set `missed`. Used for the editor's fast first pass."""

    # Whether this view answers every question as its workspace would (a subclass for a
    # full pass says so): then what is derived through it is the workspace's answer too.
    complete = False

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.missed = False

    def resolve(self, facts: Facts, local_name: str) -> Definition | None:
        return self.workspace.resolve(facts, local_name, view=self)

    def module_facts(
        self, facts: Facts, local_name: str, dotted: str | None = None
    ) -> Facts | None:
        return self.workspace.module_facts(facts, local_name, dotted)


def _definition_at(facts: Facts, line: int, name: str) -> Definition | None:
    info = facts.classes.get(name)
    if info is not None and info.node.lineno <= line <= (info.node.end_lineno or line):
        return Definition(facts, info.node)
    function = facts.functions.get(name)
    if function is not None:
        return Definition(facts, function)
    if info is not None:
        return Definition(facts, info.node)
    return None


def _module_method(facts: Facts, func: ast.Attribute) -> bool:
    """`func` is a method of a module object whose construction is in sight (a torch layer,
    or a project module class that does not define the method, since `callee` found none):
    the method is `nn.Module`'s, never a project function."""
    kind = facts.kind_of(func.value)
    return (
        kind is not None
        and kind.kind == "model"
        and not kind.by_name
        and isinstance(kind.node, ast.Call)
        and facts.constructs_module(kind.node)
    )


def imports_project_names(facts: Facts) -> bool:
    """True when `facts` imports a name (`from models import Net`) that is not from a known
    library, so resolving it through a workspace might find more."""
    return any(
        facts.imports[name].split(".")[0] not in LIBRARY_ROOTS for name in facts.import_positions
    )
