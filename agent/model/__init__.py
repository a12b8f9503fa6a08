"""The model: the OpenAI-compatible client, the prompt, and the stand-in server for tests and replay."""
