"""Function tools read from a client, and a call's arguments checked against them at linear cost."""

from __future__ import annotations

import json

import pytest

from app.realtime.protocol import ProtocolError
from app.realtime.tools import MAX_EXPANDED_SCHEMA_NODES, arguments_problem, read_tools

BACKTRACKING = "^(.+)+X$"  # catastrophic for a backtracking engine: 2^n ways to split n characters


def tool(parameters: dict) -> dict:
    return {"type": "function", "name": "lookup", "parameters": parameters}


def read(parameters: dict) -> tuple:
    return read_tools([tool(parameters)], "session.tools", max_chars=100_000)


def refusal(parameters: dict) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        read(parameters)
    return caught.value


@pytest.mark.timeout(20)  # Python's re takes longer than the universe has on 60 characters
def test_a_backtracking_pattern_is_checked_in_linear_time():
    tools = read({"type": "object", "properties": {"q": {"type": "string", "pattern": BACKTRACKING}}})

    assert arguments_problem(tools, "lookup", json.dumps({"q": "a" * 60})) is not None
    assert arguments_problem(tools, "lookup", json.dumps({"q": "a" * 60 + "X"})) is None


@pytest.mark.timeout(20)
def test_pattern_properties_run_on_the_same_engine():
    tools = read({"type": "object", "patternProperties": {BACKTRACKING: {"type": "integer"}}})

    assert arguments_problem(tools, "lookup", json.dumps({"a" * 60 + "X": "not a number"})) is not None
    assert arguments_problem(tools, "lookup", json.dumps({"a" * 60: "not matched, so anything"})) is None


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)a", r"(?<!b)a"])
def test_a_pattern_that_needs_backtracking_is_refused_naming_it(pattern):
    error = refusal({"type": "object", "properties": {"q": {"type": "string", "pattern": pattern}}})

    assert error.code == "invalid_value"
    assert error.param == "session.tools[0].parameters.properties.q.pattern"
    assert "RE2" in error.message


@pytest.mark.parametrize("parameters", [
    {"$ref": "#"},
    {"type": "object", "properties": {"next": {"$ref": "#"}}},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
])
def test_a_schema_that_refers_to_itself_is_refused(parameters):
    assert "recursive" in refusal(parameters).message


def test_a_reference_outside_the_schema_is_refused():
    error = refusal({"type": "object", "properties": {"q": {"$ref": "https://example.com/schema.json"}}})

    assert error.param == "session.tools[0].parameters.properties.q.$ref"


def test_references_that_double_at_each_level_are_refused_by_their_written_out_size():
    levels = 16  # 2^16 subschemas written out, from a schema of 50 lines
    defs = {"l0": {"type": "string"}}
    for level in range(1, levels):
        below = {"$ref": f"#/$defs/l{level - 1}"}
        defs[f"l{level}"] = {"allOf": [below, dict(below)]}
    error = refusal({"$defs": defs, "$ref": f"#/$defs/l{levels - 1}"})

    assert str(MAX_EXPANDED_SCHEMA_NODES) in error.message


def test_shared_definitions_are_taken_and_checked():
    tools = read({
        "$defs": {"city": {"type": "string", "pattern": "^[A-Z][a-z]+$"}},
        "type": "object",
        "properties": {"from": {"$ref": "#/$defs/city"}, "to": {"$ref": "#/$defs/city"}},
        "required": ["from", "to"],
    })

    assert arguments_problem(tools, "lookup", json.dumps({"from": "Paris", "to": "Rome"})) is None
    assert "$.to" in (arguments_problem(tools, "lookup", json.dumps({"from": "Paris", "to": "rome"})) or "")


def test_a_format_is_an_annotation_and_never_checked():
    tools = read({"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}})

    assert arguments_problem(tools, "lookup", json.dumps({"when": "not a date"})) is None
