"""Checks of a tool's inputSchema beyond `check_schema`, so that no call can fail on the schema itself.

Every `$ref` must be a local reference ("#...") that resolves inside the same inputSchema (an MCP tool
definition is self-contained), and every name in a `required` list must be declared in the `properties` of
the same subschema or of one enclosing it (so `anyOf: [{required: [a]}, ...]` beside `properties: {a: ...}`
is fine). A binding's argument path (`x-hat.arg_paths`) must walk object properties to a leaf.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import referencing
import referencing.exceptions
import referencing.jsonschema


def arg_path_problem(schema: Mapping, path: Sequence[str]) -> str | None:
    """None when `path` walks object properties of `schema` to a leaf, else the problem."""
    node = schema
    for depth, key in enumerate(path):
        props = node.get("properties") if isinstance(node, dict) else None
        if not isinstance(props, dict) or key not in props:
            return f"{'.'.join(path[: depth + 1])!r} is not a property of the inputSchema"
        node = props[key]
    return None


# Keywords whose value maps names (not keywords) to subschemas, and keywords whose value is data.
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "required", "dependentRequired"})
_SCHEMA_URI = "urn:hat-jax:input-schema"


def _subschemas(schema: Any, parts: tuple = (), declared: frozenset = frozenset()):
    """Yields (path parts, subschema, names declared in `properties` of the subschema and of the
    schemas enclosing it) for every schema object inside `schema` (itself included)."""
    if isinstance(schema, dict):
        props = schema.get("properties")
        here = declared | frozenset(props if isinstance(props, dict) else ())
        yield parts, schema, here
        for key, value in schema.items():
            if key in _DATA_KEYWORDS:
                continue
            if key in _NAME_MAPS and isinstance(value, dict):
                for name, sub in value.items():  # a property's own schema starts a new object
                    yield from _subschemas(sub, (*parts, key, name))
            elif isinstance(value, dict):
                yield from _subschemas(value, (*parts, key), here)
            elif isinstance(value, list):
                for i, sub in enumerate(value):
                    yield from _subschemas(sub, (*parts, key, i), here)


def schema_problem(schema: Mapping) -> tuple[tuple, str] | None:
    """The first semantic problem of a tool's inputSchema (module docstring), as (path parts inside the schema,
    what was expected), or None when there is none."""
    resolver = None
    for parts, sub, declared in _subschemas(schema):
        ref = sub.get("$ref")
        if ref is not None:
            where = (*parts, "$ref")
            if not isinstance(ref, str) or not ref.startswith("#"):
                return where, f"expected a local reference ('#/$defs/NAME') inside the inputSchema, got {ref!r}"
            if resolver is None:
                resource = referencing.jsonschema.DRAFT202012.create_resource(dict(schema))
                resolver = referencing.Registry().with_resource(_SCHEMA_URI, resource).resolver(base_uri=_SCHEMA_URI)
            try:
                resolver.lookup(ref)
            except referencing.exceptions.Unresolvable:
                return where, f"reference {ref!r} points nowhere in the inputSchema"
        required = sub.get("required")
        if isinstance(required, list):
            for i, name in enumerate(required):
                if name not in declared:
                    listed = ", ".join(sorted(declared)) or "none"
                    return (*parts, "required", i), f"names {name!r}, which is not in the schema's properties ({listed})"
    return None
