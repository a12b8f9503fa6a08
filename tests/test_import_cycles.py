"""No module of console, agent or fleet is in an import circle with another, counting the imports
inside function bodies (a function-level import still ties the two modules together; it only hides
the circle from Python's loader).

The graph is grimp's (import-linter's own library, which reads every ``import`` statement of every
module, wherever it stands). A circle is a strongly connected set of two or more modules; the test
names each one with the imports that close it (importer, imported, line).
"""

import grimp

#: circles still open, each to be broken where it is named (a circle that no longer exists fails
#: too, so that this list only shrinks). None is left.
KNOWN: list[frozenset[str]] = []


def _circles(graph) -> list[frozenset[str]]:
    """Tarjan's strongly connected components of two or more modules, iteratively."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def _describe(graph, circle: frozenset[str]) -> str:
    lines = []
    for importer in sorted(circle):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & circle):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer} -> {imported} (l.{detail['line_number']}: {detail['line_contents']})")
    return "\n".join(lines)


def test_no_module_is_in_an_import_circle():
    graph = grimp.build_graph("console", "agent", "fleet")
    circles = _circles(graph)
    new = [c for c in circles if c not in KNOWN]
    assert not new, "import circles (break each; a function-level import counts):\n" + "\n\n".join(
        _describe(graph, c) for c in new)
    gone = [sorted(c) for c in KNOWN if c not in circles]
    assert not gone, f"these circles are broken now: remove them from KNOWN in this file: {gone}"


def test_the_circle_finder_finds_a_circle():
    """The near-miss twin: a graph with one planted circle through a function-level import is found."""
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b", line_number=1, line_contents="from pkg.b import x")
    graph.add_import(importer="pkg.b", imported="pkg.c", line_number=1, line_contents="from pkg.c import y")
    assert _circles(graph) == []
    graph.add_import(importer="pkg.c", imported="pkg.a", line_number=9, line_contents="    from pkg.a import z")
    assert _circles(graph) == [frozenset({"pkg.a", "pkg.b", "pkg.c"})]
    assert "pkg.c -> pkg.a (l.9:" in _describe(graph, _circles(graph)[0])
