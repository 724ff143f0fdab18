"""corellm.server: the OpenAI-compatible aiohttp server (arrives with the server issue)."""
