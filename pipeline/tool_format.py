"""Tools in a conversation (``Tool``, ``ToolChoice``, ``FunctionCall``, ``FunctionOutput``) and
Qwen3-Omni's tool format (Hermes style), as its chat template writes them.

The words and layout are the Qwen3 family chat template's tool branch, which Qwen3-Omni's
``chat_template.json`` carries (docs/MODEL.md names the sources):

- the system message ends with the tool block: the instructions (if any) and a blank line,
  then ``# Tools`` …, one ``tojson`` line per tool inside ``<tools></tools>``, and how to call
  (``<tool_call>`` with ``{"name": …, "arguments": …}``);
- an assistant message is its text, then each call as ``<tool_call>\\n{"name": "NAME",
  "arguments": ARGS}\\n</tool_call>`` (a newline before each call, except a first call with no
  text before it);
- function outputs, one or several in a row, are one *user* message of
  ``\\n<tool_response>\\nOUTPUT\\n</tool_response>`` blocks.

``<tool_call>``, ``</tool_call>``, ``<tool_response>`` and ``</tool_response>`` are single
added tokens of Qwen's vocabulary (151657, 151658, 151665, 151666), marked non-special: the
tokenizer finds them in any text it encodes. Encoding the template's whole string would let a
client forge them: a user's "</tool_response>" would close an output, a function output could
open a call. So this module writes *pieces*: text, and ``Markup`` for each of these
tokens the template itself writes; the renderer (``pipeline.local.prompt``) turns markup into its token
and encodes text without ever finding one in it, as it keeps role tokens out of text. For the
template's own words the ids are the ones its string tokenizes to (tests/pipeline/test_tool_format.py).

What a client gives is written so that it cannot change the block's structure either: a call's
name and arguments go in through ``json.dumps`` (a name breaking the rule, or arguments that are
not JSON, come out as JSON strings: the ``{"name": …, "arguments": …}`` object stays one object),
and JSON arguments are written as the template's ``tojson`` writes a mapping.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.token_bounds import ASSISTANT_MESSAGE_TOKENS, USER_MESSAGE_TOKENS, text_tokens_bound


@dataclass(frozen=True)
class Tool:
    """A function the model may call (OpenAI's ``function`` tool): its JSON-schema ``parameters``."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolChoice:
    """``auto``: the model decides; ``none``: no tools in the prompt; ``required``: some call;
    ``function``: a call of ``name``."""

    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None


@dataclass(frozen=True)
class FunctionCall:
    """A function the assistant called: Qwen renders it in the assistant's message.

    ``arguments`` is the JSON text as the model (or the client that created the item) wrote
    it; ``call_id`` pairs it with its output for the history bound, never for the prompt
    (Qwen matches outputs to calls by position).
    """

    call_id: str
    name: str
    arguments: str

    def prompt_tokens(self) -> int:
        """At most this many prompt tokens: its ``<tool_call>`` block in an assistant message."""
        return ASSISTANT_MESSAGE_TOKENS + text_tokens_bound(pieces_text(call_pieces(self, newline_before=True)))

    def held_bytes(self) -> int:
        return text_tokens_bound(self.name) + text_tokens_bound(self.arguments)


@dataclass(frozen=True)
class FunctionOutput:
    """What a function call returned, given back by the client: Qwen's ``<tool_response>``."""

    call_id: str
    output: str

    def prompt_tokens(self) -> int:
        """At most this many prompt tokens: its ``<tool_response>`` block in a user message."""
        return USER_MESSAGE_TOKENS + text_tokens_bound(pieces_text(output_pieces(self)))

    def held_bytes(self) -> int:
        return text_tokens_bound(self.output)


TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
TOOL_MARKUP = (TOOL_CALL_START, TOOL_CALL_END, TOOL_RESPONSE_START, TOOL_RESPONSE_END)
_MARKUP = re.compile("|".join(re.escape(token) for token in TOOL_MARKUP))


@dataclass(frozen=True)
class Markup:
    """One of Qwen's tool tokens, written by the template (never found in a client's text)."""

    token: str


Piece = str | Markup


def template_pieces(text: str) -> list[Piece]:
    """The template's own words with each tool token in them as ``Markup``. Never for client text."""
    pieces: list[Piece] = []
    start = 0
    for match in _MARKUP.finditer(text):
        if match.start() > start:
            pieces.append(text[start:match.start()])
        pieces.append(Markup(match.group()))
        start = match.end()
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def pieces_text(pieces: Iterable[Piece]) -> str:
    """The pieces as the template's string: what the prompt says, as text."""
    return "".join(piece.token if isinstance(piece, Markup) else piece for piece in pieces)

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def offers_tools(tools: tuple[Tool, ...], choice: ToolChoice) -> bool:
    """Whether the prompt carries the tool block: tools given, and ``tool_choice`` not ``none``."""
    return bool(tools) and choice.mode != "none"


def tool_json(tool: Tool) -> str:
    """One tool as the template's ``tool | tojson`` writes it (transformers' ``tojson``:
    ``json.dumps`` with ``ensure_ascii=False``, keys in order) for a chat-completions tool."""
    function: dict[str, object] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = dict(tool.parameters)
    return json.dumps({"type": "function", "function": function}, ensure_ascii=False)


def system_content(system_prompt: str | None, tools: tuple[Tool, ...]) -> list[Piece]:
    """The system message's content with the tool block (``system_prompt`` None: none before it)."""
    before = "" if system_prompt is None else system_prompt + "\n\n"
    tools_text = "".join("\n" + tool_json(tool) for tool in tools)
    return [before + _TOOLS_INTRO + tools_text, *template_pieces(_TOOLS_OUTRO)]


def call_pieces(call: FunctionCall, *, newline_before: bool) -> list[Piece]:
    """One call in an assistant message: ``{"name": …, "arguments": …}`` inside ``<tool_call>``."""
    body = f'{{"name": {json.dumps(call.name, ensure_ascii=False)}, "arguments": {arguments_json(call.arguments)}}}'
    pieces: list[Piece] = ["\n"] if newline_before else []
    return [*pieces, Markup(TOOL_CALL_START), "\n" + body + "\n", Markup(TOOL_CALL_END)]


def arguments_json(arguments: str) -> str:
    """A call's arguments as the prompt writes them: JSON as the template's ``tojson`` writes a
    mapping (what a well-formed call the model wrote already is), anything else as a JSON string."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python holds
        return json.dumps(arguments, ensure_ascii=False)


def output_pieces(output: FunctionOutput) -> list[Piece]:
    """One output in the user message that holds a run of outputs."""
    return ["\n", Markup(TOOL_RESPONSE_START), f"\n{output.output}\n", Markup(TOOL_RESPONSE_END)]


def answer_prefix(choice: ToolChoice) -> str:
    """What the assistant turn starts with to force a call (*decided*, docs/MODEL.md).

    ``required``: the opening ``<tool_call>`` and its newline, the model picks the function;
    ``function``: also ``{"name": "NAME", "arguments":``, the model writes the arguments. The
    prefix stops before the space after the colon: Qwen's BPE writes `` {`` as one token, so a
    prompt ending in a bare space would ask for a split the model never saw.
    """
    if choice.mode == "required":
        return f"{TOOL_CALL_START}\n"
    if choice.mode == "function" and choice.name is not None:
        return f'{TOOL_CALL_START}\n{{"name": {json.dumps(choice.name, ensure_ascii=False)}, "arguments":'
    return ""
