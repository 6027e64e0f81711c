"""The engine process's warm-up (``pipeline.local.warmup``): what it runs, and that no generation comes before it."""

import multiprocessing

import pytest

from pipeline.contract import GenerationDone
from pipeline.local.engine_messages import EngineProcessSpec, GenerationEventMessage, Submit
from pipeline.local.engine_process import main as engine_process_main
from pipeline.local.params import GenerationParams
from pipeline.local.warmup import WARM_UP_TOKENS, warm_up_clip, warm_up_generations, warm_up_params
from tests.pipeline.local.test_transformers_engine import GENERATION, short_request

pytestmark = pytest.mark.dev_model  # computes with the dev model: make test, not make test-unit

# Loading the dev model on 2 shared cores: seconds; a guard against a hang, not a speed limit.
RECEIVE_TIMEOUT_S = 300


def test_the_warm_up_covers_a_lone_turn_a_batch_and_a_score():
    groups = warm_up_generations(speaks=True)
    assert [[request.task for request in group] for group in groups] == [
        ["respond"], ["respond", "transcribe"], ["end_of_turn"]
    ]
    [[alone], [beside, transcription], _] = groups
    assert alone.output_audio and beside.output_audio and not transcription.output_audio
    assert all(request.max_output_tokens == WARM_UP_TOKENS for request in (alone, beside, transcription))


def test_a_model_without_a_talker_warms_its_text_paths_only():
    assert not any(request.output_audio for group in warm_up_generations(speaks=False) for request in group)


def test_the_warm_up_clip_is_the_same_quiet_second_every_time():
    clip = warm_up_clip()
    assert clip.shape == (16_000,)
    assert float(abs(clip).max()) < 0.1
    assert (clip == warm_up_clip()).all()


def test_warm_up_answers_run_every_stage_at_the_engines_settings_without_emulation():
    base = GenerationParams(max_audio_frames=50, first_chunk_frames=4, emulate=None)
    params = warm_up_params(base)
    assert params.force_output_tokens == WARM_UP_TOKENS
    assert params.max_audio_frames == 5  # a first chunk and a later one
    assert params.talker_frames_per_token * WARM_UP_TOKENS == pytest.approx(5)
    assert warm_up_params(GenerationParams(max_audio_frames=3)).max_audio_frames == 3


def test_the_engine_process_takes_no_turn_before_its_warm_up_is_over(dev_model_dir):
    context = multiprocessing.get_context("spawn")
    command_reader, commands = context.Pipe(duplex=False)
    events, event_writer = context.Pipe(duplex=False)
    spec = EngineProcessSpec(model=str(dev_model_dir), device="cpu", seed=0, threads=1, generation=GENERATION)
    process = context.Process(target=engine_process_main, args=(spec, command_reader, event_writer), daemon=True)
    process.start()
    command_reader.close()
    event_writer.close()
    try:
        commands.send(Submit(1, short_request()))  # before the process has even loaded the model
        received = []
        while not (received and isinstance(received[-1], GenerationEventMessage)
                   and isinstance(received[-1].event, GenerationDone)):
            assert events.poll(RECEIVE_TIMEOUT_S), f"nothing from the engine process; so far {received}"
            received.append(events.recv())
        kinds = [type(message).__name__ for message in received]
        assert kinds[:2] == ["WarmingUp", "Ready"]
        assert set(kinds[2:]) == {"GenerationEventMessage"}
        assert all(message.generation_id == 1 for message in received[2:])
        ready = received[1]
        assert ready.warm_up is not None and (ready.warm_up.turns, ready.warm_up.failed) == (4, 0)
    finally:
        commands.close()
        process.join(30)
        if process.is_alive():
            process.kill()
