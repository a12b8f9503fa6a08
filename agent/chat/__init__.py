"""The chat: the answer without a model, and the streamed answer with one."""
