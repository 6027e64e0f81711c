"""The end-of-turn model (smart-turn v3.2) and the turn buffer's end-of-turn policy (semantic_vad)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from media.commit_buffer import TurnCommitBuffer
from media.detector_events import EndOfTurnCheck, SpeechStarted, UtteranceCommitted
from media.detector_params import EndOfTurnPolicy, TurnDetectionParams
from media.end_of_turn_model import (
    WINDOW_SAMPLES,
    SmartTurnModel,
    default_turn_model_path,
    last_window,
    log_mel_features,
)

W = 512  # VAD window samples (32 ms)
SPEECH, QUIET = 0.9, 0.0
POLICY = EndOfTurnPolicy(candidate_ms=128, rescore_ms=0, threshold=0.8, max_wait_ms=1200)
TURNS = Path(__file__).resolve().parents[1] / "fixtures" / "turns"
MODEL_PATH = default_turn_model_path(Path.home() / ".cache" / "omni-rtc")


def push(buffer: TurnCommitBuffer, probabilities: list[float]) -> list[object]:
    events: list[object] = []
    for probability in probabilities:
        events.extend(buffer.push(np.full(W, 0.1, dtype=np.float32), probability))
    return events


def checks(events: list[object]) -> list[EndOfTurnCheck]:
    return [event for event in events if isinstance(event, EndOfTurnCheck)]


# -- the policy in the turn buffer ---------------------------------------------------------------


def test_a_check_is_asked_at_the_candidate_silence_and_finished_commits_at_once() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(end_of_turn=POLICY))
    events = push(buffer, [SPEECH] * 20 + [QUIET] * 4)  # 128 ms of silence
    (check,) = checks(events)
    assert check.silence_ms == 128 and check.pcm.size == (20 + 4) * W - 0  # the utterance so far
    assert push(buffer, [QUIET]) == []  # audio goes on while the model runs
    committed = [e for e in buffer.decide(check.check_id, 0.95) if isinstance(e, UtteranceCommitted)]
    (commit,) = committed
    assert commit.audio_end_ms == 25 * W // 16 and commit.silence_wait_ms == 5 * W // 16  # includes that audio


def test_unfinished_waits_for_max_wait_with_one_check_when_rescore_is_zero() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(end_of_turn=POLICY))
    events = push(buffer, [SPEECH] * 20 + [QUIET] * 4)
    assert buffer.decide(checks(events)[0].check_id, 0.1) == []
    more = push(buffer, [QUIET] * 33)  # up to 37 windows = 1184 ms of silence
    assert checks(more) == [] and not any(isinstance(e, UtteranceCommitted) for e in more)
    (commit,) = [e for e in push(buffer, [QUIET]) if isinstance(e, UtteranceCommitted)]  # 38 windows: 1216 ms
    assert commit.silence_wait_ms == 1216 and not commit.forced


def test_rescore_asks_again_as_the_silence_grows() -> None:
    policy = EndOfTurnPolicy(candidate_ms=96, rescore_ms=320, threshold=0.5, max_wait_ms=2000)
    buffer = TurnCommitBuffer(TurnDetectionParams(end_of_turn=policy))
    first = checks(push(buffer, [SPEECH] * 20 + [QUIET] * 3))
    assert [c.silence_ms for c in first] == [96]
    assert buffer.decide(first[0].check_id, 0.2) == []
    second = checks(push(buffer, [QUIET] * 10))  # 416 ms >= 96 + 320
    assert [c.silence_ms for c in second] == [416]


def test_an_answer_after_speech_resumed_is_stale_and_ignored() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(end_of_turn=POLICY))
    (check,) = checks(push(buffer, [SPEECH] * 20 + [QUIET] * 4))
    push(buffer, [SPEECH] * 3)  # the speaker goes on
    assert buffer.decide(check.check_id, 0.99) == []
    (second,) = checks(push(buffer, [QUIET] * 4))
    assert second.check_id != check.check_id
    (commit,) = [e for e in buffer.decide(second.check_id, 0.99) if isinstance(e, UtteranceCommitted)]
    assert commit.pcm.size == (20 + 4 + 3 + 4) * W  # one turn across the pause


CONFIDENT = EndOfTurnPolicy(candidate_ms=96, rescore_ms=0, threshold=0.75, max_wait_ms=1200,
                            confident_below=0.1, confident_wait_ms=3000)


def committed(events: list[object]) -> list[UtteranceCommitted]:
    return [event for event in events if isinstance(event, UtteranceCommitted)]


def test_a_confident_not_finished_holds_for_the_confident_wait_and_no_longer() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(end_of_turn=CONFIDENT))
    (check,) = checks(push(buffer, [SPEECH] * 20 + [QUIET] * 3))
    assert buffer.decide(check.check_id, 0.05) == []
    assert committed(push(buffer, [QUIET] * 90)) == []  # 93 windows: 2,976 ms of silence
    (commit,) = committed(push(buffer, [QUIET]))
    assert commit.silence_wait_ms == 94 * W // 16 and CONFIDENT.longest_wait_ms == 3000


def test_the_words_are_asked_as_the_silence_starts_and_their_not_finished_holds_the_turn() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(end_of_turn=CONFIDENT, judge_words=True))
    (words,) = checks(push(buffer, [SPEECH] * 20 + [QUIET]))  # the silence's first window
    assert (words.words, words.sound, words.silence_ms) == (True, False, 32)
    (sound,) = checks(push(buffer, [QUIET] * 2))  # the sound at candidate_ms, as without words
    assert (sound.words, sound.sound, sound.silence_ms) == (False, True, 96)
    assert buffer.decide(sound.check_id, 0.95) == []  # the sound says finished; the words are due
    assert buffer.decide_words(words.check_id, 0.02) == []  # "Please put the": not finished
    assert committed(push(buffer, [QUIET] * 60)) == []  # past max_wait_ms
    push(buffer, [SPEECH] * 5)  # "...groceries in the fridge."
    words, sound = checks(push(buffer, [QUIET] * 3))  # a new silence asks the words again
    assert buffer.decide_words(words.check_id, 0.9) == []  # the sound has not answered yet
    (commit,) = committed(buffer.decide(sound.check_id, 0.95))
    assert commit.pcm.size == (20 + 63 + 5 + 3) * W  # one turn


def test_a_failed_words_check_leaves_the_sound_to_decide_and_stale_words_change_nothing() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(end_of_turn=CONFIDENT, judge_words=True))
    stale_words, stale_sound = checks(push(buffer, [SPEECH] * 20 + [QUIET] * 3))
    push(buffer, [SPEECH] * 3)  # the speaker went on: both checks are stale
    assert buffer.decide_words(stale_words.check_id, 0.02) == [] and buffer.decide(stale_sound.check_id, 0.95) == []
    words, sound = checks(push(buffer, [QUIET] * 3))
    assert buffer.decide(sound.check_id, 0.95) == []
    assert committed(buffer.decide_words(words.check_id, None))  # the judge failed: the sound decides


def test_the_sound_alone_needs_the_threshold_and_with_the_words_the_lower_words_threshold() -> None:
    policy = EndOfTurnPolicy(candidate_ms=96, rescore_ms=0, threshold=0.75, max_wait_ms=1200,
                             confident_below=0.1, confident_wait_ms=3000, words_threshold=0.6)
    alone = TurnCommitBuffer(TurnDetectionParams(end_of_turn=policy))
    (sound,) = checks(push(alone, [SPEECH] * 20 + [QUIET] * 3))
    assert alone.decide(sound.check_id, 0.65) == []  # unsure without the words: the 1.2 s wait
    judged = TurnCommitBuffer(TurnDetectionParams(end_of_turn=policy, judge_words=True))
    words, sound = checks(push(judged, [SPEECH] * 20 + [QUIET] * 3))
    assert judged.decide_words(words.check_id, 0.5) == []  # the words do not say "not finished"
    assert committed(judged.decide(sound.check_id, 0.65))


def test_server_vad_asks_no_model_and_reports_its_configured_wait() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams())
    events = push(buffer, [SPEECH] * 20 + [QUIET] * 16)
    assert checks(events) == []
    (commit,) = [e for e in events if isinstance(e, UtteranceCommitted)]
    assert commit.silence_wait_ms == 500


def test_forget_before_drops_speech_begun_earlier_and_trims_audio_otherwise() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams())
    push(buffer, [QUIET] * 10 + [SPEECH] * 10)
    buffer.forget_before(15 * W)  # the onset (window 10) is before it: dropped whole
    assert buffer.speech_onset is None and not buffer.in_speech
    events = push(buffer, [QUIET] * 2 + [SPEECH] * 10)
    assert isinstance(events[0], SpeechStarted)
    buffer.forget_before(buffer.speech_onset)  # type: ignore[arg-type]
    assert buffer.audio_start == 22 * W  # the prefix before the onset is gone, the speech kept


# -- the model -----------------------------------------------------------------------------------


def test_features_are_whisper_log_mel_of_the_last_8_seconds() -> None:
    pcm = np.random.default_rng(0).standard_normal(3 * 16_000).astype(np.float32) * 0.1
    window = last_window(pcm)
    assert window.shape == (WINDOW_SAMPLES,) and np.all(window[: WINDOW_SAMPLES - pcm.size] == 0)
    assert np.array_equal(window[-pcm.size :], pcm)  # padded at the front, as the model was trained
    long = np.arange(10 * 16_000, dtype=np.float32)
    assert np.array_equal(last_window(long), long[-WINDOW_SAMPLES:])
    features = log_mel_features(window)
    assert features.shape == (80, 800) and features.dtype == np.float32
    assert features.max() - features.min() <= 2.0 + 1e-6  # floored 8 decades below the peak, /4


@pytest.fixture(scope="module")
def model() -> SmartTurnModel:
    return SmartTurnModel.load(MODEL_PATH)  # installed by `make` (scripts/fetch_turn_model.py)


def test_model_hears_a_finished_sentence_as_finished_and_a_pause_after_because_as_not(model) -> None:
    manifest = {entry["file"]: entry for entry in json.loads((TURNS / "manifest.json").read_text())}
    prefix, trailing = np.zeros(4800, np.float32), np.zeros(2048, np.float32)  # 300 ms pad, 128 ms silence
    finished, _ = sf.read(TURNS / "finished_03_slt85.wav", dtype="float32")  # "...lights in the kitchen."
    paused, _ = sf.read(TURNS / "paused_03_slt85.wav", dtype="float32")  # "I can't come today because …"
    before_pause = paused[: manifest["paused_03_slt85.wav"]["pause_start_ms"] * 16]
    assert model.probability(np.concatenate([prefix, finished, trailing])) > 0.9
    assert model.probability(np.concatenate([prefix, before_pause, trailing])) < 0.2


def test_a_missing_or_altered_model_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing"):
        SmartTurnModel.load(tmp_path / "absent.onnx")
    altered = tmp_path / "altered.onnx"
    shutil.copy(MODEL_PATH, altered)
    with altered.open("r+b") as file:
        file.seek(1000)
        file.write(b"\x00\x01")
    with pytest.raises(ValueError, match="sha256"):
        SmartTurnModel.load(altered)
