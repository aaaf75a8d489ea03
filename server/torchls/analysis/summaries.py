"""Per-function summaries: what a helper does, computed once per body, asked at call sites.

Why: real training code hides the interesting calls in helpers (`save_on_master(obj, path)`,
`utils.save_checkpoint(state, ...)`, `train_one_epoch(...)` in `engine.py`,
`backend.distribute(loader)`). Rules used to re-walk those bodies from every call site, and
only inside the same file. A summary says, in terms of the function's own parameters, what
a call of it does, so a rule reads it at the call site and binds the parameters to the
arguments there (`Facts.call_summary`).

In: the `Facts` of the file defining a function and its node. Out: a `Summary` holding only
names and flags (no syntax nodes), so it can be cached by the function's text:

- `returns`: parameters returned as they are (or through receiver-returning methods): the
  function is a wrapper that returns its argument;
- `saves`: parameters passed as the object of `torch.save` (a save wrapper), `saves_values`:
  parameters stored as a value of the dict that `torch.save` writes;
- `saves_states`: parameters whose `state_dict()` the function itself stores in the dict
  literal it passes to `torch.save` (`{"model": model.state_dict(), "epoch": epoch}`), and
  `saves_closed`: every such dict is a literal (no `**` spread, no later `d[k] = ...`
  store, no `state_dict()` of anything but a parameter): what the checkpoint holds is known
  from the helper and the arguments bound to its parameters (`saves_values` among them);
- `steps_optimizer`, `zeroes_grad`, `backwards`: it (or what it calls) steps an optimizer,
  clears gradients, runs `backward()`;
- `runs_batch_loop`: it runs a training loop over a data loader;
- `collective`: it reaches a `torch.distributed` collective on every rank it runs on (not
  only under a rank check inside it, and not on a sub-group);
- `returns_graph`: it returns a tensor still attached to the autograd graph it backwards
  through (a `train_step` returning `loss` rather than `loss.item()`);
- `leaves_eval`: parameters it puts in eval mode on every run (`model.eval()` outside any
  branch, loop or `try`, itself or in what it calls) and never switches back to training
  (an `evaluate(model, loader)` helper in another module);
- `wraps_ddp`: it builds `DistributedDataParallel` (itself or in what it calls) under no
  condition but `if <param>:` tests, whose parameters are `ddp_switches` (none: always):
  a call setting one of them to a true constant (`prepare(model, distributed=True)`) puts
  the run in data-parallel mode for sure.

Callees are followed (in the same file, and through the project index into other files) up to
`MAX_DEPTH` calls deep, cycles cut. Caching: a summary is memoised per (file facts, function)
for the life of that file version, and summaries of functions that call no other project
function are kept in a process-wide table keyed by the function's text and its file's
imports, so re-analysing an edited file does not re-walk unchanged helpers.
"""

from __future__ import annotations

import ast
import threading
from typing import TYPE_CHECKING

from torchls.analysis.hashing import content_digest
from torchls.analysis.queries.tensors import detached_value
from torchls.records import record

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts, FunctionNode

MAX_DEPTH = 4
_TEXT_CACHE_LIMIT = 4096
_text_cache: dict[str, Summary] = {}
_text_lock = threading.Lock()
_SAVE = ("torch.save",)
# What, around a call, makes it run on some passes only (or in another function).
_CONDITIONAL_OR_NESTED = (
    ast.IfExp,
    ast.While,
    ast.Try,
    ast.BoolOp,
    ast.comprehension,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
)


@record(frozen=True)
class Summary:
    """What calling a function does, in terms of its parameters (see the module docstring)."""

    params: tuple[str, ...]
    vararg: str | None = None
    kwarg: str | None = None
    returns: frozenset[str] = frozenset()
    saves: frozenset[str] = frozenset()
    saves_values: frozenset[str] = frozenset()
    saves_states: frozenset[str] = frozenset()
    saves_closed: bool = False
    steps_optimizer: bool = False
    zeroes_grad: bool = False
    backwards: bool = False
    runs_batch_loop: bool = False
    collective: bool = False
    # Parameters that switch every reached collective on (`if use_barrier: dist.barrier()`),
    # with those whose default is falsy: a call leaving them at that default reaches none.
    collective_switches: frozenset[str] = frozenset()
    falsy_defaults: frozenset[str] = frozenset()
    returns_graph: bool = False
    wraps_ddp: bool = False
    ddp_switches: frozenset[str] = frozenset()
    leaves_eval: frozenset[str] = frozenset()

    def wraps_ddp_at(self, call: ast.Call, method: bool = False) -> bool:
        """Calling it as `call` surely builds `DistributedDataParallel`: it always does, or
        the call sets one of its switches to a true constant."""
        if not self.wraps_ddp:
            return False
        if not self.ddp_switches:
            return True
        bound = self.bind(call, method)
        return any(
            isinstance(bound.get(name), ast.Constant) and bool(bound[name].value)  # type: ignore[attr-defined]
            for name in self.ddp_switches
        )

    def reaches_collective(self, call: ast.Call, method: bool = False) -> bool:
        """Whether calling it as `call` reaches a collective: not when every collective is
        switched on by a parameter that this call leaves at a falsy default or sets to a
        falsy constant (`get_merged_lora_ckpt(sd, rank=r)` with `use_barriers=False`)."""
        if not self.collective:
            return False
        if not self.collective_switches:
            return True
        bound = self.bind(call, method)
        for name in self.collective_switches:
            value = bound.get(name)
            if value is None and name not in self.falsy_defaults:
                return True
            if value is not None and not (isinstance(value, ast.Constant) and not value.value):
                return True
        return False

    def bind(self, call: ast.Call, method: bool) -> dict[str, ast.expr]:
        """Parameter name → argument expression at `call` (`method`: the callee's first
        parameter is the receiver, bound by attribute access). Star-args forwarded by the
        callee (`def save_on_master(*args, **kwargs): torch.save(*args, **kwargs)`) bind the
        vararg name to the first extra positional argument, the object being saved."""
        params = self.params[1:] if method and self.params else self.params
        bound: dict[str, ast.expr] = {}
        positional = [a for a in call.args if not isinstance(a, ast.Starred)]
        if len(positional) != len(call.args):
            return bound  # `f(*xs)`: positions are unknown
        for name, argument in zip(params, positional, strict=False):
            bound[name] = argument
        if self.vararg is not None and len(positional) > len(params):
            bound[self.vararg] = positional[len(params)]
        for keyword in call.keywords:
            if keyword.arg is not None and keyword.arg in params:
                bound[keyword.arg] = keyword.value
            elif keyword.arg == "obj" and self.kwarg is not None:
                bound[self.kwarg] = keyword.value  # `save_on_master(obj=state, f=path)`
        return bound


def _text_key(facts: Facts, function: FunctionNode) -> str:
    # What a body means depends on its text, on the names the file binds at module level
    # (imports, classes, globals such as `optimizer = ...`) and on what those imports can be
    # followed into: the same helper summarised without a project (an in-file check) cannot
    # see the project function it calls, so it must not answer for a cross-file check.
    text = facts.source.segment(function)
    globals_ = sorted(facts.assignments.get(facts.tree, {}))
    imports = repr(
        (
            sorted(facts.imports.items()),
            sorted(facts.classes),
            globals_,
            _resolution_context(facts),
        )
    )
    return content_digest(f"{imports}\n{text}".encode(errors="replace"))


def _resolution_context(facts: Facts) -> tuple[str, str]:
    """How far names of `facts` can be followed: no project, a project answered only from
    what it already knows (the editor's fast pass), or a whole project, with its root."""
    workspace = facts.workspace
    if workspace is None:
        return ("none", "")
    view = getattr(workspace, "workspace", None)
    project = view if view is not None else workspace
    root = getattr(project, "root", None)
    # A check's view answers as the workspace does: the modules it follows into (built on
    # the workspace itself) and the checked files then share one summary per function.
    partial = view is not None and not getattr(workspace, "complete", False)
    return ("view" if partial else "project", str(root))


def forget_summaries() -> None:
    """Drop every summary cached by function text (see `analysis.forget_caches`)."""
    with _text_lock:
        _text_cache.clear()


def summary_of(facts: Facts, function: FunctionNode, depth: int = 0) -> Summary:
    """The summary of `function` (defined in the file of `facts`), memoised."""
    memo = facts._summaries
    found = memo.get(function)
    if found is not None:
        return found
    memo[function] = _placeholder(function)  # cuts recursion through cycles
    key = _text_key(facts, function)
    with _text_lock:
        cached = _text_cache.get(key)
    if cached is not None:
        memo[function] = cached
        return cached
    summary, leaf = _Summarizer(facts, function, depth).run()
    memo[function] = summary
    if leaf:
        with _text_lock:
            if len(_text_cache) >= _TEXT_CACHE_LIMIT:
                _text_cache.clear()
            _text_cache[key] = summary
    return summary


def _placeholder(function: FunctionNode) -> Summary:
    args = function.args
    return Summary(tuple(a.arg for a in [*args.posonlyargs, *args.args]))


class _Summarizer:
    def __init__(self, facts: Facts, function: FunctionNode, depth: int) -> None:
        self.facts = facts
        self.function = function
        self.depth = depth
        args = function.args
        self.params = tuple(a.arg for a in [*args.posonlyargs, *args.args])
        self.all_params = {
            *self.params,
            *(a.arg for a in args.kwonlyargs),
            *((args.vararg.arg,) if args.vararg else ()),
            *((args.kwarg.arg,) if args.kwarg else ()),
        }
        self.vararg = args.vararg.arg if args.vararg else None
        self.kwarg = args.kwarg.arg if args.kwarg else None
        self.leaf = True

    def param_of(self, expr: ast.AST | None) -> str | None:
        """The parameter `expr` still holds (through receiver-returning calls), if any."""
        facts = self.facts
        steps = 0
        while isinstance(expr, ast.Call) and facts.returns_receiver(expr) and steps < 8:
            expr = facts.receiver(expr)
            steps += 1
        if isinstance(expr, ast.Starred):
            expr = expr.value
        if not isinstance(expr, ast.Name) or expr.id not in self.all_params:
            return None
        assignment = facts.reaching_assignment(expr)
        if assignment is None or assignment.stmt is self.function:
            return expr.id
        return None

    def dict_params(self, expr: ast.AST) -> set[str]:
        """Parameters stored as values of the dict `expr` builds (a display, `dict(...)`, a
        local name bound to one plus `d[k] = param` stores)."""
        facts = self.facts
        found: set[str] = set()
        literal = facts.binding_value(expr) if isinstance(expr, ast.Name) else expr
        values: list[ast.expr] = []
        if isinstance(literal, ast.Dict):
            values.extend(v for v in literal.values if v is not None)
        elif isinstance(literal, ast.Call) and isinstance(literal.func, ast.Name):
            if literal.func.id == "dict":
                values.extend(k.value for k in literal.keywords)
        if isinstance(expr, ast.Name):
            for node in facts.walk_local(self.function):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Subscript)
                    and isinstance(node.targets[0].value, ast.Name)
                    and node.targets[0].value.id == expr.id
                ):
                    values.append(node.value)
        for value in values:
            name = self.param_of(value)
            if name is not None:
                found.add(name)
        return found

    def dict_states(self, expr: ast.AST) -> tuple[set[str], bool]:
        """(parameters whose `state_dict()` is a value of the dict literal `expr` is, whether
        that literal is closed: see `saves_states` and `saves_closed` in the docstring)."""
        facts = self.facts
        literal = facts.binding_value(expr) if isinstance(expr, ast.Name) else expr
        if not isinstance(literal, ast.Dict) or any(k is None for k in literal.keys):
            return set(), False
        if isinstance(expr, ast.Name) and any(
            isinstance(node, (ast.Assign, ast.AugAssign))
            and any(
                isinstance(t, ast.Subscript)
                and isinstance(t.value, ast.Name)
                and t.value.id == expr.id
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
            for node in facts.walk_local(self.function)
        ):
            return set(), False  # `ckpt["optimizer"] = ...` stores more than the literal
        states: set[str] = set()
        closed = True
        for value in literal.values:
            # A local name stands for what it is bound to (`"optimizer": opt_state`).
            hops = 0
            while isinstance(value, ast.Name) and self.param_of(value) is None and hops < 3:
                bound = facts.binding_value(value)
                if bound is None:
                    break
                value, hops = bound, hops + 1
            arms = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
            for arm in arms:
                for node in ast.walk(arm):
                    if isinstance(node, ast.Call) and facts.method_name(node) == "state_dict":
                        name = self._state_param(facts.receiver(node))
                        if name is None:
                            closed = False
                        else:
                            states.add(name)
        return states, closed

    def _state_param(self, expr: ast.AST | None) -> str | None:
        """The parameter whose state `expr.state_dict()` reads: `model`, `model.module`, or
        `model` after `model = model.module` (a DDP wrapper unwrapped in place)."""
        while isinstance(expr, ast.Attribute) and expr.attr == "module":
            expr = expr.value
        name = self.param_of(expr)
        if name is not None or not isinstance(expr, ast.Name):
            return name
        assignment = self.facts.reaching_assignment(expr)
        value = assignment.value if assignment is not None else None
        if (
            isinstance(value, ast.Attribute)
            and value.attr == "module"
            and isinstance(value.value, ast.Name)
            and value.value.id == expr.id
            and expr.id in self.all_params
        ):
            return expr.id
        return None

    def run(self) -> tuple[Summary, bool]:
        facts = self.facts
        function = self.function
        returns: set[str] = set()
        saves: set[str] = set()
        saves_values: set[str] = set()
        saves_states: set[str] = set()
        direct_saves = 0
        saves_closed = True
        steps = zeroes = backwards = collective = returns_graph = False
        switches: set[str] = set()
        unswitched = False
        backwarded: set[str] = set()
        ddp_always = False
        ddp_switches: set[str] = set()
        evals: set[str] = set()
        trains: set[str] = set()
        from torchls.analysis.ranks import COLLECTIVE_QUALNAMES

        for call in facts.calls_in(function):
            switched = self._mode_switch(call)
            if switched is not None:
                (evals if switched[1] else trains).add(switched[0])
            qualname = facts.call_qualname(call) or ""
            if qualname in _SAVE and call.args:
                name = self.param_of(call.args[0])
                if name is not None:
                    saves.add(name)
                saves_values |= self.dict_params(call.args[0])
                states, closed = self.dict_states(call.args[0])
                saves_states |= states
                saves_closed &= closed
                direct_saves += 1
                continue
            if qualname.startswith("torch.nn.parallel") and qualname.endswith(
                "DistributedDataParallel"
            ):
                switch = self._plain_switch(call)
                ddp_always |= switch == ""
                if switch:
                    ddp_switches.add(switch)
            if facts.is_backward(call):
                backwards = True
                receiver = facts.backward_subject(call)
                if isinstance(receiver, ast.Name):
                    backwarded.add(receiver.id)
            if facts.optimizer_of_step(call) is not None:
                steps = True
            if facts.is_zero_grad(call):
                zeroes = True
            if qualname in COLLECTIVE_QUALNAMES and not self._rank_only(call):
                # A collective on a sub-group (or with arguments we cannot read) is meant
                # for some ranks only.
                grouped = any(k.arg in ("group", None) for k in call.keywords) or any(
                    isinstance(a, ast.Starred) for a in call.args
                )
                if not grouped:
                    collective = True
                    switch = self._switch_of(call)
                    if switch is None:
                        unswitched = True
                    else:
                        switches.add(switch)
            if self.depth >= MAX_DEPTH:
                # Callees are not followed this deep: the summary is cut short here, and
                # the same body asked at a shallower depth must not get this answer.
                self.leaf = False
                continue
            target = facts.callee(call)
            if target is None:
                continue
            owner, callee, is_method = target
            if owner is not facts:
                self.leaf = False
            elif callee is function:
                continue
            else:
                self.leaf = False
            inner = summary_of(owner, callee, self.depth + 1)
            steps |= inner.steps_optimizer
            zeroes |= inner.zeroes_grad
            backwards |= inner.backwards
            if inner.leaves_eval and self._unconditional(call):
                bound = inner.bind(call, is_method)
                for name in inner.leaves_eval:
                    param = self.param_of(bound.get(name))
                    if param is not None:
                        evals.add(param)
            if inner.wraps_ddp:
                switch = self._plain_switch(call)
                if switch is not None:
                    for name in self._ddp_switches_of(inner, call, is_method, switch):
                        ddp_always |= name == ""
                        if name:
                            ddp_switches.add(name)
            reached = inner.reaches_collective(call, is_method)
            if reached and not self._rank_only(call):
                collective = unswitched = True
            if inner.saves or inner.saves_values:
                bound = inner.bind(call, is_method)
                for name in inner.saves:
                    argument = bound.get(name)
                    if argument is None:
                        continue
                    param = self.param_of(argument)
                    if param is not None:
                        saves.add(param)
                    saves_values |= self.dict_params(argument)
                for name in inner.saves_values:
                    param = self.param_of(bound.get(name))
                    if param is not None:
                        saves_values.add(param)
        for node in facts.walk_local(function):
            if isinstance(node, ast.Return) and node.value is not None:
                name = self.param_of(node.value)
                if name is not None:
                    returns.add(name)
                if isinstance(node.value, ast.Name) and node.value.id in backwarded:
                    # Not when the name was rebound to a number first (`loss = loss.item()`).
                    binding = facts.reaching_assignment(node.value)
                    if binding is None or not detached_value(binding.value):
                        returns_graph = True
        runs_batch_loop = any(
            loop in facts.batch_loops and facts.is_inside(loop, function)
            for loop in facts.training_loops
        )
        summary = Summary(
            params=self.params,
            vararg=self.vararg,
            kwarg=self.kwarg,
            returns=frozenset(returns),
            saves=frozenset(saves),
            saves_values=frozenset(saves_values),
            saves_states=frozenset(saves_states),
            saves_closed=bool(direct_saves) and saves_closed,
            steps_optimizer=steps,
            zeroes_grad=zeroes,
            backwards=backwards,
            runs_batch_loop=runs_batch_loop,
            collective=collective,
            returns_graph=returns_graph,
            collective_switches=frozenset() if unswitched else frozenset(switches),
            falsy_defaults=self._falsy_defaults(),
            wraps_ddp=ddp_always or bool(ddp_switches),
            ddp_switches=frozenset() if ddp_always else frozenset(ddp_switches),
            leaves_eval=frozenset(evals - trains),
        )
        return summary, self.leaf

    def _mode_switch(self, call: ast.Call) -> tuple[str, bool] | None:
        """(parameter, True for eval) for `param.eval()` run on every pass, or for any
        `param.train(...)` (which may switch it back); None for other calls."""
        func = call.func
        if not isinstance(func, ast.Attribute) or func.attr not in ("eval", "train"):
            return None
        param = self.param_of(func.value)
        if param is None:
            return None
        if func.attr == "train":
            return param, False
        if call.args or call.keywords or not self._unconditional(call):
            return None
        return param, True

    def _unconditional(self, node: ast.AST) -> bool:
        """`node` runs whenever the function does: under no `if`, loop, `try` or nested
        function (a `with` block is fine)."""
        current = self.facts.parents.get(node)
        while current is not None and current is not self.function:
            if isinstance(current, (*_CONDITIONAL_OR_NESTED, ast.If, ast.For, ast.AsyncFor)):
                return False
            current = self.facts.parents.get(current)
        return True

    def _switch_of(self, call: ast.Call) -> str | None:
        """The parameter of a plain `if param:` around `call` in this function, if any."""
        current = self.facts.parents.get(call)
        while current is not None and current is not self.function:
            if isinstance(current, ast.If) and isinstance(current.test, ast.Name):
                if current.test.id in self.all_params and self.param_of(current.test):
                    return current.test.id
            current = self.facts.parents.get(current)
        return None

    def _plain_switch(self, call: ast.Call) -> str | None:
        """ "" when `call` runs on every pass through this function (no `if`, `while`,
        conditional expression, `try` or `with` around it), the parameter when its only
        condition is one plain `if <param>:`, None otherwise."""
        switch = ""
        child: ast.AST = call
        current = self.facts.parents.get(call)
        while current is not None and current is not self.function:
            if isinstance(current, ast.If):
                test = current.test
                in_body = any(item is child for item in current.body)
                if switch or not in_body or not isinstance(test, ast.Name):
                    return None
                if test.id not in self.all_params or self.param_of(test) is None:
                    return None
                switch = test.id
            elif isinstance(current, _CONDITIONAL_OR_NESTED):
                return None
            child, current = current, self.facts.parents.get(current)
        return switch

    def _ddp_switches_of(
        self, inner: Summary, call: ast.Call, method: bool, switch: str
    ) -> list[str]:
        """How `call` of a callee that wraps in DDP sets its switches, in this function's
        terms: "" when surely (always, or a switch set to a true constant), a parameter of
        this function passed on as a switch; `switch` is the call's own condition."""
        if not inner.ddp_switches:
            return [switch]
        bound = inner.bind(call, method)
        found: list[str] = []
        for name in inner.ddp_switches:
            value = bound.get(name)
            if isinstance(value, ast.Constant) and value.value:
                found.append(switch)
            elif isinstance(value, ast.Name) and not switch and self.param_of(value) == value.id:
                found.append(value.id)
        return found

    def _falsy_defaults(self) -> frozenset[str]:
        args = self.function.args
        positional = [*args.posonlyargs, *args.args]
        with_defaults = positional[len(positional) - len(args.defaults) :]
        pairs = list(zip(with_defaults, args.defaults, strict=True))
        pairs += [
            (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
        ]
        return frozenset(a.arg for a, d in pairs if isinstance(d, ast.Constant) and not d.value)

    def _rank_only(self, call: ast.Call) -> bool:
        """`call` sits under a rank check inside this function (`if rank == 0:`)."""
        facts = self.facts
        current = facts.parents.get(call)
        while current is not None and current is not self.function:
            if isinstance(current, ast.If) and facts.rank_dependent(current.test):
                return True
            current = facts.parents.get(current)
        return False
