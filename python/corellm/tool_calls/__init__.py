"""Tool calling: how a model writes its calls (tool_call_format: Hermes / Qwen, Llama 3 JSON,
Mistral; gpt-oss's harmony messages are corellm.harmony's), the grammars that constrain them (tool_choice "required", a named function, and the
arguments of "auto" calls once one opens), and the parser that turns the text back into calls,
as it streams (tool_call_parser)."""

from corellm.tool_calls.tool_call_format import (HARMONY_TOOL_PARSER, TOOL_CALL_FORMATS, TOOL_CALL_PARSERS, Tool,
                                                 ToolCallFormat, tool_choice_constraint)
from corellm.tool_calls.tool_call_parser import ToolCall, ToolCallParser, ToolCallStart, ToolCallArguments

__all__ = ["HARMONY_TOOL_PARSER", "TOOL_CALL_FORMATS", "TOOL_CALL_PARSERS", "Tool", "ToolCall", "ToolCallArguments", "ToolCallFormat", "ToolCallParser",
           "ToolCallStart", "tool_choice_constraint"]
