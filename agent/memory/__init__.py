"""Memory and context: the agent's stored memory, its consolidation by a model, and the model's context window."""
