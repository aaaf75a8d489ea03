"""Robustness tests: fuzzed analysis input, fix safety on the examples, a server under abuse."""
