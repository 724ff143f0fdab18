"""The text a streaming parser must hold back: the end of what arrived that may be the start of a
marker it is waiting for (a tool call's trigger, a reasoning block's closing tag)."""

from __future__ import annotations


def partial_marker_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
