"""Python's garbage collector while the process starts.

Importing torch, aiohttp and pydantic and building the engine makes some 300k objects that live as
long as the process. CPython's collector runs on allocation counts and traverses every tracked
object at each full collection: during `corellm serve`'s start-up that was 470 collections and
0.24 s of a 1.4 s start, and afterwards each full collection would pause the process for ~90 ms,
whatever it was doing. Only pausing the collector does not help: the first collection after the
pause traverses everything made during it (0.1 s).

So start-up runs inside `lasting_objects()` blocks (`import corellm`'s own imports, the server's
imports, the engine's construction): no collection inside, and at the end gc.freeze() moves the
objects alive then (the block's, and those made before it, a library user's included) into the
permanent generation, which no collection scans. They are still freed when their last reference
goes; only reference cycles among them are never collected (a one-off few megabytes at most)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def lasting_objects() -> Iterator[None]:
    """A block that makes objects which live as long as the process: no collection inside it, and
    the objects alive at its end frozen. The collector's state (a user's gc.disable() included) is
    as before after it; on an exception nothing is frozen."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if enabled:
            gc.enable()
