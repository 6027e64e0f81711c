"""What a client sends as input, read without a session: base64 audio, checked text, user and assistant items."""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
import pytest

from app.realtime.history import checked_text, read_assistant_item, read_user_content
from app.realtime.input import decode_input_audio, decode_pcm16, read_item_audio
from app.realtime.protocol import (
    ClientContentPart,
    InputAudioContent,
    InputImageContent,
    InputTextContent,
    OutputAudioContent,
    OutputTextContent,
    ProtocolError,
)
from media import g711
from pipeline.conversation import UserAudio, UserImage, UserText

PartType = Literal["input_text", "input_audio", "input_image", "output_text", "text", "output_audio", "audio"]
IMAGE = UserImage(data=b"not decoded here", width=64, height=64, max_pixels=64 * 64)
CLIP = UserAudio(np.zeros(1_600, dtype=np.float32))


def pcm16(samples: list[int] | np.ndarray) -> str:
    return base64.b64encode(np.asarray(samples, dtype="<i2").tobytes()).decode()


def silence(count: int) -> str:
    """``count`` PCM16 samples of silence, base64."""
    return pcm16(np.zeros(count, dtype=np.int16))


def audio_part(data: str | None, transcript: str | None = None) -> ClientContentPart:
    return ClientContentPart(type="input_audio", audio=data, transcript=transcript)


def text_part(text: str | None, kind: PartType = "input_text") -> ClientContentPart:
    return ClientContentPart(type=kind, text=text)


# decode_pcm16


def test_pcm16_is_scaled_to_minus_one_up_to_just_below_one():
    pcm = decode_pcm16(pcm16([-32768, -16384, 0, 16384, 32767]), "audio")
    assert pcm.dtype == np.float32
    assert pcm.tolist() == [-1.0, -0.5, 0.0, 0.5, 32767 / 32768]
    assert pcm.max() < 1.0


def test_pcm16_is_read_little_endian():
    assert decode_pcm16(base64.b64encode(b"\x01\x00").decode(), "audio").tolist() == [1 / 32768]


def test_pcm16_that_is_not_base64_is_refused_naming_the_param():
    with pytest.raises(ProtocolError) as refused:
        decode_pcm16("not base64!", "item.content[0].audio")
    assert (refused.value.code, refused.value.param) == ("invalid_value", "item.content[0].audio")
    assert "base64" in refused.value.message


def test_pcm16_of_an_odd_byte_count_is_refused_naming_the_param():
    with pytest.raises(ProtocolError) as refused:
        decode_pcm16(base64.b64encode(b"\x00\x00\x00").decode(), "audio")
    assert (refused.value.code, refused.value.param) == ("invalid_value", "audio")
    assert "odd byte count" in refused.value.message


def test_empty_pcm16_is_no_samples():
    assert decode_pcm16("", "audio").size == 0


# decode_input_audio


def test_pcm_input_is_pcm16_at_24_khz_by_default():
    pcm, rate = decode_input_audio(pcm16([16384]), "audio/pcm", "audio")
    assert (pcm.tolist(), rate) == ([0.5], 24_000)


def test_pcm_input_is_at_the_rate_the_session_gives():
    _, rate = decode_input_audio(silence(4), "audio/pcm", "audio", pcm_rate=16_000)
    assert rate == 16_000


@pytest.mark.parametrize("format_type", ["audio/pcmu", "audio/pcma"])
def test_g711_input_is_one_byte_a_sample_at_8_khz(format_type: str):
    raw = bytes([0x00, 0x55, 0x80, 0xD5, 0xFF])  # an odd count: one byte is one sample
    pcm, rate = decode_input_audio(base64.b64encode(raw).decode(), format_type, "audio", pcm_rate=16_000)
    assert rate == 8_000
    assert pcm.tolist() == g711.decode(raw, format_type).tolist()


def test_g711_input_that_is_not_base64_is_refused_naming_the_param():
    with pytest.raises(ProtocolError) as refused:
        decode_input_audio("@@@", "audio/pcmu", "audio")
    assert (refused.value.code, refused.value.param) == ("invalid_value", "audio")


# read_item_audio


def test_item_audio_becomes_16_khz_clips():
    clips = read_item_audio([audio_part(silence(24_000))], input_audio_format="audio/pcm", max_seconds=10)
    assert clips[0].pcm.dtype == np.float32 and len(clips[0].pcm) == 16_000


def test_g711_item_audio_becomes_16_khz_clips():
    data = base64.b64encode(bytes([0xFF]) * 8_000).decode()  # 1 s of µ-law silence
    clips = read_item_audio([audio_part(data)], input_audio_format="audio/pcmu", max_seconds=10)
    assert len(clips[0].pcm) == 16_000


def test_pcm_item_audio_at_the_sessions_rate_becomes_16_khz_clips():
    clips = read_item_audio([audio_part(silence(8_000))], input_audio_format="audio/pcm", max_seconds=10,
                            input_audio_rate=8_000)
    assert len(clips[0].pcm) == 16_000


def test_item_audio_clips_are_keyed_by_their_part_index():
    content = [text_part("listen"), audio_part(silence(2_400)), text_part("and"), audio_part(silence(4_800))]
    clips = read_item_audio(content, input_audio_format="audio/pcm", max_seconds=10)
    assert sorted(clips) == [1, 3]
    assert (len(clips[1].pcm), len(clips[3].pcm)) == (1_600, 3_200)


def test_a_message_without_audio_parts_has_no_clips():
    assert read_item_audio([text_part("hi")], input_audio_format="audio/pcm", max_seconds=10) == {}


def test_item_audio_of_100_ms_is_taken():
    clips = read_item_audio([audio_part(silence(2_400))], input_audio_format="audio/pcm", max_seconds=10)
    assert len(clips[0].pcm) == 1_600


def test_item_audio_under_100_ms_is_refused_naming_its_part():
    content = [text_part("hi"), audio_part(silence(2_399))]
    with pytest.raises(ProtocolError) as refused:
        read_item_audio(content, input_audio_format="audio/pcm", max_seconds=10)
    assert (refused.value.code, refused.value.param) == ("invalid_value", "item.content[1].audio")
    assert "100 ms" in refused.value.message


def test_g711_item_audio_under_100_ms_is_refused():
    data = base64.b64encode(bytes([0xFF]) * 799).decode()
    with pytest.raises(ProtocolError, match="100 ms"):
        read_item_audio([audio_part(data)], input_audio_format="audio/pcma", max_seconds=10)


def test_an_audio_part_without_audio_is_refused_as_missing():
    with pytest.raises(ProtocolError) as refused:
        read_item_audio([audio_part(None)], input_audio_format="audio/pcm", max_seconds=10)
    assert (refused.value.code, refused.value.param) == ("missing_required_parameter", "item.content[0].audio")


def test_item_audio_past_the_most_seconds_is_refused_before_any_is_decoded():
    not_base64 = "!!!!" * 16_000  # as long as 1 s of 24 kHz PCM16 in base64, and not base64 at all
    with pytest.raises(ProtocolError) as refused:
        read_item_audio([audio_part(not_base64)], input_audio_format="audio/pcm", max_seconds=0.5)
    assert (refused.value.code, refused.value.param) == ("invalid_value", "item.content[0].audio")
    assert "passes 0.5 s" in refused.value.message


def test_item_audio_seconds_add_up_across_the_messages_parts():
    content = [audio_part(silence(14_400)), text_part("then"), audio_part(silence(14_400))]  # 0.6 s each
    with pytest.raises(ProtocolError) as refused:
        read_item_audio(content, input_audio_format="audio/pcm", max_seconds=1.0)
    assert refused.value.param == "item.content[2].audio"


def test_g711_item_audio_length_is_one_byte_a_sample_at_8_khz():
    data = base64.b64encode(bytes([0xFF]) * 4_800).decode()  # 0.6 s (0.1 s were it 24 kHz PCM16)
    assert read_item_audio([audio_part(data)], input_audio_format="audio/pcmu", max_seconds=0.6)
    with pytest.raises(ProtocolError, match="passes"):
        read_item_audio([audio_part(data)], input_audio_format="audio/pcmu", max_seconds=0.59)


def test_bad_base64_in_item_audio_is_refused_naming_its_part():
    content = [audio_part(silence(2_400)), audio_part("****")]
    with pytest.raises(ProtocolError) as refused:
        read_item_audio(content, input_audio_format="audio/pcm", max_seconds=10)
    assert refused.value.param == "item.content[1].audio"


# checked_text


def test_checked_text_is_the_text_up_to_the_most_characters():
    assert checked_text("four", "item.text", max_chars=4) == "four"


def test_missing_text_is_refused_naming_the_param():
    with pytest.raises(ProtocolError) as refused:
        checked_text(None, "item.content[0].text", max_chars=10)
    assert (refused.value.code, refused.value.param) == ("missing_required_parameter", "item.content[0].text")


def test_text_past_the_most_characters_is_refused_naming_the_param():
    with pytest.raises(ProtocolError) as refused:
        checked_text("five!", "item.output", max_chars=4)
    assert (refused.value.code, refused.value.param) == ("invalid_value", "item.output")
    assert "4 characters" in refused.value.message


# read_user_content


def test_user_content_reads_text_audio_and_image_parts_in_order():
    content = [
        text_part("look"),
        audio_part(silence(2_400), transcript="what is this"),
        ClientContentPart(type="input_image", image_url="data:image/png;base64,AA==", detail="low"),
    ]
    parts, echoed = read_user_content(content, max_chars=100, images={2: IMAGE}, audio={1: CLIP})
    assert parts == (UserText("look"), CLIP, IMAGE)
    assert echoed == [
        InputTextContent(text="look"),
        InputAudioContent(transcript="what is this"),
        InputImageContent(detail="low"),
    ]


def test_an_image_part_without_a_detail_is_echoed_as_auto():
    content = [ClientContentPart(type="input_image", image_url="data:image/png;base64,AA==")]
    _, echoed = read_user_content(content, max_chars=100, images={0: IMAGE}, audio={})
    assert echoed == [InputImageContent(detail="auto")]


def test_a_user_text_part_past_the_most_characters_is_refused_naming_its_text():
    with pytest.raises(ProtocolError) as refused:
        read_user_content([text_part("ok"), text_part("too long")], max_chars=4, images={}, audio={})
    assert refused.value.param == "item.content[1].text"


def test_a_user_text_part_without_text_is_refused_as_missing():
    with pytest.raises(ProtocolError) as refused:
        read_user_content([text_part(None)], max_chars=4, images={}, audio={})
    assert (refused.value.code, refused.value.param) == ("missing_required_parameter", "item.content[0].text")


def test_an_assistant_part_in_a_user_message_is_refused_naming_its_type():
    with pytest.raises(ProtocolError) as refused:
        read_user_content([text_part("hi"), text_part("hello", "output_text")], max_chars=100, images={}, audio={})
    assert (refused.value.code, refused.value.param) == ("invalid_value", "item.content[1].type")
    assert "output_text" in refused.value.message


def test_an_audio_part_that_was_not_read_is_refused_naming_its_type():
    with pytest.raises(ProtocolError) as refused:
        read_user_content([audio_part(silence(2_400))], max_chars=100, images={}, audio={})
    assert refused.value.param == "item.content[0].type"


def test_an_image_part_that_was_not_read_is_refused_naming_its_type():
    content = [ClientContentPart(type="input_image", image_url="data:image/png;base64,AA==")]
    with pytest.raises(ProtocolError) as refused:
        read_user_content(content, max_chars=100, images={}, audio={})
    assert refused.value.param == "item.content[0].type"


# read_assistant_item


@pytest.mark.parametrize("kind", ["output_text", "text"])
def test_an_assistant_text_part_becomes_a_text_answer(kind: PartType):
    entry = read_assistant_item("item_1", [text_part("Hello there.", kind)], max_chars=100)
    assert (entry.id, entry.modality, entry.text) == ("item_1", "text", "Hello there.")
    assert entry.item().content == [OutputTextContent(text="Hello there.")]


@pytest.mark.parametrize("kind", ["output_audio", "audio"])
def test_an_assistant_audio_part_becomes_an_audio_answer_of_its_transcript(kind: PartType):
    part = ClientContentPart(type=kind, transcript="Hello there.")
    entry = read_assistant_item("item_1", [part], max_chars=100)
    assert (entry.modality, entry.text) == ("audio", "Hello there.")
    assert entry.item().content == [OutputAudioContent(transcript="Hello there.")]


def test_a_client_created_answer_was_heard_in_full():
    entry = read_assistant_item("item_1", [ClientContentPart(type="output_audio", transcript="Hi.")], max_chars=100)
    assert entry.status == "completed"
    assert entry.heard == entry.history_text() == "Hi."
    assert entry.token_ends == [3]


def test_an_assistant_message_of_two_parts_is_refused():
    with pytest.raises(ProtocolError) as refused:
        read_assistant_item("item_1", [text_part("a", "output_text"), text_part("b", "output_text")], max_chars=100)
    assert (refused.value.code, refused.value.param) == ("invalid_value", "item.content")


def test_an_assistant_message_of_no_parts_is_refused():
    with pytest.raises(ProtocolError) as refused:
        read_assistant_item("item_1", [], max_chars=100)
    assert refused.value.param == "item.content"


def test_an_assistant_audio_part_without_a_transcript_is_refused_as_missing():
    with pytest.raises(ProtocolError) as refused:
        read_assistant_item("item_1", [ClientContentPart(type="output_audio", audio=silence(2_400))], max_chars=100)
    assert (refused.value.code, refused.value.param) == ("missing_required_parameter", "item.content[0].transcript")


def test_an_assistant_text_part_without_text_is_refused_as_missing():
    with pytest.raises(ProtocolError) as refused:
        read_assistant_item("item_1", [text_part(None, "output_text")], max_chars=100)
    assert (refused.value.code, refused.value.param) == ("missing_required_parameter", "item.content[0].text")


def test_a_user_part_in_an_assistant_message_is_refused_naming_its_type():
    with pytest.raises(ProtocolError) as refused:
        read_assistant_item("item_1", [text_part("hi")], max_chars=100)
    assert (refused.value.code, refused.value.param) == ("invalid_value", "item.content[0].type")


def test_an_assistant_transcript_past_the_most_characters_is_refused():
    with pytest.raises(ProtocolError) as refused:
        read_assistant_item("item_1", [ClientContentPart(type="output_audio", transcript="too long")], max_chars=4)
    assert (refused.value.code, refused.value.param) == ("invalid_value", "item.content[0].transcript")


def test_item_audio_of_exactly_the_most_seconds_is_taken_whatever_its_base64_padding():
    one_second_of_g711 = base64.b64encode(bytes([0xFF]) * 8_000).decode()  # 8,000 bytes: one "=" of padding
    assert one_second_of_g711.endswith("=")
    clips = read_item_audio([audio_part(one_second_of_g711)], input_audio_format="audio/pcmu", max_seconds=1)
    assert len(clips[0].pcm) == 16_000
