"""End-to-end tests of the torchls language server over stdio (pytest-lsp).

A package so that its helper module (`support`) and test module names cannot clash with test
modules elsewhere in the repository.
"""
