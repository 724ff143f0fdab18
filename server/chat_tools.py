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
from corellm.reasoning_parser import HARMONY
from corellm.tool_calls import HARMONY_TOOL_PARSER, TOOL_CALL_FORMATS, Tool, ToolCallParser, tool_choice_constraint


@dataclass
class ChatTools:
    tools: list[Tool]
    template_tools: list[dict[str, Any]] | None  # what the chat template gets as `tools`
    mode: str  # "none", "auto", "required" or "named"
    named: str | None  # the function of a named tool_choice
    constraint: StructuredOutputsParams | None
    format_name: str

    def parser(self) -> ToolCallParser | None:
        """A parser for one choice's output (None: the output is only text, or its calls are the
        harmony parser's: the openai format)."""
        if self.mode == "none" or self.format_name == HARMONY_TOOL_PARSER:
            return None
        return ToolCallParser(TOOL_CALL_FORMATS[self.format_name], [t.name for t in self.tools], self.mode, self.named)


def check_tool_call_parser(tool_call_parser: str | None, enable_auto_tool_choice: bool,
                           reasoning_parser: str | None) -> None:
    """ValueError for server flags that do not go together: --enable-auto-tool-choice without a
    parser; gpt-oss's harmony tool parser (openai) without its reasoning parser (openai_gptoss), or
    that reasoning parser with another tool format (its calls are harmony messages)."""
    if enable_auto_tool_choice and tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json, mistral or openai)")
    if tool_call_parser is not None and (tool_call_parser == HARMONY_TOOL_PARSER) != (reasoning_parser == HARMONY):
        raise ValueError(f"--tool-call-parser {tool_call_parser} with --reasoning-parser {reasoning_parser}: gpt-oss's "
                         f"harmony format takes --tool-call-parser {HARMONY_TOOL_PARSER} with --reasoning-parser "
                         f"{HARMONY}, and neither with another")


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
    if fmt == HARMONY_TOOL_PARSER and mode in ("required", "named"):
        raise bad_request(f"tool_choice {'a named function' if named else repr(mode)} is not supported with gpt-oss's "
                          f"harmony format (--tool-call-parser openai): use \"auto\" or \"none\"", "tool_choice")
    if fmt == HARMONY_TOOL_PARSER:
        pass  # "auto": the model writes its calls as harmony messages, unconstrained (corellm.harmony reads them)
    elif mode != "none":
        if req.structured_output()[0] is not None:
            raise bad_request(f"tool_choice {mode!r} cannot be combined with response_format or structured "
                              f"outputs", "tool_choice")
        wire_choice = {"type": "function", "function": {"name": named}} if named else mode
        constraint = tool_choice_constraint(tools, wire_choice, TOOL_CALL_FORMATS[fmt],
                                            req.parallel_tool_calls is not False, tokenizer)
    template_tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    return ChatTools(tools, template_tools, mode, named, constraint, fmt)
