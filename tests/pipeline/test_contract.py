"""The session-engine contract's own rules: the requests it builds, usage sums, pooled capabilities, errors."""

from __future__ import annotations

import numpy as np

from pipeline.contract import (
    TRANSCRIPTION_MAX_TOKENS,
    TRANSCRIPTION_MIN_TOKENS,
    EngineCapabilities,
    EngineError,
    GenerationRequest,
    TranscriptionHint,
    Usage,
)
from pipeline.conversation import UserAudio, UserText

RATE = 16_000  # UserAudio's rate


def clip(seconds: float) -> UserAudio:
    return UserAudio(np.zeros(round(seconds * RATE), dtype=np.float32))


def capabilities(**overrides: bool) -> EngineCapabilities:
    every = {"function_calls": True, "forced_function_calls": True, "end_of_turn_scores": True, "images": True,
             "preemptible_generations": True}
    return EngineCapabilities(**{**every, **overrides})


def test_a_transcription_of_an_empty_clip_may_still_write_the_minimum_tokens():
    assert GenerationRequest.transcription(clip(0)).max_output_tokens == TRANSCRIPTION_MIN_TOKENS == 16


def test_a_transcription_adds_ten_tokens_a_second_of_audio():
    assert GenerationRequest.transcription(clip(3)).max_output_tokens == 16 + 30


def test_a_transcriptions_bound_drops_a_partial_token():
    assert GenerationRequest.transcription(clip(1.25)).max_output_tokens == 16 + 12  # 12.5 tokens of audio


def test_a_transcriptions_bound_reaches_the_cap_exactly():
    assert GenerationRequest.transcription(clip(408)).max_output_tokens == TRANSCRIPTION_MAX_TOKENS == 4096


def test_a_transcription_of_a_long_clip_is_capped_at_4096_tokens():
    assert GenerationRequest.transcription(clip(500)).max_output_tokens == 4096


def test_a_transcription_is_greedy_text_only_and_holds_just_its_clip():
    audio = clip(1)
    request = GenerationRequest.transcription(audio)
    assert request.task == "transcribe"
    assert request.temperature == 0.0
    assert request.output_audio is False
    assert request.conversation.items == (audio,)
    assert request.preemptible_id is None


def test_a_transcription_without_a_hint_gets_an_empty_one():
    assert GenerationRequest.transcription(clip(1)).hint == TranscriptionHint(language=None, prompt=None)


def test_a_transcription_keeps_the_hint_it_is_given():
    hint = TranscriptionHint(language="de", prompt="Names: Jürgen")
    assert GenerationRequest.transcription(clip(1), hint).hint is hint


def test_an_end_of_turn_request_is_one_greedy_text_step_on_the_open_user_text():
    request = GenerationRequest.end_of_turn("Please put the")
    assert request.task == "end_of_turn"
    assert request.conversation.items == (UserText("Please put the"),)
    assert (request.temperature, request.max_output_tokens, request.output_audio) == (0.0, 1, False)
    assert request.hint is None and request.preemptible_id is None


def test_usage_input_tokens_sum_text_audio_and_image_tokens():
    usage = Usage(input_text_tokens=5, input_audio_tokens=7, output_text_tokens=0, input_image_tokens=11)
    assert usage.input_tokens == 23


def test_usage_output_tokens_sum_text_tokens_and_codec_frames():
    usage = Usage(input_text_tokens=100, input_audio_tokens=0, output_text_tokens=3, output_audio_tokens=40)
    assert usage.output_tokens == 43


def test_usage_of_a_text_only_turn_counts_no_audio_or_image_tokens():
    usage = Usage(input_text_tokens=4, input_audio_tokens=2, output_text_tokens=6)
    assert (usage.input_tokens, usage.output_tokens) == (6, 6)


def test_a_pool_has_a_capability_only_when_every_member_has_it():
    shared = EngineCapabilities.shared_by([capabilities(images=False), capabilities(function_calls=False)])
    assert shared == capabilities(images=False, function_calls=False)


def test_a_pool_of_one_has_that_members_capabilities():
    only = capabilities(end_of_turn_scores=False, preemptible_generations=False)
    assert EngineCapabilities.shared_by([only]) == only


def test_shared_capabilities_read_a_one_shot_iterator_once_for_every_field():
    members = (each for each in [capabilities(), capabilities(preemptible_generations=False)])
    assert EngineCapabilities.shared_by(members) == capabilities(preemptible_generations=False)


def test_shared_capabilities_of_no_members_are_all_true():
    assert EngineCapabilities.shared_by([]) == capabilities()


def test_an_engine_error_defaults_to_the_engine_error_code():
    error = EngineError("the engine broke")
    assert error.code == "engine_error"
    assert str(error) == "the engine broke"


def test_an_engine_error_keeps_the_code_it_is_given():
    error = EngineError("no slot", code="no_spare_capacity")
    assert error.code == "no_spare_capacity"
    assert str(error) == "no slot"
