"""The JSON schema a `tool_choice` of "required" makes the engine compile: a list of one or more
calls, each naming one of the request's tools and holding arguments its parameters accept.

Written once, because two places need the very same schema: the gate bounds its size and nesting
(it is one grammar, however many tools it joins) and the job carries it as the structured output.
"""

from __future__ import annotations

from typing import Any

from router.openai.chat import Tool

# A function declared without parameters takes an empty object.
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
# How much deeper a tool's parameters lie in the schema than on their own: the list, its items,
# their anyOf, one call, its properties.
CALLS_NESTING = 5


def calls_schema(tools: list[Tool], parallel: bool | None) -> dict[str, Any]:
    """A JSON list of one or more calls, each naming a tool and holding arguments for it."""
    one_call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.function.name]},
                    "parameters": tool.function.parameters or NO_ARGUMENTS,
                },
                "required": ["name", "parameters"],
            }
            for tool in tools
        ]
    }
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": one_call}
    if parallel is False:
        schema["maxItems"] = 1
    return schema
