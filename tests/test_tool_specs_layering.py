"""The guards read what a tool *is* (``agent.policy.tool_specs``) and never import what it
*does*: no ``agent.actions → agent.policy.guards → agent.runtime.tools → agent.actions`` circle, lazy imports
inside functions included. The bodies are bound into the one registry, so guards and the
pipeline see the same tools (a test-registered tool included)."""

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _graph() -> dict[str, set[str]]:
    """Module → the project modules it imports anywhere in its source (top level or in functions)."""
    mods = {}
    for p in [*ROOT.glob("agent/**/*.py"), *ROOT.glob("fleet/**/*.py")]:
        if "migrations" in p.parts:
            continue
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = p
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                graph[m] |= {t for t in [node.module, *(f"{node.module}.{a.name}" for a in node.names)] if t in mods}
            elif isinstance(node, ast.Import):
                graph[m] |= {a.name for a in node.names if a.name in mods}
    return graph


def _reaches(graph, start: str, goal: str) -> list[str] | None:
    queue, seen = deque([[start]]), {start}
    while queue:
        path = queue.popleft()
        for nxt in sorted(graph[path[-1]]):
            if nxt == goal:
                return [*path, nxt]
            if nxt not in seen:
                seen.add(nxt)
                queue.append([*path, nxt])
    return None


def test_guards_never_import_tool_implementations_or_actions():
    graph = _graph()
    assert _reaches(graph, "agent.policy.guards", "agent.runtime.tools") is None
    actions = [m for m in graph if m == "agent.actions" or m.startswith("agent.actions.")]
    assert len(actions) > 1  # the package and its domains (agent.actions.instances, ...)
    assert all(_reaches(graph, "agent.policy.guards", m) is None for m in actions)
    assert _reaches(graph, "agent.policy.tool_specs", "agent.runtime.tools") is None


def test_the_bodies_are_bound_into_the_one_registry():
    from agent.policy import tool_specs
    from agent.runtime import tools

    assert tools.TOOLS is tool_specs.TOOLS and tools.PUBLIC_TOOLS is tool_specs.PUBLIC_TOOLS
    assert all(t.body is not None for t in tools.TOOLS.values())
    assert tools.TOOLS["stop_instance"].side_effect and tools.TOOLS["stop_instance"].body.__name__ == "stop_instance"
