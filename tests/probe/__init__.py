"""Tests of the runtime probe (`torchls repro`): real torch on CPU, real sandbox."""
