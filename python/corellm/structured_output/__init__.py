"""Structured output: StructuredOutputsParams compiled into llguidance grammars (grammar_spec,
grammar_compiler), each structured request's matcher advanced token by token and the step's
packed bitmask of allowed tokens (structured_output_manager), handed to the sampler as a
GrammarOutput (grammar_output)."""

from corellm.structured_output.grammar_compiler import GrammarCompiler
from corellm.structured_output.grammar_output import GrammarOutput
from corellm.structured_output.structured_output_manager import StructuredOutputManager

__all__ = ["GrammarCompiler", "GrammarOutput", "StructuredOutputManager"]
