"""Function tools: reading ``tools`` and ``tool_choice`` (sessions and ``response.create``), and
checking a call's arguments against its function's parameters.

A tool is OpenAI's function tool, ``{type: "function", name, description, parameters}``; its
``parameters`` must be a valid JSON Schema (checked with ``jsonschema`` against the draft its
``$schema`` names, 2020-12 by default). ``tool_choice`` is ``auto``, ``none``, ``required`` or
``{type: "function", name}`` (the chat-completions form ``{type: "function", function: {name}}``
is read too). How the model sees them: ``pipeline.tool_format``.

A client's schema never costs the server more than linear time (docs/SESSION.md "Function
calling"): ``pattern`` and ``patternProperties`` run on RE2 (google-re2: linear in the text, no
backtracking; a pattern RE2 cannot take, such as a backreference or a lookaround, is refused at
``session.update``); ``$ref`` must point into the schema itself, and a schema whose references
loop, or that grows past ``MAX_EXPANDED_SCHEMA_NODES`` with every reference written out, is
refused; ``format`` is an annotation, never asserted. A call's arguments are checked in a worker
thread (:func:`arguments_problems`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import re2
from jsonschema import SchemaError, ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import extend, validator_for

from app.realtime.protocol import FunctionTool, ToolChoiceFunction, invalid_value
from pipeline.tool_format import Tool, ToolChoice

# OpenAI's bounds: function names of 1-64 letters, digits, underscores and dashes; 128 tools.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128
_MODES = ("auto", "none", "required")
# A schema with every local $ref written out in place may hold this many subschemas. The largest
# function schemas of the frameworks' tests hold a few dozen; a schema whose references double at
# each level (allOf of two refs to the level below, 20 levels deep) would be checked a million
# times over per argument.
MAX_EXPANDED_SCHEMA_NODES = 2_048
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is answered to the client, not logged by RE2
# Keywords whose value is a subschema, a list of subschemas or a map of them (drafts 4 to 2020-12).
_SUBSCHEMA = ("additionalProperties", "additionalItems", "contains", "if", "then", "else", "not", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties", "items")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")


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
    error = next(iter(_linear_validator(tool.parameters)(tool.parameters).iter_errors(value)), None)
    if error is not None:
        return f"the arguments do not match the parameters of {name!r} at {error.json_path}"
    return None


def _re2(pattern: str) -> re2._Regexp:
    return re2.compile(pattern, options=_RE2_OPTIONS)


def _pattern(validator: Validator, pattern: str, instance: Any, schema: Mapping[str, Any]) -> Any:
    if validator.is_type(instance, "string") and not _re2(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Validator, patterns: Mapping[str, Any], instance: Any,
                        schema: Mapping[str, Any]) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = _re2(pattern)
        for key, value in instance.items():
            if regex.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _linear_validator(schema: Mapping[str, Any]) -> type[Validator]:
    """The validator of the schema's draft with its regular expressions on RE2."""
    base = validator_for(schema)
    return extend(base, {"pattern": _pattern, "patternProperties": _pattern_properties})


def check_schema_cost(parameters: Mapping[str, Any], param: str) -> None:
    """Refuses a schema whose checking could cost more than linear time: a pattern RE2 cannot
    take, a ``$ref`` outside the schema or in a loop, or more than ``MAX_EXPANDED_SCHEMA_NODES``
    subschemas with every reference written out. ``ProtocolError`` naming the field."""
    sizes: dict[int, int] = {}

    def resolve(ref: str, at: str) -> Any:
        if ref == "#":
            return parameters
        if not ref.startswith("#/"):
            raise invalid_value(at, "may only point into the schema itself ('#' or '#/…')")
        node: Any = parameters
        for token in ref[2:].split("/"):
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise invalid_value(at, f"points to nothing in the schema ({ref!r})")
        return node

    def size(schema: Any, at: str, path: tuple[int, ...]) -> int:
        if not isinstance(schema, Mapping):
            return 0  # a boolean schema
        key = id(schema)
        if key in path:
            raise invalid_value(at, "refers to itself: recursive schemas are not taken")
        if key in sizes:
            return sizes[key]
        path = (*path, key)
        total = 1
        for keyword in ("$dynamicRef", "$recursiveRef"):
            if keyword in schema:
                raise invalid_value(f"{at}.{keyword}", "is not taken: recursive schemas are not taken")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            _check_pattern(pattern, f"{at}.pattern")
        patterns = schema.get("patternProperties")
        if isinstance(patterns, Mapping):
            for pattern in patterns:
                _check_pattern(pattern, f"{at}.patternProperties")
        ref = schema.get("$ref")
        if isinstance(ref, str):
            total += size(resolve(ref, f"{at}.$ref"), f"{at}.$ref", path)
        for keyword in _SUBSCHEMA:
            if isinstance(schema.get(keyword), Mapping):
                total += size(schema[keyword], f"{at}.{keyword}", path)
        for keyword in _SUBSCHEMA_LISTS:
            if isinstance(schema.get(keyword), list):
                total += sum(size(sub, f"{at}.{keyword}[{i}]", path) for i, sub in enumerate(schema[keyword]))
        for keyword in _SUBSCHEMA_MAPS:
            if isinstance(schema.get(keyword), Mapping):
                total += sum(size(sub, f"{at}.{keyword}.{name}", path) for name, sub in schema[keyword].items())
        if total > MAX_EXPANDED_SCHEMA_NODES:
            raise invalid_value(param, f"holds more than {MAX_EXPANDED_SCHEMA_NODES} subschemas with its "
                                       "references written out")
        sizes[key] = total
        return total

    size(parameters, param, ())


def _check_pattern(pattern: str, param: str) -> None:
    try:
        _re2(pattern)
    except re2.error:
        raise invalid_value(param, f"{pattern!r} is not a pattern this server takes: RE2 syntax, without "
                                   "backreferences or lookaround") from None


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
    check_schema_cost(parameters, f"{param}.parameters")
    return Tool(name=name, description=description, parameters=dict(parameters))

