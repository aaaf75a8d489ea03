"""torchls: static checks, a language server and a runtime probe for PyTorch training code.

This package root only carries the version; the CLI lives in `torchls.cli`, the pure analysis in
`torchls.analysis` and the language server in `torchls.lsp`.
"""

__version__ = "0.1.0"
