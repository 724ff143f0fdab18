"""A chat request's tools, resolved: which tool_choice applies (OpenAI's rules, vLLM's flags), the
constraint that enforces it, and a fresh ToolCallParser per choice to read the calls back.

    tool_choice absent: "auto" when the server has --enable-auto-tool-choice, else "none"
    "none"      the tools reach the template; the output is text
    "auto"      needs --enable-auto-tool-choice and --tool-call-parser: text, or calls in the
                parser's format, whose arguments are held to their schema once a call opens
    "required"  one call or more (one with parallel_tool_calls false), nothing else
    a function  its arguments, held to its schema (the reply is that one call)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corellm.sampling_params import StructuredOutputsParams
from corellm.server.errors import bad_request
from corellm.server.protocol import ChatCompletionRequest
from corellm.server.serving import ServerConfig
from corellm.tokenizer import Tokenizer
from corellm.tool_calls import TOOL_CALL_FORMATS, Tool, ToolCallParser, tool_choice_constraint


@dataclass
class ChatTools:
    tools: list[Tool]
    template_tools: list[dict[str, Any]] | None  # what the chat template gets as `tools`
    mode: str  # "none", "auto", "required" or "named"
    named: str | None  # the function of a named tool_choice
    constraint: StructuredOutputsParams | None
    format_name: str

    def parser(self) -> ToolCallParser | None:
        """A parser for one choice's output (None: the output is only text)."""
        if self.mode == "none":
            return None
        return ToolCallParser(TOOL_CALL_FORMATS[self.format_name], [t.name for t in self.tools], self.mode, self.named)


def resolve_chat_tools(req: ChatCompletionRequest, config: ServerConfig, tokenizer: Tokenizer) -> ChatTools:
    tools = [Tool(t.function.name, t.function.parameters, t.function.description) for t in req.tools or []]
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tools: function names must be distinct", "tools")
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools and config.enable_auto_tool_choice else "none"
    if not isinstance(choice, str):
        if choice.function.name not in names:
            raise bad_request(f"tool_choice names the function {choice.function.name!r}, which is not in tools",
                              "tool_choice")
    elif choice in ("auto", "required") and not tools:
        raise bad_request(f'tool_choice "{choice}" needs tools', "tool_choice")
    elif choice == "auto" and not config.enable_auto_tool_choice:
        raise bad_request('tool_choice "auto" needs a server started with --enable-auto-tool-choice and '
                          '--tool-call-parser', "tool_choice")
    named = None if isinstance(choice, str) else choice.function.name
    mode = "named" if named else choice
    fmt = config.tool_call_parser or "hermes"  # "required" without a parser: Hermes' format
    constraint = None
    if mode != "none":
        if req.structured_output()[0] is not None:
            raise bad_request(f"tool_choice {mode!r} cannot be combined with response_format or structured "
                              f"outputs", "tool_choice")
        wire_choice = {"type": "function", "function": {"name": named}} if named else mode
        constraint = tool_choice_constraint(tools, wire_choice, TOOL_CALL_FORMATS[fmt],
                                            req.parallel_tool_calls is not False, tokenizer)
    template_tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    return ChatTools(tools, template_tools, mode, named, constraint, fmt)
