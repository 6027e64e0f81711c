"""Qwen3-Omni's tool format (Hermes style), as its chat template writes it.

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
tokenizer finds them in any text it encodes, the template's and the conversation's alike, as it
does when it encodes the template's output. So this module writes text, and the prompt is
tokenized as the template's string would be.
"""

from __future__ import annotations

import json

from pipeline.conversation import FunctionCall, FunctionOutput, Tool, ToolChoice

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"

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


def system_content(system_prompt: str | None, tools: tuple[Tool, ...]) -> str:
    """The system message's content with the tool block (``system_prompt`` None: none before it)."""
    before = "" if system_prompt is None else system_prompt + "\n\n"
    return before + _TOOLS_INTRO + "".join("\n" + tool_json(tool) for tool in tools) + _TOOLS_OUTRO


def call_text(call: FunctionCall, *, newline_before: bool) -> str:
    """One call in an assistant message (its arguments as written: the template's string case)."""
    newline = "\n" if newline_before else ""
    return f'{newline}{TOOL_CALL_START}\n{{"name": "{call.name}", "arguments": {call.arguments}}}\n{TOOL_CALL_END}'


def output_text(output: FunctionOutput) -> str:
    """One output in the user message that holds a run of outputs."""
    return f"\n{TOOL_RESPONSE_START}\n{output.output}\n{TOOL_RESPONSE_END}"


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
        return f'{TOOL_CALL_START}\n{{"name": "{choice.name}", "arguments":'
    return ""
