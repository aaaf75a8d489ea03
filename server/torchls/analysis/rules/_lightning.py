"""What the Lightning rules (TL701, TL702) share: how deep they follow in-file classes.

In: nothing. Out: `MAX_DEPTH`, the bound on the class chains, subclasses and callback
subclasses the rules walk.
"""

from __future__ import annotations

MAX_DEPTH = 6
