"""The engine: input processing, EngineCore's step loop, output processing (detokenization)."""
