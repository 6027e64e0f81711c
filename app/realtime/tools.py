"""Function tools: reading ``tools`` and ``tool_choice`` (sessions and ``response.create``), and
checking a call's arguments against its function's parameters.

A tool is OpenAI's function tool, ``{type: "function", name, description, parameters}``; its
``parameters`` must be a valid JSON Schema (checked with ``jsonschema`` against the draft its
``$schema`` names, 2020-12 by default). ``tool_choice`` is ``auto``, ``none``, ``required`` or
``{type: "function", name}`` (the chat-completions form ``{type: "function", function: {name}}``
is read too). How the model sees them: ``pipeline.tool_format``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from app.realtime.protocol import FunctionTool, ToolChoiceFunction, invalid_value
from pipeline.tool_format import Tool, ToolChoice

# OpenAI's bounds: function names of 1-64 letters, digits, underscores and dashes; 128 tools.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128
_MODES = ("auto", "none", "required")


def read_tools(value: Any, param: str, *, max_chars: int) -> tuple[Tool, ...]:
    """``tools``: function tools, each checked; ``ProtocolError`` naming the first bad field."""
    if not isinstance(value, list):
        raise invalid_value(param, "must be an array of function tools")
    if len(value) > MAX_TOOLS:
        raise invalid_value(param, f"holds more than {MAX_TOOLS} tools")
    tools = tuple(_read_tool(tool, f"{param}[{index}]", max_chars=max_chars) for index, tool in enumerate(value))
    names = [tool.name for tool in tools]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise invalid_value(f"{param}[{index}].name", f"{name!r} names two tools")
    return tools


def check_function_name(name: str, param: str) -> str:
    """A function's name as OpenAI's rule has it, wherever a client gives one; ``ProtocolError`` else."""
    if not _NAME.fullmatch(name):
        raise invalid_value(param, "must be 1-64 letters, digits, underscores or dashes")
    return name


def read_tool_choice(value: Any, param: str) -> ToolChoice:
    if isinstance(value, str):
        if value not in _MODES:
            raise invalid_value(param, "must be 'auto', 'none', 'required' or {type: 'function', name}")
        return ToolChoice(value)  # type: ignore[arg-type]  # one of _MODES
    if isinstance(value, Mapping) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, Mapping) else value.get("name")
        if isinstance(name, str) and _NAME.fullmatch(name):
            return ToolChoice("function", name)
        raise invalid_value(f"{param}.name", "must name a function")
    raise invalid_value(param, "must be 'auto', 'none', 'required' or {type: 'function', name}")


def check_choice(tools: tuple[Tool, ...], choice: ToolChoice, param: str) -> None:
    """A call can be forced only among the tools given."""
    if choice.mode == "required" and not tools:
        raise invalid_value(param, "'required' needs at least one tool")
    if choice.mode == "function" and choice.name not in {tool.name for tool in tools}:
        raise invalid_value(f"{param}.name", f"{choice.name!r} is not one of the tools")


def tool_objects(tools: tuple[Tool, ...]) -> list[FunctionTool]:
    return [FunctionTool(name=t.name, description=t.description, parameters=dict(t.parameters)) for t in tools]


def choice_object(choice: ToolChoice) -> str | ToolChoiceFunction:
    if choice.mode == "function" and choice.name is not None:
        return ToolChoiceFunction(name=choice.name)
    return choice.mode


def arguments_problem(tools: tuple[Tool, ...], name: str, arguments: str) -> str | None:
    """Why a call's arguments are not what its function takes, or None when they are."""
    tool = next((tool for tool in tools if tool.name == name), None)
    if tool is None:
        return f"the function {name!r} is not one of the tools"
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return "the arguments are not valid JSON"
    if not isinstance(value, dict):
        return "the arguments are not a JSON object"
    error = next(iter(validator_for(tool.parameters)(tool.parameters).iter_errors(value)), None)
    if error is not None:
        return f"the arguments do not match the parameters of {name!r} at {error.json_path}"
    return None


def _read_tool(value: Any, param: str, *, max_chars: int) -> Tool:
    if not isinstance(value, Mapping):
        raise invalid_value(param, "must be an object")
    kind = value.get("type", "function")
    if kind != "function":
        raise invalid_value(f"{param}.type", "only 'function' tools are supported")
    name = value.get("name")
    if not isinstance(name, str):
        raise invalid_value(f"{param}.name", "must be 1-64 letters, digits, underscores or dashes")
    check_function_name(name, f"{param}.name")
    description = value.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid_value(f"{param}.description", "must be a string")
    if description is not None and len(description) > max_chars:
        raise invalid_value(f"{param}.description", f"longer than {max_chars} characters")
    parameters = value.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, Mapping):
        raise invalid_value(f"{param}.parameters", "must be a JSON Schema object")
    try:
        validator_for(parameters).check_schema(parameters)
    except SchemaError as exc:
        raise invalid_value(f"{param}.parameters", f"is not a valid JSON Schema (at {exc.json_path})") from None
    if len(json.dumps(parameters)) > max_chars:
        raise invalid_value(f"{param}.parameters", f"longer than {max_chars} characters as JSON")
    return Tool(name=name, description=description, parameters=dict(parameters))

