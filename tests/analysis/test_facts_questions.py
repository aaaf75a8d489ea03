"""The shared facts questions the rules build on: receiver-returning calls, forward graphs,
rank-dependent conditions, CUDA-only scopes and kinds decided by where a value comes from."""

from __future__ import annotations

import ast

import pytest

from torchls.analysis.facts import Facts, build_facts
from torchls.analysis.source import parse_source


def facts_of(source: str) -> Facts:
    return build_facts(parse_source(source), "<test>")


def expression(facts: Facts, text: str) -> ast.AST:
    """The first node whose source is exactly `text`."""
    for nodes in facts.scope_nodes.values():
        for node in nodes:
            if isinstance(node, ast.expr) and facts.source.segment(node) == text:
                return node
    raise AssertionError(f"no expression {text!r}")


def test_same_object_follows_methods_that_return_their_receiver() -> None:
    facts = facts_of("model.to(device).train()\nnet.eval().cpu()\nx.view(-1).float()\n")
    assert facts.key(facts.same_object(expression(facts, "model.to(device).train()"))) == "model"
    assert facts.key(facts.same_object(expression(facts, "net.eval().cpu()"))) == "net"
    chained = expression(facts, "x.view(-1).float()")
    assert facts.source.segment(facts.same_object(chained)) == "x.view(-1)"


def test_graph_forwards_are_calls_not_the_module_object() -> None:
    facts = facts_of(
        "import torch.nn as nn\n"
        "net = nn.Linear(2, 1)\n"
        "a = net(x)\n"
        "b = net(x2.detach())\n"
        "c = a.pow(2).mean() + 1\n"
    )
    b_value, c_value = facts.tree.body[-2].value, facts.tree.body[-1].value  # type: ignore[attr-defined]
    assert [facts.source.segment(c) for c in facts.graph_forwards(c_value)] == ["net(x)"]
    assert [facts.source.segment(c) for c in facts.graph_forwards(b_value)] == ["net(x2.detach())"]


@pytest.mark.parametrize(
    ("test", "dependent"),
    [
        ("rank == 0", True),
        ("local_rank in (-1, 0)", True),
        ("rank % 8 == 0", True),
        ("is_main_process()", True),
        ("local_rank != -1", False),
        ("world_size > 1", False),
        ("dist.is_initialized()", False),
        ("rank >= 0", False),
    ],
)
def test_rank_dependent_conditions(test: str, dependent: bool) -> None:
    facts = facts_of(f"if {test}:\n    pass\n")
    condition = facts.tree.body[0].test  # type: ignore[attr-defined]
    assert facts.rank_dependent(condition) is dependent


def test_requires_cuda_only_where_the_model_goes_to_cuda_unconditionally() -> None:
    facts = facts_of(
        "import torch\n"
        "def gpu_only(path):\n"
        "    model = Net().cuda()\n"
        "    return torch.load(path)\n"
        "def either(path):\n"
        "    if torch.cuda.is_available():\n"
        "        model = Net().cuda()\n"
        "    return torch.load(path)\n"
        "class Net(torch.nn.Module):\n"
        "    pass\n"
    )
    first, second = sorted(facts.calls_to("torch.load"), key=lambda call: call.lineno)
    assert facts.requires_cuda(first)
    assert not facts.requires_cuda(second)


def test_model_kind_from_origin_not_from_name() -> None:
    facts = facts_of(
        "import torch.nn as nn\n"
        "def save(model: nn.Module, other):\n"
        "    model_state_dict = model.state_dict()\n"
        "    model_dict = {'w': 1}\n"
        "    use(model, other, model_state_dict, model_dict)\n"
    )
    call = next(c for c in facts.calls if isinstance(c.func, ast.Name) and c.func.id == "use")
    typed, untyped, state, literal = call.args
    assert facts.kind_of(typed).kind == "model" and not facts.kind_of(typed).by_name
    assert facts.kind_of(untyped) is None
    assert facts.kind_of(state).kind == "data"
    assert facts.kind_of(literal).kind == "data"


MODELS = """\
import torch
import torch.nn as nn
import torchvision


class Mlp(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.scale = width ** -0.5
        self.body = nn.Sequential(nn.Linear(4, width), nn.GELU(), nn.Linear(width, 1))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.body(x) * self.scale + self.bias


class Normed(Mlp):
    def __init__(self, width):
        super().__init__(width)
        self.norm = nn.BatchNorm1d(1)


class Dropping(nn.Module):
    def forward(self, x):
        return nn.functional.dropout(x, 0.1, training=self.training)


plain = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
dropped = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
lstm = nn.LSTM(3, 8, num_layers=2)
lstm_dropout = nn.LSTM(3, 8, num_layers=2, dropout=0.2)
mlp = Mlp(16).to("cpu")
normed = Normed(16)
dropping = Dropping()
resnet = torchvision.models.resnet18()
"""


@pytest.mark.parametrize(
    ("name", "sensitive"),
    [
        ("plain", False),
        ("dropped", True),
        ("lstm", False),
        ("lstm_dropout", True),
        ("mlp", False),
        ("normed", True),  # the batch-norm is added by the subclass
        ("dropping", True),  # reads self.training itself
        ("resnet", True),  # out of sight: assumed to have such layers
    ],
)
def test_mode_sensitivity_is_decided_by_the_layers_a_model_is_built_from(
    name: str, sensitive: bool
) -> None:
    from torchls.analysis.layers import mode_sensitive

    facts = facts_of(MODELS + f"{name}(x)\n")
    call = next(n for n in facts.calls if facts.source.segment(n) == f"{name}(x)")
    assert mode_sensitive(facts, call.func) is sensitive


@pytest.mark.parametrize(
    ("body", "left"),
    [
        ("    net.eval()\n    return score(net, data)\n", {"net"}),
        ("    with torch.no_grad():\n        net.eval()\n", {"net"}),
        ("    if data:\n        net.eval()\n", set()),
        ("    net.eval()\n    net.train()\n", set()),
        ("    flag = net.training\n    net.eval()\n    net.train(flag)\n", set()),
        ("    other.eval()\n", set()),
        ("    helper(net)\n", {"net"}),
    ],
)
def test_summary_names_the_parameters_a_helper_leaves_in_eval_mode(body: str, left: set) -> None:
    facts = facts_of(
        f"import torch\n\ndef helper(m):\n    m.eval()\n\ndef evaluate(net, data):\n{body}"
    )
    assert set(facts.summary(facts.functions["evaluate"]).leaves_eval) == left
