"""The repro as one self-contained HTML page: charts where people would rather look than read.

In: a `ReproReport` (and, for `--compare`, the comparison and both sides' reports). Out: an
HTML document that opens offline: the gradient flow (one bar per layer in model order, log
scale, layers that got no gradient marked), activation statistics per layer (fraction of exact
zeros, a dead ReLU block at 1.0; fraction non-finite; mean and spread), loss and gradient norm
per step (both runs overlaid for a comparison), the findings, the per-line trace table and the
failing-boundary record.

Charts are drawn by pygal (pure Python SVG, imported only here, never at server start; no
numpy) and inlined as SVG with pygal's scripts removed; the page carries a content security
policy that allows no script and no remote resource. Everything from the run is untrusted:
text goes in through `html.escape`, and labels through pygal's XML serialisation.
"""

from __future__ import annotations

import html
import re
from typing import Any

from torchls.probe import untrusted
from torchls.probe.document import Activation, Report, Training
from torchls.probe.report import ReproReport

MAX_BARS = 120
MAX_ROWS = 300
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_SCRIPT = re.compile(r"<script\b.*?</script>", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)


def _svg(chart: Any) -> str:
    svg = chart.render(is_unicode=True, disable_xml_declaration=True)
    return _COMMENT.sub("", _SCRIPT.sub("", svg))


def _style() -> Any:
    from pygal.style import Style

    return Style(
        background="white",
        plot_background="white",
        foreground="#333",
        foreground_strong="#111",
        foreground_subtle="#999",
        colors=("#3366cc", "#dc3912", "#ff9900", "#109618", "#990099"),
        font_family="sans-serif",
    )


def _module_of(parameter: str) -> str:
    return parameter.rsplit(".", 1)[0] if "." in parameter else parameter


def gradient_flow(training: Training, without_grad: list[str]) -> tuple[list[str], Any]:
    """(layer names in model order, a pygal bar chart): each layer's gradient norm at the
    first optimizer step, log scale; layers with no gradient get a marked bar of their own."""
    import pygal

    order = list(dict.fromkeys(_module_of(n) for n in training.get("parameter_names") or []))
    first = [p for p in training.get("parameters") or [] if p.get("step") == _first_step(training)]
    norms: dict[str, float] = {}
    for item in first:
        value = item.get("grad_norm")
        if isinstance(value, int | float):
            layer = _module_of(str(item.get("name")))
            norms[layer] = (norms.get(layer, 0.0) ** 2 + float(value) ** 2) ** 0.5
    missing = {_module_of(name) for name in without_grad}
    for layer in [*norms, *missing]:
        if layer not in order:
            order.append(layer)
    order = order[:MAX_BARS]
    positive = [v for v in norms.values() if v > 0]
    floor = min(positive) / 10 if positive else 1e-8
    top = max(positive) * 2 if positive else 1.0
    chart = pygal.Bar(
        js=[],
        style=_style(),
        logarithmic=True,
        range=(floor / 2, top),  # the marked bars stand at `floor`, inside the axis
        zero=floor / 2,  # bars grow from the bottom of the axis, not from 1
        title="Gradient flow: gradient norm per layer at the first step (log scale)",
        x_label_rotation=60,
        show_legend=True,
        legend_at_bottom=True,
        width=1100,
        height=520,
    )
    chart.x_labels = order
    got = [norms.get(layer) if norms.get(layer, 0) > 0 else None for layer in order]
    zero = [floor if layer in norms and norms[layer] == 0 else None for layer in order]
    none = [floor if layer in missing and layer not in norms else None for layer in order]
    chart.add("gradient norm", got)
    chart.add("all-zero gradient", zero)
    chart.add("NO GRADIENT (unused or detached)", none)
    return order, chart


def _first_step(training: Training) -> int | None:
    return min((p["step"] for p in training.get("parameters") or []), default=None)


def activation_charts(training: Training) -> tuple[list[str], list[Any]]:
    """(module names, charts): zero and non-finite fractions, and mean with spread, per module
    at the first step they ran."""
    import pygal

    seen: dict[str, Activation] = {}
    for item in training.get("activations") or []:
        name = item["module"]
        if name not in seen and len(seen) < MAX_BARS:
            seen[name] = item
    names = list(seen)
    fractions = pygal.Bar(
        js=[],
        style=_style(),
        title="Activations: fraction of zeros and of non-finite values per module",
        x_label_rotation=60,
        range=(0, 1),
        legend_at_bottom=True,
        width=1100,
        height=480,
    )
    fractions.x_labels = [f"{n} ({seen[n].get('kind')})" for n in names]
    fractions.add("zeros (1.0: dead)", [seen[n].get("zeros") for n in names])
    fractions.add("non-finite", [seen[n].get("nonfinite") for n in names])
    spread = pygal.Line(
        js=[],
        style=_style(),
        title="Activations: mean and standard deviation per module",
        x_label_rotation=60,
        legend_at_bottom=True,
        width=1100,
        height=420,
    )
    spread.x_labels = names
    spread.add("mean", [seen[n].get("mean") for n in names])
    spread.add("std", [seen[n].get("std") for n in names])
    return names, [fractions, spread]


def steps_chart(sides: list[tuple[str, Training]]) -> Any:
    """Loss per backward and gradient norm per step; one pair of lines per run."""
    import pygal

    chart = pygal.Line(
        js=[],
        style=_style(),
        title="Loss and gradient norm per step",
        legend_at_bottom=True,
        width=1100,
        height=420,
        secondary_range=None,
    )
    longest = max((len(t.get("loss") or []) for _, t in sides), default=0)
    chart.x_labels = [str(i + 1) for i in range(longest)]
    for label, training in sides:
        losses = [x.get("value") for x in training.get("loss") or []]
        norms = [x.get("value") for x in training.get("grad_norm") or []]
        # A series with no finite value (every loss NaN) has no axis range: name it instead.
        if any(v is not None for v in losses):
            chart.add(f"loss ({label})", losses)
        else:
            chart.add(f"loss ({label}): never finite", [])
        if any(v is not None for v in norms):
            chart.add(f"gradient norm ({label})", norms, secondary=True)
    return chart


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(untrusted.one_line(cell, 300))}</td>" for cell in row)
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _lines_table(data: Report) -> str:
    rows = []
    for record in data.get("lines") or []:
        for entry in record.get("entries") or []:
            first = (entry.get("outputs") or [{}])[0] or {}
            if first.get("uninitialized"):
                continue
            shape = "[" + ", ".join(str(d) for d in first.get("shape") or []) + "]"
            finite = "NaN/Inf" if entry.get("nonfinite_count") else "yes"
            rows.append(
                [
                    f"{str(record.get('filename')).rsplit('/', 1)[-1]}:{record.get('line')}",
                    entry.get("op"),
                    shape,
                    first.get("dtype"),
                    finite,
                    entry.get("module") or "",
                ]
            )
    if not rows:
        return "<p>No tensors were traced.</p>"
    shown = _table(["line", "op", "shape", "dtype", "finite", "module"], rows[:MAX_ROWS])
    more = (
        f"<p>… {len(rows) - MAX_ROWS} more in the JSON report.</p>" if len(rows) > MAX_ROWS else ""
    )
    return shown + more


def _findings_table(data: Report) -> str:
    found = data.get("findings") or []
    if not found:
        return "<p>No findings.</p>"
    rows = [
        [f.get("code"), f.get("severity"), f"line {f.get('line')}", f.get("message")] for f in found
    ]
    return _table(["code", "severity", "where", "message"], rows)


def _boundary(data: Report) -> str:
    environment = data.get("environment") or {}
    rows = [
        [key, value] for key, value in environment.items() if not isinstance(value, dict | list)
    ]
    rows += [[f"device {k}", v] for k, v in data["device"].items() if not isinstance(v, dict)]
    sandbox = data.get("sandbox")
    layers = sandbox["layers"] if sandbox is not None else []
    rows += [[f"sandbox {x['name']}", "held" if x["held"] else "NOT held"] for x in layers]
    return _table(["", ""], rows)


def render_html(
    report: ReproReport,
    *,
    title: str = "torchls repro",
    other: tuple[str, ReproReport] | None = None,
    comparison: dict[str, Any] | None = None,
) -> str:
    """The whole page; `other` is the baseline run of a comparison, overlaid on the charts."""
    data = report.data
    training: Training = data.get("training") or {}
    without = list(data["parameters"].get("without_grad") or [])
    _, flow = gradient_flow(training, without)
    _, activation = activation_charts(training)
    sides = [("this run" if other is None else "candidate", training)]
    if other is not None:
        sides.insert(0, (other[0], other[1].data.get("training") or {}))
    target = data["target"]["file"]
    status = f"{data['status']}, stopped by {data['stopped_by']}"
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:24px;color:#222}"
        "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px;font-size:13px;text-align:left}h2{margin-top:32px}"
        "svg{max-width:100%;height:auto}</style></head><body>",
        f"<h1>{html.escape(title)}: {html.escape(untrusted.one_line(target))}</h1>",
        f"<p>{html.escape(untrusted.one_line(status))}</p>",
    ]
    if comparison is not None:
        fixed = ", ".join(f["code"] for f in comparison["findings"]["fixed"]) or "none"
        added = ", ".join(f["code"] for f in comparison["findings"]["introduced"]) or "none"
        parts.append(
            f"<p>Compared with {html.escape(str(comparison['baseline']['ref']))}: fixed "
            f"{html.escape(fixed)}; introduced {html.escape(added)}.</p>"
        )
    parts += [
        "<h2>Findings</h2>",
        _findings_table(data),
        "<h2>Gradient flow</h2>",
        _svg(flow),
        "<h2>Activations</h2>",
        *(_svg(chart) for chart in activation),
        "<h2>Loss and gradient norm per step</h2>",
        _svg(steps_chart(sides)),
        "<h2>Traced lines</h2>",
        _lines_table(data),
        "<h2>Failing-boundary record</h2>",
        _boundary(data),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
