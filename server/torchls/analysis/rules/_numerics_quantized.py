"""TL501's case of a model that loading itself puts on the GPU, fed a tokenizer's CPU tensors.

Why: a checkpoint loaded with bitsandbytes quantization (`from_pretrained(...,
quantization_config=BitsAndBytesConfig(load_in_4bit=True))`, or `load_in_8bit=True`) and no
`device_map` is placed on the current CUDA device by the loader: there is no `.to(device)`
call for the loader-batch check to see. A tokenizer called with `return_tensors="pt"` returns
CPU tensors, and a wrapper class typically loads the model in `__init__` and tokenizes in
another method (`self.model.generate(input_ids)`), so the two meet only through `self`.

In: the file's `Facts`. Out: (argument, model key, the loading call) for each tokenizer
output passed unmoved to such a model: positionally, by keyword, or as `**encoding`.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts
from torchls.analysis.registry import exemption

# Methods of a Hugging Face model that run it on their tensor arguments.
RUNNING_METHODS = {"generate", "forward"}


def _true_keyword(call: ast.Call, names: tuple[str, ...]) -> bool:
    return any(
        k.arg in names and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in call.keywords
    )


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


@exemption("TL501", "neg_quantized_model_with_device_map.py")
def _placed_by_device_map(call: ast.Call) -> bool:
    """The quantized load passes a `device_map` (or `**options` that may hold one): it may
    place the model anywhere and its dispatch hooks move the inputs to each layer's device."""
    return any(k.arg is None or k.arg == "device_map" for k in call.keywords)


def loads_onto_gpu(facts: Facts, call: ast.expr) -> bool:
    """`X.from_pretrained(...)` quantized to 4 or 8 bits by bitsandbytes with no
    `device_map`: the loader puts the whole model on the current CUDA device."""
    if not isinstance(call, ast.Call) or facts.method_name(call) != "from_pretrained":
        return False
    if _placed_by_device_map(call):
        return False
    flags = ("load_in_4bit", "load_in_8bit")
    if _true_keyword(call, flags):
        return True
    config = _keyword(call, "quantization_config")
    if isinstance(config, ast.Name):
        config = facts.binding_value(config)
    return (
        isinstance(config, ast.Call)
        and facts.short_name(config) == "BitsAndBytesConfig"
        and _true_keyword(config, flags)
    )


def _quantized_models(facts: Facts) -> dict[str, ast.Call]:
    """`self.<attr>` keys whose every assignment in their class loads onto the GPU (and
    plain names bound once to such a load) → the loading call."""
    found: dict[str, ast.Call] = {}
    for call in facts.method_calls("from_pretrained"):
        if not loads_onto_gpu(facts, call):
            continue
        parent = facts.parents.get(call)
        if not isinstance(parent, ast.Assign) or len(parent.targets) != 1:
            continue
        target = parent.targets[0]
        key = facts.key(target)
        if key is None:
            continue
        if isinstance(target, ast.Attribute):
            values = facts.self_attribute_values(target)
            if not values or not all(loads_onto_gpu(facts, v) for v in values):
                continue
        found.setdefault(key, call)
    return found


def _host_encoding(facts: Facts, expr: ast.expr) -> bool:
    """`tok(text, return_tensors="pt")`, or its `.input_ids` / `["input_ids"]`: CPU tensors."""
    if isinstance(expr, (ast.Attribute, ast.Subscript)):
        expr = expr.value
    if not isinstance(expr, ast.Call):
        return False
    tensors = _keyword(expr, "return_tensors")
    return isinstance(tensors, ast.Constant) and tensors.value == "pt"


def unmoved_tokens(facts: Facts) -> list[tuple[ast.Name, str, ast.Call]]:
    """(argument, model key, load) for each name bound, in the calling function, straight to
    a tokenizer's CPU output and passed to a model that loading put on the GPU."""
    models = _quantized_models(facts)
    if not models:
        return []
    found = []
    for call in facts.calls:
        key = facts.key(call.func)
        if key not in models:
            receiver = facts.receiver(call) if isinstance(call.func, ast.Attribute) else None
            key = facts.key(receiver) if facts.method_name(call) in RUNNING_METHODS else None
            if key not in models:
                continue
        load = models[key]
        if not _same_model(facts, call, load):
            continue
        arguments = [*call.args, *(k.value for k in call.keywords)]
        for argument in arguments:
            if not isinstance(argument, ast.Name):
                continue
            assignment = facts.reaching_assignment(argument)
            if (
                assignment is None
                or assignment.index is not None
                or assignment.loop is not None
                or assignment.value is None
            ):
                continue
            if _host_encoding(facts, assignment.value):
                found.append((argument, key, load))
    return found


def _same_model(facts: Facts, call: ast.Call, load: ast.Call) -> bool:
    """The model `call` runs is the one `load` bound: `self.<attr>` read in the class that
    assigns it, or a name whose binding there is that load."""
    func = call.func
    model = func if facts.key(func) is not None and not _runs_method(facts, call) else None
    if model is None and isinstance(func, ast.Attribute):
        model = func.value
    if isinstance(model, ast.Name):
        return facts.binding_value(model) is load
    return facts.enclosing_class(call) is facts.enclosing_class(load)


def _runs_method(facts: Facts, call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and facts.method_name(call) in RUNNING_METHODS
