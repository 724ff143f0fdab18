"""heap_reuse: glibc takes the malloc thresholds (this project's machines run glibc), and a C
library without mallopt leaves things as they are, saying so, without failing."""

from __future__ import annotations

import ctypes
import logging

from corellm import heap_reuse


def test_glibc_takes_the_thresholds():
    assert heap_reuse.keep_freed_memory_for_reuse()


def test_without_mallopt_nothing_is_set_and_it_is_logged(monkeypatch, caplog):
    def no_libc(name):
        raise OSError(f"{name}: cannot open")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    with caplog.at_level(logging.INFO, logger="corellm"):
        assert not heap_reuse.keep_freed_memory_for_reuse()
    assert "no glibc mallopt" in caplog.text
