"""The content hash behind every cache of torchls (parses, facts, summaries, results).

In: bytes. Out: a 32-digit hex digest (BLAKE2b, 16 bytes). It comes from CPython's own
`_blake2` module when there is one: `hashlib` initialises OpenSSL when imported, a few
milliseconds that every `torchls check` process would pay for a hash it does not use.
"""

from __future__ import annotations

try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - interpreters without CPython's builtin module
    from hashlib import blake2b


def content_digest(data: bytes) -> str:
    return blake2b(data, digest_size=16).hexdigest()
