"""The questions rules ask about one file, one concept per module, put together by `Facts`.

`vocabulary` (node aliases, name patterns, records), `index` (parents, scopes, bindings,
calls), `kinds` (what objects names hold), `values` (where values come from), `tensors`
(the activation a value carries, float casts),
`flow` (no-grad regions, reachability, the training loops) and `calls` (project callees and
their summaries). In: nothing. Out: the modules; import `Facts` from `torchls.analysis.facts`.
"""
