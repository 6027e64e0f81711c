"""A turn as vLLM-Omni's chat completion request, and its stream chunks read back (no network)."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import soundfile

from pipeline.contract import GenerationRequest, TranscriptionHint
from pipeline.conversation import DEFAULT_SYSTEM_PROMPT, AssistantText, Conversation, UserAudio, UserImage, UserText
from pipeline.token_count import PromptTooLong
from pipeline.tool_format import FunctionCall, FunctionOutput, Tool, ToolChoice
from pipeline.vllm_omni.chat_completions import (
    MAX_AUDIO_CONTENT_CHARS,
    AudioPiece,
    EventStream,
    EventStreamTooLarge,
    FinishPiece,
    MalformedChunk,
    ServerError,
    TextPiece,
    ToolCallPiece,
    ToolsUnsupported,
    UsagePiece,
    chat_request,
    check_prompt_length,
    read_chunk,
)
from tests.hostile import flac_silence
from tests.pictures import encoded
from tests.vllm_omni_replay import ANSWER_TEXT, SCHEMA_PATH, ReplayServer, ToolCallAnswer, answer_audio

# Fields of our request that are not ChatCompletionRequest's own: vLLM keeps unknown fields
# (OpenAIBaseModel, extra="allow") and vllm-omni 0.32.0rc1's serving_chat reads these two with
# getattr: `modalities` (_create_chat_completion) and `speaker` (_preprocess_chat, with `voice`).
VLLM_OMNI_EXTENSIONS = {"modalities", "speaker"}


def clip(seconds: float = 1.0, seed: int = 0) -> UserAudio:
    rng = np.random.default_rng(seed)
    return UserAudio((0.1 * rng.standard_normal(int(seconds * 16_000))).astype(np.float32))


def strict_validator() -> jsonschema.Draft202012Validator:
    """vLLM 0.32.0's ChatCompletionRequest schema, refusing any top-level field it does not know
    beyond vLLM-Omni's extensions: vLLM itself would ignore a misspelt field silently."""
    schema = json.loads(SCHEMA_PATH.read_text())
    for name in VLLM_OMNI_EXTENSIONS:
        schema["properties"][name] = {}
    schema["additionalProperties"] = False
    return jsonschema.Draft202012Validator(schema)


REQUESTS = {
    "spoken answer with history": GenerationRequest(
        Conversation(items=(clip(1.0), AssistantText("Hi there."), UserText("And now?"), clip(0.5, 1)),
                     instructions="Be brief."),
        voice="aiden", temperature=0.6, max_output_tokens=200,
    ),
    "text-only answer": GenerationRequest(Conversation(items=(UserText("Hello"),)), output_audio=False),
    "camera frame and speech": GenerationRequest(
        Conversation(items=(UserImage(encoded(352, 256), 352, 256, 100_352), clip(1.0))),
    ),
    "transcription": GenerationRequest.transcription(clip(2.0), TranscriptionHint(language="de", prompt="Names: Qwen")),
    "tools with a call and its output in the history": GenerationRequest(
        Conversation(
            items=(UserText("Weather in Paris?"), AssistantText("Let me look."),
                   FunctionCall("call_1", "get_weather", '{"city": "Paris"}'), FunctionOutput("call_1", "sunny"),
                   AssistantText("It is sunny."), clip(1.0)),
            tools=(Tool("get_weather", "The weather in a city.",
                        {"type": "object", "properties": {"city": {"type": "string"}}}), Tool("get_time")),
        ),
    ),
}


@pytest.mark.parametrize("name", REQUESTS)
def test_request_body_validates_against_vllm_omni_request_model(name: str) -> None:
    body = chat_request(REQUESTS[name], model="Qwen/Qwen3-Omni-30B-A3B-Instruct", seed=7)
    errors = [error.message for error in strict_validator().iter_errors(body)]
    assert errors == []


def test_schema_refuses_what_vllm_would() -> None:
    body = chat_request(REQUESTS["text-only answer"])
    validator = strict_validator()
    assert not validator.is_valid({**body, "max_tokens": "many"})
    assert not validator.is_valid({**body, "messages": "hello"})
    assert not validator.is_valid({**body, "max_output_tokens": 10})  # the Realtime name, not vLLM's


def test_history_goes_as_system_user_and_assistant_messages() -> None:
    body = chat_request(REQUESTS["spoken answer with history"])
    roles = [message["role"] for message in body["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert body["messages"][0]["content"] == "Be brief."
    assert body["messages"][2]["content"] == "Hi there."
    last = body["messages"][3]["content"]
    assert [part["type"] for part in last] == ["text", "input_audio"]
    assert last[0]["text"] == "And now?"
    wav = base64.b64decode(last[1]["input_audio"]["data"])
    pcm, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    assert last[1]["input_audio"]["format"] == "wav" and rate == 16_000 and len(pcm) == 8_000
    assert body["modalities"] == ["text", "audio"] and body["speaker"] == "aiden"
    assert body["temperature"] == 0.6 and body["max_tokens"] == 200
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "choice", [ToolChoice("required"), ToolChoice("function", "get_time")], ids=["required", "named"]
)
def test_a_turn_that_must_call_is_refused(choice: ToolChoice) -> None:
    with pytest.raises(ToolsUnsupported):
        chat_request(GenerationRequest(Conversation((UserText("Time?"),), tools=(Tool("get_time"),), tool_choice=choice)))


def test_tools_go_in_the_chat_completions_form_with_tool_choice_auto() -> None:
    body = chat_request(REQUESTS["tools with a call and its output in the history"])
    assert body["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {}}},
    ]
    assert body["tool_choice"] == "auto"


def test_with_tool_choice_none_no_tools_are_sent_as_the_prompt_has_no_tool_block() -> None:
    conversation = Conversation((UserText("Time?"),), tools=(Tool("get_time"),), tool_choice=ToolChoice("none"))
    plain = chat_request(GenerationRequest(Conversation((UserText("Time?"),))))
    assert chat_request(GenerationRequest(conversation)) == plain


def test_a_transcription_carries_no_tools() -> None:
    hint = TranscriptionHint()
    request = GenerationRequest.transcription(clip(1.0), hint)
    body = chat_request(GenerationRequest(Conversation(request.conversation.items, tools=(Tool("get_time"),)),
                                          task="transcribe", hint=hint, output_audio=False))
    assert "tools" not in body and "tool_choice" not in body


def test_the_tools_count_toward_the_prompts_length() -> None:
    long_description = " ".join(["weather"] * 40_000)  # ~40,000 tokens
    conversation = Conversation((UserText("Weather?"),), tools=(Tool("get_weather", long_description),))
    check_prompt_length(GenerationRequest(dataclasses.replace(conversation, tools=())), 32_768)
    with pytest.raises(PromptTooLong):
        check_prompt_length(GenerationRequest(conversation), 32_768)


def test_calls_join_the_answer_before_them_and_outputs_go_as_tool_messages() -> None:
    body = chat_request(REQUESTS["tools with a call and its output in the history"])
    assert body["messages"][1:5] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    assert [message["role"] for message in body["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]


def test_calls_with_nothing_said_before_them_open_one_assistant_message_and_outputs_follow_in_order() -> None:
    items = (UserText("Time here and in Paris?"), FunctionCall("call_1", "get_time", "{}"),
             FunctionCall("call_2", "get_time", '{"tz": "Europe/Paris"}'), FunctionOutput("call_1", "noon"),
             FunctionOutput("call_2", "one"), UserText("Thanks."))
    messages = chat_request(GenerationRequest(Conversation(items, tools=(Tool("get_time"),))))["messages"]
    assert messages[2] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "Europe/Paris"}'}},
    ]}
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "noon"},
        {"role": "tool", "tool_call_id": "call_2", "content": "one"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
    ]


def test_an_image_goes_as_an_image_url_data_url_before_the_audio() -> None:
    body = chat_request(REQUESTS["camera frame and speech"])
    parts = body["messages"][1]["content"]
    assert [part["type"] for part in parts] == ["image_url", "input_audio"]
    url = parts[0]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == encoded(352, 256)


def test_default_instructions_are_qwens_spoken_chat_prompt() -> None:
    body = chat_request(GenerationRequest(Conversation(items=(UserText("Hi"),))))
    assert body["messages"][0] == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}


def test_transcription_is_qwens_asr_prompt_text_only() -> None:
    body = chat_request(REQUESTS["transcription"])
    system, user = body["messages"]
    assert system == {"role": "system", "content": "Names: Qwen"}
    assert [part["type"] for part in user["content"]] == ["input_audio", "text"]
    assert user["content"][1]["text"] == "Transcribe the German audio into text."
    assert body["modalities"] == ["text"] and "speaker" not in body
    assert body["temperature"] == 0.0 and body["max_tokens"] == 36  # 16 + 10 per second of audio


def test_history_past_the_audio_limits_goes_as_transcripts() -> None:
    old = UserAudio(clip(1.0).pcm, transcript="an old question")
    items = (old, AssistantText("old answer"), *[x for n in range(4) for x in (clip(1.0, n), AssistantText(f"a{n}"))],
             clip(1.0, 9))
    body = chat_request(GenerationRequest(Conversation(items=items)))
    first_user = body["messages"][1]["content"]
    assert first_user == [{"type": "text", "text": "an old question"}]


def replayed_chunks(body: dict[str, Any]) -> list[str]:
    """The data payloads the replay would stream for ``body``, without a server."""
    return [data for _, data in ReplayServer()._plan(body, None)]


def test_a_spoken_answer_reads_back_as_text_audio_usage_and_finish() -> None:
    body = chat_request(REQUESTS["spoken answer with history"])
    payloads = replayed_chunks({**body, "max_tokens": 100})
    assert payloads[-1] == "[DONE]"
    pieces = [piece for data in payloads[:-1] for piece in read_chunk(data)]
    text = "".join(piece.text for piece in pieces if isinstance(piece, TextPiece))
    audio = np.concatenate([piece.pcm for piece in pieces if isinstance(piece, AudioPiece)])
    (usage,) = [piece for piece in pieces if isinstance(piece, UsagePiece)]
    assert text == ANSWER_TEXT
    assert np.max(np.abs(audio - ReplayServer().answer)) < 1 / 16_000  # PCM16 in the WAV
    assert usage.completion_tokens == len(ANSWER_TEXT.split(" ")) + 1  # the stop token counts
    assert usage.audio_prompt_tokens == 12 + 6  # the replay's 12.5 tokens per second of the 1 s and 0.5 s clips
    assert [piece.reason for piece in pieces if isinstance(piece, FinishPiece)] == ["stop"]


WEATHER = ToolCallAnswer("get_weather", '{"city": "Paris", "unit": "celsius"}')


def replayed_call(body: dict[str, Any], call: ToolCallAnswer) -> list[str]:
    replay = ReplayServer()
    replay.tool_call = call
    return [data for _, data in replay._plan(body, None)]


def test_a_streamed_call_reads_back_as_its_name_then_its_arguments_in_fragments() -> None:
    body = chat_request(REQUESTS["tools with a call and its output in the history"])
    payloads = replayed_call({**body, "modalities": ["text"]}, WEATHER)
    pieces = [piece for data in payloads[:-1] for piece in read_chunk(data)]
    calls = [piece for piece in pieces if isinstance(piece, ToolCallPiece)]
    assert calls[0] == ToolCallPiece(0, "get_weather", "")
    assert all(piece.index == 0 and piece.name is None for piece in calls[1:]) and len(calls) > 3
    assert "".join(piece.arguments for piece in calls) == WEATHER.arguments
    assert not [piece for piece in pieces if isinstance(piece, TextPiece)]
    assert [piece.reason for piece in pieces if isinstance(piece, FinishPiece)] == ["tool_calls"]


def test_a_spoken_call_after_a_preface_reads_back_as_text_then_the_call_then_the_prefaces_audio() -> None:
    body = chat_request(REQUESTS["tools with a call and its output in the history"])
    call = ToolCallAnswer("get_weather", '{"city": "Rome"}', preface="Let me check.", preface_audio=answer_audio("hello"))
    pieces = [piece for data in replayed_call(body, call)[:-1] for piece in read_chunk(data)]
    kinds = [type(piece).__name__ for piece in pieces if not isinstance(piece, AudioPiece)]
    assert kinds[:4] == ["TextPiece", "TextPiece", "TextPiece", "ToolCallPiece"]
    assert "".join(piece.text for piece in pieces if isinstance(piece, TextPiece)) == "Let me check."
    audio = np.concatenate([piece.pcm for piece in pieces if isinstance(piece, AudioPiece)])
    assert len(audio) == len(answer_audio("hello"))  # the preface, and nothing of the call, is spoken
    assert [piece.reason for piece in pieces if isinstance(piece, FinishPiece)] == ["stop"]  # the audio's


def test_a_spoken_call_with_nothing_before_it_ends_with_an_empty_audio_chunk() -> None:
    body = chat_request(GenerationRequest(Conversation((UserText("Weather?"),), tools=(Tool("get_weather"),))))
    pieces = [piece for data in replayed_call(body, WEATHER)[:-1] for piece in read_chunk(data)]
    assert not [piece for piece in pieces if isinstance(piece, AudioPiece | TextPiece)]
    assert "".join(piece.arguments for piece in pieces if isinstance(piece, ToolCallPiece)) == WEATHER.arguments
    # The empty speech segment comes while the Thinker still writes the call: the text, last, finishes.
    assert [piece.reason for piece in pieces if isinstance(piece, FinishPiece)] == ["tool_calls"]


@pytest.mark.parametrize(
    "delta",
    [{"tool_calls": [{"function": {"name": "f"}}]}, {"tool_calls": [{"index": "first"}]},
     {"tool_calls": {"index": 0}}],
    ids=["no index", "index not a number", "not a list"],
)
def test_a_tool_call_delta_not_shaped_as_vllms_is_refused(delta: dict[str, Any]) -> None:
    chunk = {"id": "c", "object": "chat.completion.chunk", "modality": "text",
             "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    with pytest.raises(MalformedChunk):
        read_chunk(json.dumps(chunk))


def test_a_text_only_answer_cut_by_max_tokens_finishes_with_length() -> None:
    body = chat_request(GenerationRequest(Conversation(items=(UserText("Hi"),)), output_audio=False, max_output_tokens=3))
    pieces = [piece for data in replayed_chunks(body)[:-1] for piece in read_chunk(data)]
    assert "".join(piece.text for piece in pieces if isinstance(piece, TextPiece)) == "Once upon a"
    assert not [piece for piece in pieces if isinstance(piece, AudioPiece)]
    assert [piece.reason for piece in pieces if isinstance(piece, FinishPiece)] == ["length"]


def audio_chunk(content: str) -> str:
    choice = {"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": None}
    return json.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [choice], "modality": "audio"})


def wav(pcm: np.ndarray, rate: int) -> str:
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, rate, format="WAV", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize(
    "data",
    [
        pytest.param('{"id": "c", "choices": [', id="not JSON"),
        pytest.param('{"id": "c", "object": "chat.completion.chunk"}', id="no choices"),
        pytest.param('{"choices": [{"delta": {"content": 5}}], "modality": "text"}', id="content not text"),
        pytest.param('{"choices": [{"delta": {"content": "x"}}], "modality": "video"}', id="unknown modality"),
        pytest.param(audio_chunk("%%%"), id="audio not base64"),
        pytest.param(audio_chunk(base64.b64encode(b"RIFF....WAVE").decode()), id="audio not a sound file"),
        pytest.param(audio_chunk(wav(np.zeros(160, np.float32), 16_000)), id="audio at 16 kHz"),
    ],
)
def test_malformed_chunks_are_refused(data: str) -> None:
    with pytest.raises(MalformedChunk):
        read_chunk(data)


def test_an_error_chunk_is_the_servers_error() -> None:
    data = '{"error": {"message": "Internal server error", "type": "BadRequestError", "param": null, "code": 400}}'
    with pytest.raises(ServerError, match="Internal server error"):
        read_chunk(data)


def test_an_empty_audio_delta_holds_no_audio() -> None:
    assert read_chunk(audio_chunk("")) == []


def test_a_chunk_read_from_a_file_shaped_like_vllm_omnis(tmp_path: Path) -> None:
    pcm = (0.5 * np.sin(np.arange(1_920) / 5)).astype(np.float32)
    (piece,) = read_chunk(audio_chunk(wav(pcm, 24_000)))
    assert isinstance(piece, AudioPiece) and piece.pcm.dtype == np.float32
    assert np.max(np.abs(piece.pcm - pcm)) < 1 / 16_000


def test_a_flac_decode_bomb_is_refused_before_it_is_decoded() -> None:
    # Ten minutes of silence as FLAC, 58 KB of base64, would add 55 MB in the front process.
    content = base64.b64encode(flac_silence()).decode()
    assert len(content) < 60_000
    tracemalloc.start()
    try:
        with pytest.raises(MalformedChunk, match="not a PCM WAV"):
            read_chunk(audio_chunk(content))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # the base64 and its bytes; 55 MiB had it been decoded


@pytest.mark.parametrize(
    ("subtype", "channels", "seconds"),
    [("FLOAT", 1, 0.1), ("PCM_24", 1, 0.1), ("PCM_16", 2, 0.1)],
    ids=["float samples", "24-bit", "stereo"],
)
def test_audio_of_another_sample_format_or_layout_is_refused(subtype: str, channels: int, seconds: float) -> None:
    buffer = io.BytesIO()
    pcm = np.zeros((int(seconds * 24_000), channels), np.float32)
    soundfile.write(buffer, pcm, 24_000, format="WAV", subtype=subtype)
    with pytest.raises(MalformedChunk):
        read_chunk(audio_chunk(base64.b64encode(buffer.getvalue()).decode()))


def test_a_wav_header_claiming_more_than_the_chunk_bound_is_refused_unread() -> None:
    # 10 s of PCM16 written, then the header's sizes claim an hour: refused from the header alone.
    data = bytearray(base64.b64decode(wav(np.zeros(240_000, np.float32), 24_000)))
    claimed = 3_600 * 24_000 * 2
    data[4:8] = (claimed + 36).to_bytes(4, "little")
    data[40:44] = claimed.to_bytes(4, "little")
    with pytest.raises(MalformedChunk, match="at most 30 s"):
        read_chunk(audio_chunk(base64.b64encode(bytes(data)).decode()))


def test_an_audio_chunk_longer_than_its_bound_as_base64_is_refused_before_decoding() -> None:
    with pytest.raises(MalformedChunk, match="base64 characters"):
        read_chunk(audio_chunk("A" * (MAX_AUDIO_CONTENT_CHARS + 4)))


def test_the_event_stream_joins_data_lines_across_reads() -> None:
    stream = EventStream()
    assert stream.feed(b": a comment\r\ndata: {\"a\":") == []
    assert stream.feed(b" 1}\r\nid: 7\r\n\r\ndata: one\ndata:two\n\ndata: [DONE]\n") == ['{"a": 1}', "one\ntwo"]
    assert stream.feed(b"\n") == ["[DONE]"]


def test_an_event_stream_line_that_never_ends_is_refused_at_its_bound() -> None:
    stream = EventStream(max_line_bytes=1_000)
    stream.feed(b"data: " + b"x" * 900)
    with pytest.raises(EventStreamTooLarge):
        stream.feed(b"x" * 200)


def test_an_event_of_many_short_data_lines_is_refused_at_the_same_bound() -> None:
    stream = EventStream(max_line_bytes=1_000)
    with pytest.raises(EventStreamTooLarge):
        stream.feed(b"data: xxxxxxxxx\n" * 200)
