"""Train/eval mode of every model at every call: a small abstract interpretation.

In: `Facts`. Out: for each call of a model-like receiver (`model(x)`, `self.net(x)`), the set
of modes the receiver may be in there. A mode fact remembers which `.train()`/`.eval()` call set
it and whether it reached this point around a loop's back edge (set late in one iteration, seen
early in the next) — that is exactly the "eval inside the epoch loop, train only before it" bug.

Functions are analysed with their entry state taken from their in-file call sites (arguments
mapped to parameters), and a call to an in-file helper applies that helper's effect on the modes.
"""

from __future__ import annotations

import ast
from collections.abc import Container
from typing import TYPE_CHECKING, NamedTuple, cast

from torchls.analysis.facts import EVAL_FUNCTION_RE
from torchls.analysis.objects import ClassRef, ObjectModel
from torchls.analysis.queries.flow import guard_holds, guard_of
from torchls.analysis.queries.vocabulary import MODULE_API, _child_statements
from torchls.records import field, record

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts, FunctionNode


@record(frozen=True)
class ModeFact:
    """One mode a model may be in at a point, and the call that put it there."""

    # "train", "eval", "unknown", or "default": a parameter of a function nobody in this file
    # calls, whose mode nothing in sight changed (a module is built in training mode, so on
    # such a path it is in train mode unless someone calls eval()).
    mode: str
    setter: ast.AST | None  # the call that set it (None for unknown)
    back_edge: bool = False


State = dict[str, frozenset[ModeFact]]
UNKNOWN = frozenset({ModeFact("unknown", None)})
DEFAULT = frozenset({ModeFact("default", None)})
MAX_EXACT_LOOP_DEPTH = 4
# Rounds of re-analysing functions with their callers' entry states (see `ModeAnalysis.run`).
MAX_ENTRY_ROUNDS = 3


def _union(first: State, second: State) -> State:
    merged = dict(first)
    for key, facts in second.items():
        merged[key] = merged.get(key, UNKNOWN) | facts if key in merged else facts | UNKNOWN
    for key in first:
        if key not in second:
            merged[key] = first[key] | UNKNOWN
    return merged


def _merged(by_caller: dict[ast.AST, State] | None) -> State:
    """One entry state from the states each caller hands a function (their union)."""
    merged: State | None = None
    for state in (by_caller or {}).values():
        merged = state if merged is None else _union(merged, state)
    return merged or {}


def _mark_back_edge(state: State) -> State:
    return {
        key: frozenset(ModeFact(f.mode, f.setter, True) for f in facts)
        for key, facts in state.items()
    }


class CallInfo(NamedTuple):
    method: str | None
    receiver_key: str | None
    called_key: str | None
    is_model: bool
    function: FunctionNode | None


@record
class ModeAnalysis:
    """The train/eval modes of one file: at each model call, at each call handing a model on, and
    at each statement's entry."""

    facts: Facts
    # model-call node -> modes its receiver may be in; `None` key order is irrelevant.
    at_call: dict[ast.Call, frozenset[ModeFact]] = field(default_factory=dict)
    # call handing a tracked object to a function (`loss_fn(model, x)`) -> that argument's
    # key -> the modes it may be in there.
    at_site: dict[ast.Call, dict[str, frozenset[ModeFact]]] = field(default_factory=dict)
    entry: dict[ast.AST, State] = field(default_factory=dict)
    _effects: dict[object, State] = field(default_factory=dict)
    _effect_stack: set[ast.AST] = field(default_factory=set)
    # The helper being interpreted for a call site, with the constants that site binds to
    # its parameters (`set_mode(train=False)`): its `if train:` takes one branch only.
    _constants: list[tuple[FunctionNode, dict[str, object]]] = field(default_factory=list)
    # callee -> calling function (or the module) -> the callee's entry state from its sites.
    _pending_entries: dict[ast.AST, dict[ast.AST, State]] = field(default_factory=dict)
    _calls: dict[ast.Call, CallInfo] = field(default_factory=dict)
    _relevant: dict[ast.AST, list[ast.Call]] = field(default_factory=dict)
    _relevance: dict[ast.Call, bool] = field(default_factory=dict)
    _possible_keys: set[str] = field(default_factory=set)
    # Receivers of train()/eval() calls: a call handing one over is recorded in `at_site`.
    _switched_keys: set[str] = field(default_factory=set)
    # Calls relevant only because they hand such a receiver over: nothing else is asked.
    _passing_only: set[ast.Call] = field(default_factory=set)
    _loop_depth: int = 0
    # Loop targets standing for several objects while their loop body is interpreted:
    # `for net in (encoder, decoder): net.eval()` switches both.
    _aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Statements with a relevant call somewhere inside (their own function only); None until
    # the first question, then filled by one pass over the file's calls.
    _live: set[ast.AST] | None = None
    # The module and the functions `run` interprets: calls elsewhere are never asked about.
    _interpreted: set[ast.AST] = field(default_factory=set)
    # Call sites that run a helper's loop as evaluation (`run_epoch(..., train=False)`) ->
    # the helper's entry state from that site, in the helper's own names.
    evaluating_entry: dict[ast.Call, State] = field(default_factory=dict)
    # Every call of an in-file helper -> the helper's entry state from that site, in the
    # helper's own names (`self._forward_pass(x, y)` in a validation loop: the mode
    # `self.model` is in when the helper runs it from there).
    site_entry: dict[ast.Call, State] = field(default_factory=dict)
    # Statements that build a model somewhere inside (a fresh module starts in train mode).
    _builds_model: set[ast.AST] = field(default_factory=set)
    # Whether this file's functions put the models they are given in eval() themselves.
    _helpers_own_modes: bool = False
    # `was_training = model.training` statements (and those around them) -> the model key.
    _saves_mode: dict[ast.AST, str] = field(default_factory=dict)
    _leaves_cache: dict[ast.AST, bool] = field(default_factory=dict)
    # (scope, name) -> (model key, the modes saved in that name).
    _saved: dict[tuple[ast.AST, str], tuple[str, frozenset[ModeFact]]] = field(default_factory=dict)

    def run(self) -> None:
        facts = self.facts
        earlier = _earlier(facts)
        contributions = _contributions(facts)
        matters = _union_matters(contributions)
        if earlier is not None and matters != _union_matters(earlier):
            raise WholeFileNeeded  # the statements outside may now matter, or no longer
        if not matters:
            return
        functions = _relevant_functions(facts)
        self._interpreted = {facts.tree, *functions}
        inputs = _file_inputs(_with_keys(facts, contributions))
        if earlier is not None and inputs != _file_inputs(_keyed(earlier)):
            raise WholeFileNeeded  # the statements outside would be judged differently now
        self._possible_keys, self._switched_keys, self._helpers_own_modes = inputs
        self._builds_model = _statements_building_models(facts)
        self._saves_mode = _statements_saving_modes(facts)
        # Round one analyses everything from an unknown entry and collects call-site states,
        # per calling function; later rounds re-analyse the functions that got an entry
        # state from their callers, until no entry changes (a few rounds at most): a helper
        # two calls down (`train` -> `validate(ctx)` -> `predict(ctx.model, ...)`) gets
        # the state its caller sees once that caller was re-analysed with its own entry.
        contributions_by_caller: dict[ast.AST, dict[ast.AST, State]] = {}
        self._pending_entries = contributions_by_caller
        self._interpret(facts.tree.body, {})
        for function in functions:
            self._interpret(function.body, self._root_entry(function))
        used: dict[ast.AST, State] = {}
        for _ in range(MAX_ENTRY_ROUNDS):
            changed = False
            for function in functions:
                entry = _merged(contributions_by_caller.get(function))
                if not entry or used.get(function) == entry:
                    continue
                used[function] = entry
                changed = True
                for by_caller in contributions_by_caller.values():
                    by_caller.pop(function, None)  # its sites are about to be re-collected
                for call in facts.calls_in(function):
                    self.at_call.pop(call, None)
                    self.at_site.pop(call, None)
                    self.site_entry.pop(call, None)
                self._interpret(function.body, {**self._root_entry(function), **entry})
            if not changed:
                break
        self.entry = used
        self._pending_entries = {}

    def _leaves(self, loop: ast.For | ast.AsyncFor) -> bool:
        found = self._leaves_cache.get(loop)
        if found is None:
            found = self._leaves_cache[loop] = _leaves_early(loop)
        return found

    def _root_entry(self, function: FunctionNode) -> State:
        """Entry modes of a plain function nobody in this file calls: its parameters are in
        the mode their builder left them in, as far as anything in sight knows ("default").
        Methods and nested functions get nothing: their objects come from code out of sight."""
        facts = self.facts
        if not self._helpers_own_modes:
            return {}
        if facts.call_sites(function) or facts.scope(function) is not facts.tree:
            return {}
        if facts.enclosing_class(function) is not None:
            return {}
        if any(_switched_by_caller(other, call) for other, call in _elsewhere(facts, function)):
            return {}  # a caller in another file sets the mode of what it passes
        args = function.args
        params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        entry: State = {}
        for node in facts.scope_nodes.get(function, ()):
            # Only models: a loss or an updater passed in has no mode to be in. The first
            # read of each parameter decides.
            if isinstance(node, ast.Name) and node.id in params:
                params.discard(node.id)
                if facts.is_kind(node, "model"):
                    entry[node.id] = DEFAULT
                if not params:
                    break
        return entry

    # ------------------------------------------------------------------ statements
    def _interpret(self, body: list[ast.stmt], state: State) -> State:
        for stmt in body:
            state = self._statement(stmt, state)
        return state

    def _inert(self, stmt: ast.stmt) -> bool:
        """True when nothing in `stmt` can read or change a mode (no relevant call, no model
        built): most statements, so the interpreter skips them whole, loops included."""
        live = self._live
        if live is None:
            live = self._live = self._live_statements()
        return stmt not in live and stmt not in self._builds_model and stmt not in self._saves_mode

    def _live_statements(self) -> set[ast.AST]:
        """Every statement that holds a relevant call, with the statements around it up to
        its function: one walk up from each statement with calls, not one scan per statement."""
        facts = self.facts
        parents = facts.parents
        interpreted = self._interpreted
        live: set[ast.AST] = set()
        stmt_type, module_type = ast.stmt, ast.Module
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        for statement, calls in facts.calls_by_statement.items():
            chain: list[ast.AST] = []
            node: ast.AST | None = statement
            seen = False  # reached a statement marked already: same function, interpreted
            scope: ast.AST | None = None
            while node is not None:
                if isinstance(node, stmt_type):
                    if node in live:
                        seen = True
                        break
                    chain.append(node)
                    if isinstance(node, functions):
                        scope = node
                        break
                elif type(node) is module_type:
                    scope = node
                    break
                node = parents.get(node)
            if not chain or not (seen or scope in interpreted):
                continue
            if any(self._is_relevant(call) for call in calls):
                live.update(chain)
        return live

    def _statement(self, stmt: ast.stmt, state: State) -> State:
        if self._inert(stmt) or isinstance(
            stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        ):
            return state
        if isinstance(stmt, ast.If):
            state = self._expression(stmt.test, state)
            chosen = self._constant_branch(stmt)
            if chosen is not None:
                return self._interpret(stmt.body if chosen else stmt.orelse, state)
            body = self._interpret(stmt.body, state)
            orelse = self._interpret(stmt.orelse, state)
            if _never_falls_through(stmt.body):
                merged = dict(orelse)  # `if bad: raise ...`: only the other arm goes on
            elif stmt.orelse and _never_falls_through(stmt.orelse):
                merged = dict(body)  # `else: assert False`
            else:
                merged = _union(body, orelse)
            typed = _type_tested_key(self.facts, stmt.test)
            if typed is not None and typed in body:
                # `if isinstance(net, nn.Module): net.train()`: where the test fails, `net`
                # is no module and has no mode, so the mode after the `if` is the body's.
                merged[typed] = body[typed]
            saved = (
                self._saved.get((self.facts.scope(stmt), stmt.test.id))
                if isinstance(stmt.test, ast.Name)
                else None
            )
            if saved is not None and not stmt.orelse:
                key, modes = saved
                if any(f.mode == "train" for f in body.get(key, ())):
                    # `if was_training: model.train()`: the mode saved before is back.
                    merged[key] = modes
            return merged
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            header = stmt.iter if isinstance(stmt, (ast.For, ast.AsyncFor)) else stmt.test
            state = self._expression(header, state)
            self._loop_depth += 1
            aliased = self._loop_alias(stmt)
            if aliased is not None:
                self._aliases[aliased[0]] = aliased[1]
            # A `for` loop over data runs its body at least once in any run that matters; the
            # state before it only survives the loop when the body can leave early.
            try:
                after_first = self._interpret(stmt.body, state)
                runs_once = (
                    after_first != state
                    and isinstance(stmt, (ast.For, ast.AsyncFor))
                    and not self._leaves(stmt)
                )
                if after_first == state:
                    # The body changes no mode, so a second pass would see the same states.
                    exit_state = state
                elif self._loop_depth > MAX_EXACT_LOOP_DEPTH:
                    # Two passes per nesting level is exponential; deep inside, one pass and
                    # a merged exit state are enough (findings there may be missed, not made up).
                    exit_state = after_first if runs_once else _union(state, after_first)
                else:
                    second_entry = _union(state, _mark_back_edge(after_first))
                    after_second = self._interpret(stmt.body, second_entry)
                    exit_state = _union(after_first if runs_once else state, after_second)
            finally:
                self._loop_depth -= 1
                if aliased is not None:
                    self._aliases.pop(aliased[0], None)
            return self._interpret(stmt.orelse, exit_state) if stmt.orelse else exit_state
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                state = self._expression(item.context_expr, state)
            return self._interpret(stmt.body, state)
        if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            after_body = self._interpret(stmt.body, state)
            merged = _union(state, after_body)
            outs = [self._interpret(stmt.orelse, after_body)] if stmt.orelse else [after_body]
            outs += [self._interpret(handler.body, merged) for handler in stmt.handlers]
            result = outs[0]
            for other in outs[1:]:
                result = _union(result, other)
            return self._interpret(stmt.finalbody, result) if stmt.finalbody else result
        if isinstance(stmt, ast.Match):
            state = self._expression(stmt.subject, state)
            results = [self._interpret(case.body, state) for case in stmt.cases]
            result = state
            for other in results:
                result = _union(result, other)
            return result
        state = self._expression(stmt, state)
        saved_key = self._saves_mode.get(stmt)
        if saved_key is not None and isinstance(stmt, ast.Assign):
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                modes = state.get(saved_key) or state.get(
                    _owning_key(saved_key, state) or "", UNKNOWN
                )
                self._saved[(self.facts.scope(stmt), target.id)] = (saved_key, modes)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            bound_key = self.facts.key(stmt.targets[0])
            if bound_key is not None and isinstance(stmt.value, ast.Call):
                state = self._bind(bound_key, stmt.value, state)
        return state

    def _loop_alias(self, stmt: ast.stmt) -> tuple[str, tuple[str, ...]] | None:
        """(target, keys) for `for net in (encoder, decoder):` (a literal list or tuple, or a
        name bound to one) or `for net in models:` over a parameter of the function (the
        parameter's own key, which a call site passing a literal list spreads over its
        elements)."""
        if not isinstance(stmt, (ast.For, ast.AsyncFor)) or not isinstance(stmt.target, ast.Name):
            return None
        facts = self.facts
        source: ast.AST | None = stmt.iter
        if isinstance(source, ast.Name):
            bound = facts.binding_value(source)
            if isinstance(bound, (ast.List, ast.Tuple)):
                source = bound
            elif facts.parameter_of(source) is not None:
                return stmt.target.id, (source.id,)
        if not isinstance(source, (ast.List, ast.Tuple)) or not source.elts:
            return None
        keys = tuple(facts.key(element) for element in source.elts)
        if any(key is None for key in keys):
            return None
        return stmt.target.id, keys  # type: ignore[return-value]

    def _bind(self, key: str, value: ast.Call, state: State) -> State:
        """`key = value`: a module built here starts in training mode (or in the mode a chained
        `.train()`/`.eval()` leaves it in); `net = model.to(device)` is `model` itself, and a
        `copy.deepcopy(model)` starts in `model`'s mode."""
        facts = self.facts
        root = facts.same_object(value)
        if (
            isinstance(root, ast.Call)
            and facts.call_qualname(root) in ("copy.deepcopy", "copy.copy")
            and len(root.args) == 1
        ):
            root = facts.same_object(root.args[0])  # a copy keeps the original's mode
        if not isinstance(root, ast.Call):
            root_key = facts.key(root)
            if root_key is not None and root_key != key and root_key in state:
                return {**state, key: state[root_key]}
            return state
        kind = facts.kind_of(root)
        if kind is None or kind.kind != "model" or not kind.node:
            return state
        mode, setter = ("eval" if built_in_eval_mode(facts, root) else "train"), root
        link: ast.AST | None = value
        while link is not root and isinstance(link, ast.Call):
            method = facts.method_name(link)
            if method in ("train", "eval") and not link.args and not link.keywords:
                mode, setter = method, link
                break
            link = facts.receiver(link)
        if setter is root:
            returned = self._returned_modes(root)
            if returned is not None:
                return {**state, key: returned}
        return {**state, key: frozenset({ModeFact(mode, setter)})}

    def _returned_modes(self, call: ast.Call) -> frozenset[ModeFact] | None:
        """For `net = load_model(...)`, an in-file function that switches the model it hands
        back (`model.eval()` before `return model`): the modes it returns it in, attributed
        to the call. None when its returns name different objects or it leaves the mode as
        the model was built."""
        facts = self.facts
        function = facts.called_function(call)
        if function is None:
            return None
        returns = [n for n in facts.walk_local(function) if isinstance(n, ast.Return)]
        keys = {
            facts.key(facts.same_object(r.value)) if r.value is not None else None for r in returns
        }
        if len(keys) != 1:
            return None
        returned_key = keys.pop()
        if returned_key is None:
            return None
        modes = self._effect(function).get(returned_key)
        if not modes or any(f.mode not in ("train", "eval") for f in modes):
            return None
        return frozenset(ModeFact(f.mode, call) for f in modes)

    # ------------------------------------------------------------------ expressions
    def _expression(self, node: ast.AST, state: State) -> State:
        for call in self._relevant_calls(node):
            state = self._call(call, state)
        return state

    def _relevant_calls(self, node: ast.AST) -> list[ast.Call]:
        """The calls under `node` that can read or change a mode (most calls cannot: `len`,
        `loss.backward`, tensor ops), computed once per node. For a simple statement these
        are the calls the index filed under it."""
        found = self._relevant.get(node)
        if found is None:
            facts = self.facts
            if isinstance(node, ast.Call):
                calls = [node]
            elif isinstance(node, ast.stmt) and not _child_statements(node):
                calls = sorted(
                    facts.calls_by_statement.get(node, ()), key=lambda c: (c.lineno, c.col_offset)
                )
            else:
                calls = facts.calls_in(node)
            found = [call for call in calls if self._is_relevant(call)]
            self._relevant[node] = found
        return found

    def _is_relevant(self, call: ast.Call) -> bool:
        found = self._relevance.get(call)
        if found is None:
            # Cheapest questions first: most calls in a file are answered by the first two,
            # and the kind of the callee (the dearest) is asked only of the rest.
            facts = self.facts
            called_key = run_key(facts, call)
            found = (
                facts.method_name(call) in ("train", "eval")
                or (called_key is not None and called_key in self._possible_keys)
                or (
                    called_key is not None
                    and model_part_key(facts, call, called_key, self._possible_keys) is not None
                )
                or facts.called_function(call) is not None
                or self._is_model_call(call)
            )
            if not found and any(facts.key(a) in self._switched_keys for a in call.args):
                # `loss_fn(model, x)` for a function out of sight: only its site is recorded.
                found = True
                self._passing_only.add(call)
            self._relevance[call] = found
        return found

    def _describe(self, call: ast.Call) -> CallInfo:
        """What the interpreter needs to know about a call, computed once per call (loops and
        the second round visit the same calls again)."""
        info = self._calls.get(call)
        if info is None:
            facts = self.facts
            info = CallInfo(
                facts.method_name(call),
                facts.key(facts.same_object(facts.receiver(call))),
                run_key(facts, call),
                self._is_model_call(call),
                facts.called_function(call),
            )
            self._calls[call] = info
        return info

    def _call(self, call: ast.Call, state: State) -> State:
        if call in self._passing_only:
            self._note_site(call, state)
            return self._foreign_effect(call, state)
        method, receiver_key, called_key, is_model, function = self._describe(call)
        # `model.train(mode=False)` is `model.train(False)`.
        flags = [k.value for k in call.keywords if k.arg == "mode"]
        plain = not call.keywords or (method == "train" and len(call.keywords) == len(flags) == 1)
        if method in ("train", "eval") and receiver_key is not None and plain:
            mode = "train"
            if method == "eval" and not call.args:
                mode = "eval"
            elif method == "eval":
                return state
            elif call.args or flags:
                flag = call.args[0] if call.args else flags[0]
                saved = (
                    self._saved.get((self.facts.scope(call), flag.id))
                    if isinstance(flag, ast.Name)
                    else None
                )
                if saved is not None and saved[0] == receiver_key:
                    return {**state, receiver_key: saved[1]}  # model.train(was_training)
                if not isinstance(flag, ast.Constant) or not isinstance(flag.value, bool):
                    return {**state, receiver_key: UNKNOWN}
                mode = "train" if flag.value else "eval"
            switched = frozenset({ModeFact(mode, call)})
            if receiver_key in self._aliases:
                return {**state, **{key: switched for key in self._aliases[receiver_key]}}
            source = self._alias_source(call)
            if source is not None:
                # `model = ctx.model; model.train()`: one object under two names.
                return {**state, receiver_key: switched, source: switched}
            return {**state, receiver_key: switched}
        if function is not None and _own_helper_method(call, function):
            # `self.train_one_epoch(loader)`: a method of the module's own class, not a
            # submodule it runs; what the method runs is judged inside it.
            called_key = None
            is_model = False
        if called_key is not None and called_key not in state:
            called_key = _owning_key(called_key, state) or called_key
        if (called_key is not None and called_key in state) or is_model:
            key = called_key or ""
            self.at_call[call] = self.at_call.get(call, frozenset()) | state.get(key, UNKNOWN)
        if not is_model:
            self._note_site(call, state)
        if function is not None:
            state = self._apply_helper(call, function, state)
        return state

    def _foreign_effect(self, call: ast.Call, state: State) -> State:
        """What a call of a function in another project file does to the modes of the models
        it is handed: its summary says which parameters it leaves in eval mode
        (`evaluate(model, loader)` in `engine.py` calling `model.eval()`)."""
        facts = self.facts
        found = facts.call_summary(call)
        if found is None or found[2] is facts or not found[0].leaves_eval:
            return state
        summary, bound, _ = found
        updated = dict(state)
        for param in summary.leaves_eval:
            key = facts.key(facts.same_object(bound.get(param)))
            if key is not None and key in self._switched_keys:
                updated[key] = frozenset({ModeFact("eval", call)})
        return updated

    def _alias_source(self, call: ast.Call) -> str | None:
        """For `model.train()` where `model` is a local bound once, in its function, to an
        attribute (`model = ctx.model`): the attribute's key, which names the same module."""
        facts = self.facts
        receiver = facts.receiver(call)
        if not isinstance(receiver, ast.Name):
            return None
        scope = facts.scope(call)
        bindings = facts.assignments_of(receiver.id, scope)
        if len(bindings) != 1 or scope is facts.tree:
            return None
        binding = bindings[0]
        value = binding.value
        if binding.index is not None or binding.loop is not None:
            return None
        if binding.stmt.lineno > call.lineno:
            return None
        if not isinstance(value, ast.Attribute) or not isinstance(binding.stmt, ast.Assign):
            return None
        return facts.key(value)

    def _note_site(self, call: ast.Call, state: State) -> None:
        """Record the modes of the tracked objects `call` hands over as arguments."""
        for argument in call.args:
            key = self.facts.key(argument)
            if key is not None and key in state:
                site = self.at_site.setdefault(call, {})
                site[key] = site.get(key, frozenset()) | state[key]

    def _is_model_call(self, call: ast.Call) -> bool:
        if runs_generation(self.facts, call):
            return True
        module = run_module(call)
        if not isinstance(module, (ast.Name, ast.Attribute)):
            return False
        kind = self.facts.kind_of(module)
        return kind is not None and kind.kind == "model"

    # ------------------------------------------------------------------ helpers
    def _parameter_map(self, call: ast.Call, function: FunctionNode) -> dict[str, str]:
        """Caller key → callee parameter name, for arguments that are simple receivers."""
        params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
        if params and params[0] == "self" and isinstance(call.func, ast.Attribute):
            params = params[1:]
        mapping: dict[str, str] = {}
        for position, argument in enumerate(call.args):
            key = self.facts.key(argument)
            if key is not None and position < len(params):
                mapping[key] = params[position]
        for keyword in call.keywords:
            key = self.facts.key(keyword.value)
            if key is not None and keyword.arg:
                mapping[key] = keyword.arg
        mapping.update(self._held_object_map(call))
        return mapping

    def _held_object_map(self, call: ast.Call) -> dict[str, str]:
        """For `self.hook.after_step()` on an object built here as `self.hook = Hook(self)`:
        the caller's `self.hook` is the method's `self`, and the caller's `self` is what
        `Hook.__init__` stored (`self.trainer = trainer` makes it the method's
        `self.trainer`), so `self.model` there is `self.trainer.model`."""
        facts = self.facts
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)):
            return {}
        built = facts.held_instance(func.value)
        receiver = facts.key(func.value)
        if built is None or receiver is None:
            return {}
        mapping = {receiver: "self"}
        info = facts.classes[cast(ast.Name, built.func).id]  # held_instance: `Name(...)`
        init = info.methods.get("__init__")
        if init is None or facts.enclosing_class(built) is not facts.enclosing_class(call):
            return mapping  # built elsewhere: its `self` arguments mean another object
        params = [a.arg for a in [*init.args.posonlyargs, *init.args.args]][1:]
        passed: dict[str, str] = {}
        for position, argument in enumerate(built.args):
            key = facts.key(argument)
            if key is not None and position < len(params):
                passed[params[position]] = key
        for keyword in built.keywords:
            key = facts.key(keyword.value)
            if key is not None and keyword.arg:
                passed[keyword.arg] = key
        for attribute, values in info.attributes.items():
            if len(values) == 1 and isinstance(values[0], ast.Name) and values[0].id in passed:
                caller_key = passed[values[0].id]
                mapping.setdefault(caller_key, f"self.{attribute}")
        return mapping

    def _apply_helper(self, call: ast.Call, function: FunctionNode, state: State) -> State:
        mapping = self._parameter_map(call, function)
        entry: State = {}
        for key, facts_ in state.items():
            # `validate(ctx)`: the caller's `ctx.model` is the helper's `ctx.model` too.
            param_key = _rebase(key, mapping)
            if param_key is not None:
                entry[param_key] = facts_
        foreign = "self" in mapping.values() and not _same_self(call)
        # The helper's own locals and parameters shadow the caller's names of the same text.
        own = self.facts.assignments.get(function, {})
        for key, facts_ in state.items():
            if foreign and key.startswith("self."):
                continue  # the method's `self` is another object: only the mapping relates them
            if key.startswith("self.") or (
                "." not in key and key not in mapping and key not in own
            ):
                entry.setdefault(key, facts_)
        if not self._effect_stack:  # not while a helper's effect is being worked out
            before_site = self.site_entry.get(call)
            self.site_entry[call] = _union(before_site, entry) if before_site else entry
        if any(site is call for site, _, _ in self.facts.evaluating_sites(function)):
            # `run_epoch(..., train=False)`: this call runs the helper's loop as evaluation;
            # its state is kept apart, so it never counts as the mode training runs in.
            before = self.evaluating_entry.get(call)
            self.evaluating_entry[call] = _union(before, entry) if before else entry
        else:
            caller = self.facts.enclosing_function(call) or self.facts.tree
            by_caller = self._pending_entries.setdefault(function, {})
            pending = by_caller.get(caller)
            by_caller[caller] = _union(pending, entry) if pending is not None else entry
        effect = self._effect(function, _constant_arguments(call, function))
        if not effect:
            return state
        reverse = {param: key for key, param in mapping.items()}
        updated = dict(state)
        # `set_mode("eval", [encoder, decoder])`: what the helper does to each element of
        # its list parameter, it does to each object listed at this call.
        spread = _listed_arguments(self.facts, call, function)
        for callee_key, facts_ in effect.items():
            targets = spread.get(callee_key) or [_rebase(callee_key, reverse) or callee_key]
            # Attribute the change to the call site, so findings point at the helper call.
            changed = frozenset(
                ModeFact(f.mode, call if f.setter is not None else None, False)
                for f in facts_
                if f.mode != "unchanged"
            )
            for caller_key in targets:
                if any(f.mode == "unchanged" for f in facts_):
                    updated[caller_key] = changed | state.get(caller_key, UNKNOWN)
                else:
                    updated[caller_key] = changed
        return updated

    def _effect(self, function: FunctionNode, constants: dict[str, object] | None = None) -> State:
        """Modes a helper leaves behind, for the keys it changes; with `constants`, as a call
        binding those values to its parameters runs it (branches on them taken or not)."""
        cache_key: object = (function, tuple(sorted(constants.items()))) if constants else function
        if cache_key in self._effects:
            return self._effects[cache_key]
        if function in self._effect_stack or len(self._effect_stack) > 4:
            return {}
        if not self.facts.function_reaches(function, _is_mode_call):
            self._effects[cache_key] = {}
            return {}
        self._effect_stack.add(function)
        self._constants.append((function, constants or {}))
        saved_calls = dict(self.at_call)
        saved_sites = {call: dict(site) for call, site in self.at_site.items()}
        saved_pending = self._pending_entries
        self._pending_entries = {}
        sentinel = frozenset({ModeFact("unchanged", None)})
        keys = {
            self.facts.key(self.facts.same_object(self.facts.receiver(call)))
            for call in self.facts.calls_in(function)
            if self.facts.method_name(call) in ("train", "eval")
        }
        start: State = {key: sentinel for key in keys if key}
        end = self._interpret(function.body, dict(start))
        self.at_call = saved_calls
        self.at_site = saved_sites
        self._pending_entries = saved_pending
        self._effect_stack.discard(function)
        self._constants.pop()
        effect = {key: facts_ for key, facts_ in end.items() if facts_ != sentinel}
        self._effects[cache_key] = effect
        return effect

    def _constant_branch(self, stmt: ast.If) -> bool | None:
        """For an `if` on a parameter of the helper being interpreted for a call site that
        binds that parameter to a constant: whether the body runs (None: both may)."""
        if not self._constants:
            return None
        function, constants = self._constants[-1]
        if not constants or self.facts.enclosing_function(stmt) is not function:
            return None
        guard = guard_of(self.facts, function, stmt.test, True)
        if guard is None or guard[0] not in constants:
            return None
        return guard_holds(guard, constants[guard[0]])


# Libraries whose `from_pretrained` hands the model back in eval mode (it calls `eval()`
# before returning): a fresh model from them is not in training mode.
_EVAL_PRETRAINED_LIBRARIES = frozenset({"transformers", "diffusers", "peft"})


def built_in_eval_mode(facts: Facts, call: ast.Call) -> bool:
    """`call` builds a model that starts in eval mode: `AutoModel.from_pretrained(...)` of a
    library that switches what it loads to eval, or a project module class whose `__init__`
    (or a method of its own that it calls) puts the networks it holds in eval itself and
    never in train (a frozen feature extractor: `self.backbone = backbone.eval()`)."""
    if facts.method_name(call) == "from_pretrained":
        root = (facts.call_qualname(call) or "").split(".")[0]
        return root in _EVAL_PRETRAINED_LIBRARIES
    found = facts.module_class_of_call(call)
    if found is None:
        return False
    owner, info = found
    init = info.methods.get("__init__")
    if init is None:
        return False
    calls = list(owner.calls_in(init))
    for call in list(calls):  # and the class's own methods it calls (`self._load_model()`)
        method = owner.called_function(call)
        if method is not None and method is not init and method in info.methods.values():
            calls += owner.calls_in(method)
    switches = [c for c in calls if owner.method_name(c) in ("train", "eval")]
    return bool(switches) and all(
        owner.method_name(c) == "eval" and not c.args and not c.keywords for c in switches
    )


def _constant_arguments(call: ast.Call, function: FunctionNode) -> dict[str, object]:
    """The parameters of `function` that `call` binds to a constant (`set_mode(train=False)`,
    `net_mode(True)`), by name."""
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if params and params[0] == "self" and isinstance(call.func, ast.Attribute):
        params = params[1:]
    bound: dict[str, object] = {}
    for position, argument in enumerate(call.args):
        if isinstance(argument, ast.Starred):
            break
        if isinstance(argument, ast.Constant) and position < len(params):
            bound[params[position]] = argument.value
    for keyword in call.keywords:
        if keyword.arg and isinstance(keyword.value, ast.Constant):
            bound[keyword.arg] = keyword.value.value
    return bound


def _listed_arguments(facts: Facts, call: ast.Call, function: FunctionNode) -> dict[str, list[str]]:
    """Parameter -> the keys of the objects `call` passes for it in a literal list or tuple
    (`[encoder, decoder]`), when every element has one."""
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if params and params[0] == "self" and isinstance(call.func, ast.Attribute):
        params = params[1:]
    positional = zip(params, call.args, strict=False)
    passed = [*positional, *((k.arg, k.value) for k in call.keywords if k.arg)]
    found: dict[str, list[str]] = {}
    for param, argument in passed:
        if isinstance(argument, (ast.List, ast.Tuple)) and argument.elts:
            keys = [facts.key(element) for element in argument.elts]
            if all(keys):
                found[param] = keys  # type: ignore[assignment]
    return found


def run_module(call: ast.Call) -> ast.expr:
    """The module a call runs: `model` for `model(x)` and for `model.forward(x)` (an explicit
    forward runs the module in the mode it is in, like calling it); otherwise the callee."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "forward":
        return func.value
    return func


def run_key(facts: Facts, call: ast.Call) -> str | None:
    """The key of the module `call` runs: `model` for `model.forward(x)` (`run_module`) and
    for `model.generate(x)` of a transformers model (`runs_generation`)."""
    if runs_generation(facts, call):
        return facts.key(call.func.value)  # type: ignore[attr-defined]
    return facts.key(run_module(call))


# Libraries whose models' `generate()` runs the model's forward in whatever mode the model is
# in: it never calls eval() (it only turns gradients off).
_GENERATING_LIBRARIES = frozenset({"transformers", "peft"})


def runs_generation(facts: Facts, call: ast.Call) -> bool:
    """`model.generate(...)` where `model` is a parameter typed as, or a local built by, a
    transformers (or peft) model class: decoding runs the model in the mode it is in (dropout
    stays on in training mode), with gradients off."""
    func = call.func  # read here, not through `method_name`: asked of every call, twice
    if not isinstance(func, ast.Attribute) or func.attr != "generate":
        return False
    receiver = func.value
    if not isinstance(receiver, ast.Name):
        return False
    origin: ast.expr | None = None
    function = facts.parameter_of(receiver)
    if function is not None:
        args = function.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if arg.arg == receiver.id:
                origin = arg.annotation
    else:
        value = facts.binding_value(receiver)
        origin = value.func if isinstance(value, ast.Call) else None
    qualname = (facts.qualname(origin) or "") if origin is not None else ""
    return qualname.split(".")[0] in _GENERATING_LIBRARIES


def _own_helper_method(call: ast.Call, function: FunctionNode) -> bool:
    """`self.<method>(...)` resolving to a method other than `forward`/`__call__` (those
    run the module itself)."""
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
        and func.attr == function.name
        and function.name not in ("forward", "__call__")
    )


def _elsewhere(facts: Facts, function: FunctionNode) -> list[tuple[Facts, ast.Call]]:
    return facts.get(ObjectModel).calls_elsewhere(function)


def _switched_by_caller(other: Facts, call: ast.Call) -> bool:
    """The call `call` in the file `other` hands on an object that file switches to train()
    or eval() itself (`vae = AutoencoderKL(...).eval()`, or `net.eval()` on it)."""
    switched = {
        other.key(other.same_object(other.receiver(c))) for c in other.method_calls("eval", "train")
    }
    for argument in [*call.args, *(k.value for k in call.keywords)]:
        if other.key(argument) in switched:
            return True
        value = other.binding_value(argument)
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            if value.func.attr in ("eval", "train"):
                return True
            value = value.func.value
    return False


def _type_tested_key(facts: Facts, test: ast.expr) -> str | None:
    """`net` for a test `isinstance(net, <a module class>)`, `net is not None` or `net`
    itself (`if self.disc is not None: self.disc.eval()`): where it fails there is no module
    to have a mode."""
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.IsNot)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        return facts.key(test.left)
    if isinstance(test, (ast.Name, ast.Attribute)):
        return facts.key(test)
    if not (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "isinstance"
        and len(test.args) == 2
    ):
        return None
    kind = facts.qualname(test.args[1]) or facts.source.segment(test.args[1]) or ""
    if not kind.endswith("Module"):
        return None
    return facts.key(test.args[0])


def model_part_key(facts: Facts, call: ast.Call, key: str, models: Container[str]) -> str | None:
    """The key of the model in `models` whose direct part `call` (run key `key`) runs, one
    attribute down (`self.gen.encoder(x)`, `self.gen.encode(x)`: `runs_model_part`); None
    otherwise. Deeper chains (`model.frontend.melspec(wave)`) are often parameter-free
    preprocessing, so they are not taken for the model."""
    owner = _owning_key(key, models)
    if owner is None or key.count(".") != owner.count(".") + 1:
        return None
    return owner if runs_model_part(facts, call) else None


def owning_model(facts: Facts, call: ast.Call) -> ast.expr | None:
    """`model` for `model.pi(x)` or `model.encoder(x)`: the model whose part the call runs
    (`runs_model_part`), when the receiver is a model; None for any other call."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr == "forward":
        return None
    kind = facts.kind_of(func.value)
    if kind is None or kind.kind != "model" or not runs_model_part(facts, call):
        return None
    return func.value


def runs_model_part(facts: Facts, call: ast.Call) -> bool:
    """`call`, a method call on a model (`self.gen.encoder(x)`, `self.gen.encode(x)`), runs
    some of that model's parameters in the model's mode: a submodule, or a method of the
    model's class that calls its forward or a submodule of its own (no decorator on it, which
    may turn gradients off); a method of a class out of sight counts when its result is used
    (a dropped result, `net.reset_cache(b)`, is bookkeeping). Not `nn.Module`'s own methods."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr in MODULE_API:
        return False
    if isinstance(facts.parents.get(call), ast.Expr):
        return False
    found = _model_method(facts, call, func)
    if found is None:
        return True  # a submodule, or a method of a class out of sight
    owner, method = found
    return _runs_own_part(owner, method, 0)


def _model_method(
    facts: Facts, call: ast.Call, func: ast.Attribute
) -> tuple[Facts, FunctionNode] | None:
    """The project method `model.m(...)` runs: resolved as any call is, or through the class
    the receiver was built from (`Translator(...).to(device)`), its bases included."""
    target = facts.callee(call)
    if target is not None:
        return target[0], target[1]
    model = facts.get(ObjectModel)
    method = model.object_method(call)
    if method is not None:
        return method
    kind = facts.kind_of(func.value)
    if kind is None or not isinstance(kind.node, ast.Call):
        return None
    builder = model.owner_of(kind.node)
    built = builder.callee(kind.node)
    if built is None:
        info = builder.classes.get(kind.detail or "")
        owner = builder
    else:
        owner = built[0]
        klass = owner.parents.get(built[1])
        info = owner.classes.get(klass.name) if isinstance(klass, ast.ClassDef) else None
    if info is None:
        return None
    return owner.get(ObjectModel).class_method(ClassRef(owner, info), func.attr)


def _runs_own_part(owner: Facts, method: FunctionNode, depth: int) -> bool:
    if depth > 2 or method.decorator_list:
        return False
    klass = owner.enclosing_class(method)
    methods = owner.classes[klass.name].methods if klass and klass.name in owner.classes else {}
    for call in owner.calls_in(method):
        func = call.func
        if isinstance(func, ast.Subscript):
            func = func.value  # `self.heads[name](z)`
        if isinstance(func, ast.Name) and func.id == "self":
            return True
        if not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
        ) or owner.in_no_grad(call):
            continue
        other = methods.get(func.attr)
        if other is None and func.attr not in MODULE_API:
            return True  # `self.encoder(x)`: a submodule
        if other is not None and other is not method and _runs_own_part(owner, other, depth + 1):
            return True
    return False


def _owning_key(key: str, state: Container[str]) -> str | None:
    """The nearest module in `state` that `key` is a submodule of: `model.decoder` runs in
    `model`'s mode unless its own mode was set."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in state:
            return prefix
    return None


# Calls that end the process: a block ending in one never reaches the code after it.
_EXITS = frozenset({"sys.exit", "exit", "quit", "os._exit"})


def _never_falls_through(body: list[ast.stmt]) -> bool:
    """The block ends the run of its function: its last statement is a `raise`, an `assert`
    of a false constant (`else: assert False`), or a call that ends the process
    (`sys.exit(0)` after a search run before training)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, ast.Raise):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        func = last.value.func
        name = func.id if isinstance(func, ast.Name) else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            name = f"{func.value.id}.{func.attr}"
        return name in _EXITS
    return (
        isinstance(last, ast.Assert) and isinstance(last.test, ast.Constant) and not last.test.value
    )


def _leaves_early(loop: ast.For | ast.AsyncFor | ast.While) -> bool:
    """The loop's body has a `break` or `continue` of its own (not of a nested loop)."""
    todo: list[ast.AST] = list(loop.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Break, ast.Continue)):
            return True
        if isinstance(
            node, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)
        ):
            continue  # its break/continue are its own
        if isinstance(node, (ast.ClassDef, ast.Lambda, ast.expr)):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return False


def _same_self(call: ast.Call) -> bool:
    """`self.method()`: the method runs on the caller's own `self`."""
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    )


def _rebase(key: str, mapping: dict[str, str]) -> str | None:
    """`key` under the names of `mapping` (caller key -> callee parameter, or the reverse):
    with `ctx` -> `state`, `ctx.model` becomes `state.model`."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in mapping:
            return ".".join([mapping[prefix], *parts[end:]])
    return None


class WholeFileNeeded(Exception):
    """A reduced analysis (see `incremental.py`) needs what a statement outside it contributes
    to the file-wide mode inputs, and no earlier analysis left it on that statement."""


@record(frozen=True)
class Contribution:
    """What one top-level statement adds to the mode analysis's file-wide inputs: whether it
    can make mode findings matter (a mode switch, an evaluation loop or function), and, once
    asked (None before), the keys a mode state can hold, the receivers of train()/eval(), and
    whether one of its functions puts a model it was given in eval() itself. Kept on the
    statement's node, so an editor's reduced analysis reads those of statements outside it."""

    matters: bool | None  # None: not decided (another statement already made modes matter)
    possible: frozenset[str] | None = None
    switched: frozenset[str] | None = None
    owns: bool | None = None


_CONTRIBUTION_ATTR = "_torchls_modes"


def _top_statement(facts: Facts, node: ast.AST) -> ast.AST | None:
    current: ast.AST | None = node
    while current is not None:
        parent = facts.parents.get(current)
        if parent is facts.tree:
            return current
        current = parent
    return None


def _by_statement(facts: Facts, nodes: list[ast.AST]) -> dict[ast.AST, list[ast.AST]]:
    grouped: dict[ast.AST, list[ast.AST]] = {}
    for node in nodes:
        top = _top_statement(facts, node)
        if top is not None:
            grouped.setdefault(top, []).append(node)
    return grouped


def _contributions(facts: Facts) -> list[Contribution]:
    """The contribution of every top-level statement of the file: computed for those of this
    tree (and kept on their nodes), read from the nodes for those outside it. Whether a
    statement matters is worked out only as far as the file needs: once one statement's
    mode switch makes modes matter, the others are left undecided (None), as the whole-file
    test used to stop at the first switch; the costly test (a helper evaluating on some call
    sites) runs only when nothing cheaper decided."""
    outside = [_outside(stmt) for stmt in facts.outside]
    decided = any(c.matters for c in outside)
    mode_calls = _by_statement(facts, list(facts.method_calls("eval", "train")))
    matters: dict[ast.AST, bool | None] = {
        stmt: True if stmt in mode_calls else None for stmt in facts.tree.body
    }
    if not decided and not mode_calls:
        functions = [
            node
            for node in facts.scope_nodes
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        functions_of = _by_statement(facts, functions)  # type: ignore[arg-type]
        eval_loops = _by_statement(
            facts, [loop for loop, role in facts.batch_loops.items() if role == "eval"]
        )
        for stmt in facts.tree.body:
            own = functions_of.get(stmt, [])
            if stmt in eval_loops or any(EVAL_FUNCTION_RE.match(f.name) for f in own):  # type: ignore[attr-defined]
                matters[stmt] = True
        if not any(matters.values()):
            if any(c.matters is None for c in outside):
                raise WholeFileNeeded
            for stmt in facts.tree.body:
                # `run_epoch(..., train=False)`: a loop that evaluates on some call sites.
                matters[stmt] = any(
                    facts.call_sites(f) and facts.evaluating_sites(f)  # type: ignore[arg-type]
                    for f in functions_of.get(stmt, [])
                )
    found: list[Contribution] = []
    for stmt in facts.tree.body:
        contribution = Contribution(matters[stmt])
        setattr(stmt, _CONTRIBUTION_ATTR, contribution)
        found.append(contribution)
    return [*found, *outside]


def _union_matters(contributions: list[Contribution]) -> bool | None:
    """Whether modes matter in the file: True once one statement says so, None when some
    statement was left undecided and none says so."""
    if any(c.matters for c in contributions):
        return True
    return None if any(c.matters is None for c in contributions) else False


def _earlier(facts: Facts) -> list[Contribution] | None:
    """In a reduced analysis, what the whole file contributed before the edit: the earlier
    contributions of this tree's reused statements and of the statements the edit replaced,
    and those outside. None in a whole analysis. Statements parsed anew have none."""
    if not facts.outside and not facts.replaced:
        return None
    found = [
        _outside(stmt)
        for stmt in facts.tree.body
        if stmt not in facts.fresh  # reused: its node holds the earlier contribution
    ]
    found.extend(_outside(stmt) for stmt in facts.replaced)
    found.extend(_outside(stmt) for stmt in facts.outside)
    return found


def _keyed(contributions: list[Contribution]) -> list[Contribution]:
    if any(c.possible is None for c in contributions):
        raise WholeFileNeeded
    return contributions


def _file_inputs(contributions: list[Contribution]) -> tuple[set[str], set[str], bool]:
    """(keys a mode state can hold, receivers of train()/eval(), helpers own modes)."""
    possible: set[str] = set()
    switched: set[str] = set()
    owns = False
    for contribution in contributions:
        possible |= contribution.possible or frozenset()
        switched |= contribution.switched or frozenset()
        owns = owns or bool(contribution.owns)
    return possible, switched, owns


def _outside(stmt: ast.AST) -> Contribution:
    contribution = getattr(stmt, _CONTRIBUTION_ATTR, None)
    if contribution is None:
        raise WholeFileNeeded
    return contribution


def _with_keys(facts: Facts, contributions: list[Contribution]) -> list[Contribution]:
    """`contributions` (this tree's first, as `_contributions` returns them) with their keys:
    computed for this tree's statements, read for those outside it."""
    receivers: dict[ast.AST, set[str]] = {}
    owning: set[ast.AST] = set()
    for call in facts.method_calls("eval", "train"):
        key = facts.key(facts.same_object(facts.receiver(call)))
        top = _top_statement(facts, call)
        if key is None or top is None:
            continue
        receivers.setdefault(top, set()).add(key)
        # Some function here calls `eval()` on a model it was given as a parameter: in this
        # file the helper that runs a model owns its mode, so one that never sets it is
        # suspect. Where no function does, setting the mode is the callers' job.
        if call.func.attr != "eval" or call.args or call.keywords:  # type: ignore[attr-defined]
            continue
        function = facts.enclosing_function(call)
        if function is None:
            continue
        args = function.args
        if key.split(".")[0] in {a.arg for a in [*args.posonlyargs, *args.args]} - {"self"}:
            owning.add(top)
    # Every key a mode state can hold: receivers of train()/eval(), names bound to a newly
    # built model, and parameter names (states flow into helpers under those names).
    possible: dict[ast.AST, set[str]] = {stmt: set(keys) for stmt, keys in receivers.items()}
    for node in facts.scope_nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            top = _top_statement(facts, node)
            if top is not None:
                args = node.args
                names = (a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
                possible.setdefault(top, set()).update(names)
    for statement, calls in facts.calls_by_statement.items():
        for call in calls:
            assignment = facts.parents.get(call)
            if isinstance(assignment, ast.Assign) and len(assignment.targets) == 1:
                key = facts.key(assignment.targets[0])
                if key is not None and facts.is_kind(assignment.value, "model"):
                    top = _top_statement(facts, statement)
                    if top is not None:
                        possible.setdefault(top, set()).add(key)
    found: list[Contribution] = []
    own = contributions[: len(facts.tree.body)]
    for stmt, contribution in zip(facts.tree.body, own, strict=True):
        contribution = Contribution(
            contribution.matters,
            frozenset(possible.get(stmt, ())),
            frozenset(receivers.get(stmt, ())),
            stmt in owning,
        )
        setattr(stmt, _CONTRIBUTION_ATTR, contribution)
        found.append(contribution)
    for stmt in facts.outside:
        contribution = _outside(stmt)
        if contribution.possible is None:
            raise WholeFileNeeded
        found.append(contribution)
    return found


def _statements_building_models(facts: Facts) -> set[ast.AST]:
    """`model = Net()`-style assignments and every statement around them, up to the function."""
    found: set[ast.AST] = set()
    for statement, calls in facts.calls_by_statement.items():
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
            continue
        if statement.value not in calls or not facts.is_kind(statement.value, "model"):
            continue
        node: ast.AST | None = statement
        while node is not None and not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)
        ):
            if isinstance(node, ast.stmt):
                found.add(node)
            node = facts.parents.get(node)
    return found


def _statements_saving_modes(facts: Facts) -> dict[ast.AST, str]:
    """`was_training = model.training` → `model`, for that statement and every statement
    around it up to its function (so the interpreter does not skip them as inert)."""
    found: dict[ast.AST, str] = {}
    if ".training" not in facts.source.text:
        return found  # most files never read a module's mode
    # Every `name = value` is in the binding tables: far fewer entries than nodes.
    for table in facts.assignments.values():
        for binding in (b for bindings in table.values() for b in bindings):
            node = binding.stmt
            if not (
                type(node) is ast.Assign
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "training"
            ):
                continue
            key = facts.key(node.value.value)
            if key is None:
                continue
            current: ast.AST | None = node
            while current is not None and not isinstance(
                current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)
            ):
                if isinstance(current, ast.stmt):
                    found.setdefault(current, key)
                current = facts.parents.get(current)
    return found


def _relevant_functions(facts: Facts) -> list[FunctionNode]:
    """Functions whose mode states a rule can read: they switch modes, loop (evaluation and
    training loops are loops), or call such a function (their states flow into it)."""
    functions = [
        node
        for node in facts.scope_nodes
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    # A loop's scope is a function or the module (a lambda holds no statement).
    looping = {facts.scope(loop) for loop in facts.loops}
    relevant = {
        function
        for function in functions
        if function in looping or any(_is_mode_call(call) for call in facts.calls_in(function))
    }
    # A helper a loop calls (`output, loss = self._forward_pass(x, y)`) runs its forwards
    # in that loop: the mode they see there is the loop's.
    # And the helpers such a helper calls in turn, two levels down (`self.total_loss(b)` ->
    # `self.part_loss(b)`, whose forward runs in the loop's mode too).
    callers: list[ast.AST] = list(facts.loops)
    for _ in range(3):
        called_here: set[FunctionNode] = set()
        for caller in callers:
            for call in facts.calls_in(caller):
                called = facts.called_function(call)
                if called is not None and called not in relevant:
                    called_here.add(called)
        relevant |= called_here
        callers = list(called_here)
    # So does a helper that a mode-switching function calls (`self.module_.eval()`, then
    # `self.infer(x)`): it runs its forwards in the mode just set.
    for function in functions:
        if any(_is_mode_call(call) for call in facts.calls_in(function)):
            for call in facts.calls_in(function):
                called = facts.called_function(call)
                if called is not None:
                    relevant.add(called)
    changed = True
    while changed:
        changed = False
        for function in functions:
            if function in relevant:
                continue
            if any(facts.called_function(call) in relevant for call in facts.calls_in(function)):
                relevant.add(function)
                changed = True
    return [function for function in functions if function in relevant]


def _is_mode_call(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr in ("train", "eval")


def analyse_modes(facts: Facts) -> ModeAnalysis:
    analysis = ModeAnalysis(facts)
    analysis.run()
    return analysis
