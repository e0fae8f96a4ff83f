"""What the Python SDK puts on the wire, read with Python's own parser (ast), for test/sdk/wire-contract.test.ts.

Prints JSON: every ``Request(METHOD, ROUTE, json=..., query=...)`` the SDK builds with the body and query fields it
can set (routes written as literals, ``path_of("/v1/x/{}", ...)``, ``_sandbox(id, "/suffix")`` or
``_workspace(name, "/suffix")``; a body or query dict followed through the assignments of its function and the
helpers that fill it), every field the SDK reads from an answer (``x["field"]`` and ``x.get("field")`` on values
it did not build itself), and ``forkd.errors.STATUS_OF_CODE``.
"""

import ast
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Set

PACKAGE = Path(sys.argv[1])
ROUTE_HELPERS = {"_sandbox": "/v1/sandboxes/{}", "_workspace": "/v1/workspaces/{}"}
#: Dicts the SDK builds to send (their keys are checked as request fields, not as answers' fields).
OUTGOING = {"body", "query", "wire", "exec_request", "headers", "request", "context", "payload", "frame"}
#: Helpers that add fields to the body passed to them.
BODY_HELPERS = {"_exec_body", "_inline_stdin"}


def literal(node: ast.AST) -> Optional[str]:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def route_of(node: ast.AST, names: Dict[str, ast.AST]) -> Optional[str]:
    if isinstance(node, ast.Name) and node.id in names:
        return route_of(names[node.id], names)
    text = literal(node)
    if text is not None:
        return text
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "path_of" and node.args:
            return literal(node.args[0])
        if node.func.id in ROUTE_HELPERS:
            suffix = literal(node.args[1]) if len(node.args) > 1 else ""
            return ROUTE_HELPERS[node.func.id] + (suffix or "")
    return None


#: Names whose subscripts are type annotations, not reads of a document.
TYPING = {"Optional", "List", "Dict", "Type", "Literal", "Mapping", "Sequence", "Iterable", "Iterator", "Union", "Tuple"}


def dict_keys(node: ast.AST, helpers: Optional[Dict[str, Set[str]]] = None) -> Set[str]:
    """Keys of a dict literal, of either branch of a conditional, or that a helper's returned dict has."""
    if isinstance(node, ast.Dict):
        return {k for k in (literal(key) for key in node.keys if key is not None) if k is not None}
    if isinstance(node, ast.IfExp):
        return dict_keys(node.body, helpers) | dict_keys(node.orelse, helpers)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and helpers is not None:
        return helpers.get(node.func.id, set())
    return set()


def keys_set_on(function: ast.AST, name: str, helpers: Dict[str, Set[str]]) -> Set[str]:
    """Keys a function puts into the dict variable ``name``: literal dicts assigned to it, ``name["k"] = ...``,
    and the keys helpers add when it is passed to them (or when it is assigned a helper's result)."""
    keys: Set[str] = set()
    # `for field in ("a", "b"): d[field] = ...`: the loop's literals are keys too.
    loops: Dict[str, Set[str]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, (ast.Tuple, ast.List)):
            loops[node.target.id] = {k for k in (literal(e) for e in node.iter.elts) if k is not None}
    for node in ast.walk(function):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id == name and node.value is not None:
                    keys |= dict_keys(node.value, helpers)
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == name
                ):
                    key = literal(target.slice)
                    if key is not None:
                        keys.add(key)
                    elif isinstance(target.slice, ast.Name):
                        keys |= loops.get(target.slice.id, set())
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in helpers:
            if any(isinstance(a, ast.Name) and a.id == name for a in node.args):
                keys |= helpers[node.func.id]
    return keys


def main() -> None:
    trees = {path.name: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.glob("*.py"))}
    functions = {
        node.name: node
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
    }
    helpers: Dict[str, Set[str]] = {}
    for helper in ("_inline_stdin", "_exec_body"):  # _exec_body calls _inline_stdin
        function = functions[helper]
        param = function.args.args[0].arg if helper == "_inline_stdin" else "body"
        helpers[helper] = keys_set_on(function, param, helpers)
    # Functions that build and return a dict (network_to_wire, ...): the keys of what they return.
    for name, function in functions.items():
        for node in ast.walk(function):
            if isinstance(node, ast.Return) and node.value is not None:
                returned = dict_keys(node.value, helpers)
                if isinstance(node.value, ast.Name):
                    returned |= keys_set_on(function, node.value.id, helpers)
                if returned:
                    helpers[name] = helpers.get(name, set()) | returned

    requests: List[dict] = []
    reads: List[dict] = []
    for filename, tree in trees.items():
        if filename in ("_limits.py", "errors.py"):
            continue  # generated constants; the error body's keys are checked with the error codes
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            names: Dict[str, ast.AST] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    names[node.targets[0].id] = node.value
            for node in ast.walk(function):
                where = f"sdk/python/forkd/{filename}:{getattr(node, 'lineno', 0)} ({function.name})"
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Request":
                    method = literal(node.args[0]) if node.args else None
                    route = route_of(node.args[1], names) if len(node.args) > 1 else None
                    if method is None or route is None:
                        raise SystemExit(f"{where}: a Request whose method or route this reader cannot follow")
                    sent = {"body": set(), "query": set()}
                    for keyword in node.keywords:
                        kind = "body" if keyword.arg == "json" else "query" if keyword.arg == "query" else None
                        if kind is None:
                            continue
                        sent[kind] |= dict_keys(keyword.value, helpers)
                        if isinstance(keyword.value, ast.Name):
                            sent[kind] |= keys_set_on(function, keyword.value.id, helpers)
                    requests.append(
                        {
                            "method": method,
                            "route": route,
                            "body": sorted(sent["body"]),
                            "query": sorted(sent["query"]),
                            "where": where,
                        }
                    )
                key: Optional[str] = None
                target: Optional[ast.AST] = None
                if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                    key, target = literal(node.slice), node.value
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and node.args
                ):
                    key, target = literal(node.args[0]), node.func.value
                ignored = isinstance(target, ast.Name) and (target.id in OUTGOING or target.id in TYPING)
                if key is not None and not ignored:
                    reads.append({"key": key, "where": where})

    sys.path.insert(0, str(PACKAGE.parent))
    from forkd.errors import STATUS_OF_CODE  # noqa: E402 - the package under test, after its path

    print(json.dumps({"requests": requests, "reads": reads, "status_of_code": dict(STATUS_OF_CODE)}))


main()
