"""Template context every page gets."""
from agent.model.model_client import active_planner


def planner(request) -> dict:
    """``active_planner``: which planner runs and, for ``llm``, the model by name
    (``agent.model.model_client.active_planner``; never the key)."""
    return {"active_planner": active_planner()}
