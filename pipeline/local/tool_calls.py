"""Function calls in the Thinker's answer, found token by token (Qwen's Hermes format).

Qwen3-Omni calls a function by writing ``<tool_call>``, then ``{"name": …, "arguments": …}``,
then ``</tool_call>`` (``pipeline.tool_format``); ``<tool_call>`` and ``</tool_call>`` are
single tokens, so a call begins and ends at a known token, never inside a word. Text before the
first call is speech; from the first ``<tool_call>`` on, the answer is calls only (the text
between or after them is not spoken and is dropped: *decided*, docs/MODEL.md).

A call's name is known once its body reads ``{"name": "…", "arguments":``; its arguments then
stream as written, holding back only what may be the closing ``}`` of the body (and whitespace)
until the next characters show it is not. At ``</tool_call>`` the body is read as JSON: a body
that is not ``{"name": …, "arguments": …}`` is still delivered, as written, marked not well formed.
"""

from __future__ import annotations

import json
import re

from pipeline.contract import FunctionCallDelta, FunctionCallDone, FunctionCallEvent, FunctionCallStarted
from pipeline.local.streaming import TextStream
from pipeline.tool_format import TOOL_CALL_END, TOOL_CALL_START

# The body up to the arguments: the name is known here (a JSON string, escapes allowed).
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:')
# What the arguments' end may still turn out to be: the body's closing brace and whitespace.
_MAYBE_BODY_END = re.compile(r"\s*(?:\}\s*)?\Z")


class ToolCallStream:
    """One answer's calls: feed it every token from the first ``<tool_call>`` on.

    ``prefix`` is the answer's start already in the prompt (a forced call's opening,
    ``ThinkerInputs.answer_prefix``): the answer then begins inside a call.
    """

    def __init__(self, tokenizer, prefix: str = "") -> None:
        self._tokenizer = tokenizer
        self.open_id, self.close_id = tokenizer.convert_tokens_to_ids([TOOL_CALL_START, TOOL_CALL_END])
        self._call: _Call | None = None
        self._calls = 0
        self._prefix_events: list[FunctionCallEvent] = []
        if prefix.startswith(TOOL_CALL_START):
            self._prefix_events = self._open(prefix.removeprefix(TOOL_CALL_START))

    @property
    def speaking(self) -> bool:
        """No call has begun: the answer's tokens are still speech."""
        return self._calls == 0

    def opens(self, token: int) -> bool:
        return token == self.open_id

    def push(self, token: int) -> list[FunctionCallEvent]:
        """Events for a token of the answer once it is (or with this token becomes) calls."""
        events, self._prefix_events = self._prefix_events, []
        if token == self.open_id:
            if self._call is not None:  # a new call before the last one closed
                events += self._call.finish(closed=False)
            return events + self._open("")
        if self._call is None:
            return events  # text between or after calls: not spoken, not delivered
        if token == self.close_id:
            events += self._call.finish(closed=True)
            self._call = None
            return events
        return events + self._call.feed(self._call.decoder.push(token))

    def end(self) -> list[FunctionCallEvent]:
        """The answer ended (its stop token, or its length): a call still open is delivered as written."""
        events, self._prefix_events = self._prefix_events, []
        if self._call is not None:
            events += self._call.finish(closed=False)
            self._call = None
        return events

    def _open(self, text: str) -> list[FunctionCallEvent]:
        self._call = _Call(self._calls, TextStream(self._tokenizer))
        self._calls += 1
        return self._call.feed(text)


class _Call:
    """One call's body as it streams."""

    def __init__(self, index: int, decoder: TextStream) -> None:
        self.index = index
        self.decoder = decoder
        self._body = ""
        self._name: str | None = None
        self._arguments_at = 0  # where the arguments start in the body (once the name is known)
        self._sent = 0  # characters of the arguments delivered so far

    def feed(self, text: str) -> list[FunctionCallEvent]:
        self._body += text
        events: list[FunctionCallEvent] = []
        if self._name is None:
            header = _HEADER.match(self._body)
            if header is None:
                return events
            self._name = _json_string(header.group(1))
            self._arguments_at = header.end()
            events.append(FunctionCallStarted(self.index, self._name))
        arguments = self._arguments()
        ready = len(arguments) - len(_MAYBE_BODY_END.search(arguments).group(0))  # type: ignore[union-attr]
        if ready > self._sent:
            events.append(FunctionCallDelta(self.index, arguments[self._sent : ready]))
            self._sent = ready
        return events

    def finish(self, *, closed: bool) -> list[FunctionCallEvent]:
        events = self.feed(self.decoder.flush())
        body = self._parsed()
        if self._name is None:  # never read as {"name": …, "arguments": …}: deliver what there is
            name, arguments, well_formed = _fallback(body, self._body)
            return [
                FunctionCallStarted(self.index, name),
                FunctionCallDelta(self.index, arguments),
                FunctionCallDone(self.index, name, arguments, closed=closed, well_formed=well_formed),
            ]
        arguments = self._arguments().rstrip()
        # Well formed: the body is {"name": …, "arguments": …} with the arguments last, so
        # its own closing brace, not the arguments', ends it.
        inner = arguments.removesuffix("}").rstrip()
        well_formed = isinstance(body, dict) and "arguments" in body and _loads(inner) == body["arguments"]
        if well_formed:
            arguments = inner
        if len(arguments) > self._sent:
            events.append(FunctionCallDelta(self.index, arguments[self._sent :]))
        events.append(FunctionCallDone(self.index, self._name, arguments, closed=closed, well_formed=well_formed))
        return events

    def _arguments(self) -> str:
        return self._body[self._arguments_at :].lstrip()

    def _parsed(self) -> object:
        return _loads(self._body)


_ABSENT = object()


def _loads(text: str) -> object:
    """``text`` as JSON, or ``_ABSENT`` (equal to no JSON value) when it is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON; a number past Python's digit limit; too deep
        return _ABSENT


def _json_string(escaped: str) -> str:
    try:
        return json.loads(f'"{escaped}"')
    except ValueError:
        return escaped


def _fallback(parsed: object, body: str) -> tuple[str, str, bool]:
    """Name, arguments and whether well formed, for a body the streaming read could not name:
    valid JSON with its keys in another order, or anything else (name "", the body as arguments)."""
    if isinstance(parsed, dict) and isinstance(parsed.get("name"), str):
        arguments = parsed.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return parsed["name"], text, True
    return "", body.strip(), False
