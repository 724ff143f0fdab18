"""Chat templates rendered in a bounded jinja2 sandbox.

Templates come from model files or, when a server allows it, from requests, so rendering must
neither reach Python internals nor run (or grow) without bound:

- jinja2's ImmutableSandboxedEnvironment forbids attribute access to internals and mutation;
- a time budget: a line tracer is installed for the template's own compiled frames only (their
  file name is "<template>"), so every loop iteration of the template checks the deadline — even
  an empty nested loop that calls nothing;
- an output budget: the template is rendered as a stream of chunks whose total size is checked;
- `*` and `**` are intercepted so that one expression cannot allocate a huge string or number.

Exceeding a budget raises ChatTemplateError, a ValueError, like any other template failure."""

from __future__ import annotations

import functools
import json
import sys
import time
from datetime import datetime
from typing import Any

from jinja2 import meta, nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

DEFAULT_MAX_SECONDS = 2.0
DEFAULT_MAX_OUTPUT_CHARS = 8 << 20
_MAX_REPEAT_CHARS = 1 << 20  # the longest string or list one `*` may produce
_MAX_EXPONENT = 256


class ChatTemplateError(ValueError):
    """The chat template failed to render the given messages."""


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > _MAX_REPEAT_CHARS:
                    raise SecurityError(f"the template repeats a sequence to more than {_MAX_REPEAT_CHARS} items")
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > _MAX_EXPONENT:
            raise SecurityError(f"the template raises to a power above {_MAX_EXPONENT}")
        return super().call_binop(context, operator, left, right)


class _GenerationBlocks(Extension):
    """`{% generation %} ... {% endgeneration %}`: templates mark the assistant's part with it (for
    training masks); rendering keeps the block's contents as they are, as transformers does."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _tojson(value: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    """transformers' tojson filter: json.dumps with the same keyword arguments, no HTML escaping."""
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def _deadline_tracer(deadline: float, seconds: float):
    def local(frame, event, arg):
        if event == "line" and time.monotonic() > deadline:
            raise ChatTemplateError(f"the chat template took more than {seconds:g} s to render")
        return local

    def trace(frame, event, arg):
        return local if frame.f_code.co_filename == "<template>" else None

    return trace


def _environment() -> _BoundedSandbox:
    return _BoundedSandbox(trim_blocks=True, lstrip_blocks=True,
                           extensions=["jinja2.ext.loopcontrols", _GenerationBlocks])


@functools.lru_cache(maxsize=16)
def template_variables(template: str) -> frozenset[str]:
    """The variables the template reads from its caller (messages, tools, documents, ...); a
    template that does not parse is a ChatTemplateError."""
    try:
        return frozenset(meta.find_undeclared_variables(_environment().parse(template)))
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None


def render_chat_template(template: str, messages: list[dict[str, Any]], *, max_seconds: float = DEFAULT_MAX_SECONDS,
                         max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS, **variables: Any) -> str:
    """Renders an HF-style chat template with `messages` and `variables` within the budgets."""

    def raise_exception(message: str) -> None:
        raise ChatTemplateError(f"chat template: {message}")

    env = _environment()
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    deadline = time.monotonic() + max_seconds
    previous = sys.gettrace()
    sys.settrace(_deadline_tracer(deadline, max_seconds))
    try:
        chunks, size = [], 0
        for chunk in env.from_string(template).generate(messages=messages, **variables):
            size += len(chunk)
            if size > max_output_chars:
                raise ChatTemplateError(f"the chat template produced more than {max_output_chars} characters")
            chunks.append(chunk)
        return "".join(chunks)
    except ChatTemplateError:
        raise
    except (TemplateError, SecurityError, TypeError, KeyError, AttributeError, IndexError, ValueError,
            OverflowError, MemoryError, RecursionError) as e:
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    finally:
        sys.settrace(previous)
