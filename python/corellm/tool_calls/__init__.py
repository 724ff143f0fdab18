"""Tool calling: how a model writes its calls (tool_call_format: Hermes / Qwen, Llama 3 JSON,
Mistral), the grammars that constrain them (tool_choice "required", a named function, and the
arguments of "auto" calls once one opens), and the parser that turns the text back into calls,
as it streams (tool_call_parser)."""

from corellm.tool_calls.tool_call_format import TOOL_CALL_FORMATS, Tool, ToolCallFormat, tool_choice_constraint
from corellm.tool_calls.tool_call_parser import ToolCall, ToolCallParser, ToolCallStart, ToolCallArguments

__all__ = ["TOOL_CALL_FORMATS", "Tool", "ToolCall", "ToolCallArguments", "ToolCallFormat", "ToolCallParser",
           "ToolCallStart", "tool_choice_constraint"]
