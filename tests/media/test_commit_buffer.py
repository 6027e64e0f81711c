from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from media.commit_buffer import TurnCommitBuffer
from media.detector_events import SegmentCommitted, SpeechStarted, SpeechStopped, UtteranceCommitted
from media.detector_params import TurnDetectionParams
from media.voice_activity_detector import VoiceActivityDetector

W = 512  # window samples (32 ms)
SPEECH, QUIET = 0.9, 0.0


def feed(buffer: TurnCommitBuffer, probs: list[float], *, window: int = W) -> list[tuple[int, object]]:
    """Push a sample-index ramp (sample i has value i) window by window; return (window index, event)."""
    events = []
    for i, probability in enumerate(probs):
        ramp = np.arange(i * window, (i + 1) * window, dtype=np.float32)
        events.extend((i, event) for event in buffer.push(ramp, probability))
    return events


def commits(events: list[tuple[int, object]]) -> list[UtteranceCommitted]:
    return [event for _, event in events if isinstance(event, UtteranceCommitted)]


def assert_ramp(pcm: np.ndarray, start: int, end: int) -> None:
    np.testing.assert_array_equal(pcm, np.arange(start, end, dtype=np.float32))


class _PatternSpeech:
    """A VAD stream over a sample-index ramp: each window's probability is ``pattern`` at its index."""

    def __init__(self, pattern: list[float]) -> None:
        self._pattern = pattern

    def new_stream(self) -> _PatternSpeech:
        return self

    def probability(self, window: np.ndarray) -> float:
        index = int(window[0]) // W
        return self._pattern[index] if index < len(self._pattern) else QUIET

    def reset(self) -> None:
        return None


def test_commit_holds_prefix_speech_and_trailing_silence_exactly() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams())
    events = feed(buffer, [QUIET] * 20 + [SPEECH] * 20 + [QUIET] * 20)
    # Onset at window 20 = sample 10240; 300 ms prefix = 4800 samples → start 5440 (340 ms).
    # Speech ends with window 39, at sample 20480; 500 ms = 8000 samples later, inside window 55
    # → commit point 28480 (1780 ms), not the end of that window (28672).
    (commit,) = commits(events)
    assert_ramp(commit.pcm, 5440, 28480)
    assert (commit.audio_start_ms, commit.audio_end_ms, commit.forced) == (340, 1780, False)
    assert [event for _, event in events][:2] == [SpeechStarted(340), SpeechStopped(1780)]


def test_speech_started_waits_for_min_speech_but_reports_the_onset() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(prefix_padding_ms=0))
    events = feed(buffer, [QUIET] * 10 + [SPEECH] * 20)
    # 250 ms = 4000 samples of speech are reached after 8 windows (4096), i.e. in window 17.
    assert events == [(17, SpeechStarted(audio_start_ms=10 * W // 16))]


def test_burst_shorter_than_min_speech_is_dropped() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams())
    events = feed(buffer, [QUIET] * 10 + [SPEECH] * 7 + [QUIET] * 40)  # 224 ms < 250 ms
    assert events == []
    assert not buffer.in_speech


def test_bursts_with_short_dips_between_them_add_up_to_speech() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(prefix_padding_ms=0))
    # "Oak | Street": 160 ms, a 32 ms dip, 96 ms, a 64 ms dip, 224 ms: each burst under 250 ms.
    events = feed(buffer, [QUIET] * 10 + [SPEECH] * 5 + [QUIET] + [SPEECH] * 3 + [QUIET] * 2 + [SPEECH] * 7
                  + [QUIET] * 20)
    # 250 ms = 8 windows of speech: the 5 and 3 of the first two bursts, so in window 18.
    assert [event for _, event in events][:1] == [SpeechStarted(audio_start_ms=10 * W // 16)]
    assert events[0][0] == 18
    (commit,) = commits(events)
    assert commit.audio_start_ms == 10 * W // 16


def test_bursts_apart_by_a_gap_do_not_add_up() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams())
    # Clicks of 160 ms, 128 ms (4 windows) of quiet between them: each onset ends at its gap.
    events = feed(buffer, ([QUIET] * 4 + [SPEECH] * 5) * 6 + [QUIET] * 20)
    assert events == []
    assert not buffer.in_speech


def test_probabilities_between_the_thresholds_neither_start_nor_end_silence() -> None:
    between = 0.4  # below threshold 0.5, above the hysteresis threshold 0.35
    buffer = TurnCommitBuffer(TurnDetectionParams())
    events = feed(buffer, [SPEECH] * 10 + [between] * 100)
    assert [event for _, event in events] == [SpeechStarted(0)]
    assert buffer.in_speech


def test_silence_wait_is_cancelled_only_by_speech_above_threshold() -> None:
    params = TurnDetectionParams(prefix_padding_ms=0)
    # Speech ends with window 9 (sample 5120); a 0.4 window at 20 does not cancel the wait:
    # commit 500 ms (8000 samples) after the end of speech.
    buffer = TurnCommitBuffer(params)
    events = feed(buffer, [SPEECH] * 10 + [QUIET] * 10 + [0.4] + [QUIET] * 30)
    (commit,) = commits(events)
    assert commit.audio_end_ms == (5120 + 8000) // 16
    # A 0.6 window at 20 restarts it: speech ends with window 20 (sample 10752).
    buffer = TurnCommitBuffer(params)
    events = feed(buffer, [SPEECH] * 10 + [QUIET] * 10 + [0.6] + [QUIET] * 30)
    (commit,) = commits(events)
    assert commit.audio_end_ms == (10752 + 8000) // 16


def test_the_wait_counts_from_the_last_window_at_threshold_not_the_first_below_the_hysteresis() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(prefix_padding_ms=0))
    # Speech ends with window 9 (sample 5120); three unsure windows (0.4) come before the silence.
    events = feed(buffer, [SPEECH] * 10 + [0.4] * 3 + [QUIET] * 20)
    (commit,) = commits(events)
    assert commit.audio_end_ms == (5120 + 8000) // 16  # 820 ms: 500 ms after the speech
    assert commit.silence_wait_ms == 500


def test_unsure_windows_outlasting_the_wait_commit_when_the_silence_is_confirmed() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(prefix_padding_ms=0))
    events = feed(buffer, [SPEECH] * 10 + [0.4] * 20 + [QUIET] * 5)  # 640 ms unsure, then quiet
    (commit,) = commits(events)
    assert events[-1][0] == 30  # the first window below the hysteresis threshold
    assert_ramp(commit.pcm, 0, 31 * W)


def test_samples_short_of_a_window_commit_when_they_complete_the_wait() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams())
    feed(buffer, [SPEECH] * 10 + [QUIET] * 15)  # speech ends at 5120; 12800 samples pushed
    assert buffer.push_unscored(np.arange(12800, 12900, dtype=np.float32)) == []  # 13120 not reached
    events = buffer.push_unscored(np.arange(12800, 13120, dtype=np.float32))
    assert [type(event) for event in events] == [SpeechStopped, UtteranceCommitted]
    assert_ramp(events[1].pcm, 0, 13120)
    # Their window comes whole next: the committed part is skipped, the rest begins the next
    # utterance's prefix, which never reaches back into the commit.
    assert buffer.push(np.arange(12800, 12800 + W, dtype=np.float32), QUIET) == []
    assert buffer.audio_start == 13120
    for i in range(26, 36):
        buffer.push(np.arange(i * W, (i + 1) * W, dtype=np.float32), SPEECH)
    assert buffer.in_speech and buffer.audio_start == 13120


def test_speech_resuming_after_the_wait_but_inside_its_window_is_the_next_utterance() -> None:
    """The samples that complete the wait commit before their window is scored: speech that
    resumes within those last <= 31 ms begins the next utterance, as it would 32 ms later."""
    pattern = [SPEECH] * 10 + [QUIET] * 15 + [SPEECH] * 10  # the wait ends at 13120, inside window 25
    detector = VoiceActivityDetector(_PatternSpeech(pattern), TurnDetectionParams())
    stream = np.arange((len(pattern) + 20) * W, dtype=np.float32)
    committed = [event for start in range(0, stream.size, 320) for event in detector.push(stream[start : start + 320])
                 if isinstance(event, UtteranceCommitted)]
    assert [(int(event.pcm[0]), int(event.pcm[-1]) + 1) for event in committed] == [(0, 13120), (13120, 35 * W + 8000)]


def test_the_20_ms_chunk_holding_the_waits_last_sample_commits_not_the_window_after() -> None:
    detector = VoiceActivityDetector(_PatternSpeech([SPEECH] * 10), TurnDetectionParams(prefix_padding_ms=0))
    stream = np.arange(60 * 320, dtype=np.float32)
    committed_with = None
    for chunk, start in enumerate(range(0, stream.size, 320)):
        events = detector.push(stream[start : start + 320])
        if any(isinstance(event, UtteranceCommitted) for event in events):
            committed_with = chunk
            break
    # Speech ends at sample 5120; the wait's last sample, 13119, is in chunk 40 (12800-13119),
    # while the window holding it (12800-13311) is complete only with chunk 41.
    assert committed_with == 40
    assert [event.audio_end_ms for event in events if isinstance(event, UtteranceCommitted)] == [820]


def test_next_prefix_never_reaches_into_committed_audio() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams())
    # First commit at sample 13120 (500 ms after speech ended with window 9), inside window 25;
    # speech resumes right away in window 26, whose prefix takes the rest of window 25 only.
    events = feed(buffer, [SPEECH] * 10 + [QUIET] * 16 + [SPEECH] * 10 + [QUIET] * 16)
    first, second = commits(events)
    assert_ramp(first.pcm, 0, 13120)
    assert_ramp(second.pcm, 13120, 36 * W + 8000)


def test_speech_past_max_utterance_is_cut_into_contiguous_segments_of_one_turn() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(prefix_padding_ms=0, max_utterance_ms=1000))
    events = feed(buffer, [SPEECH] * 100 + [QUIET] * 16)
    pieces = [event for _, event in events if isinstance(event, SegmentCommitted | UtteranceCommitted)]
    # 1000 ms = 16000 samples is reached after 32 windows (16384 samples): cuts at 32, 64, 96 windows.
    bounds = [0, 32 * W, 64 * W, 96 * W, 100 * W + 8000]  # the turn ends 500 ms after the speech
    for piece, start, end in zip(pieces, bounds[:-1], bounds[1:], strict=True):
        assert_ramp(piece.pcm, start, end)
        assert (piece.audio_start_ms, piece.audio_end_ms) == (start // 16, end // 16)
    kinds = [type(event).__name__ for _, event in events]
    assert kinds == ["SpeechStarted"] + ["SegmentCommitted"] * 3 + ["SpeechStopped", "UtteranceCommitted"]
    assert not pieces[-1].forced


def test_a_segment_never_ends_in_a_pause_the_silence_ends_the_turn() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(prefix_padding_ms=0, max_utterance_ms=1000))
    # Silence from window 28; the segment limit (window 32) passes during it; the wait ends the turn
    # 500 ms after the speech.
    events = feed(buffer, [SPEECH] * 28 + [QUIET] * 40)
    assert [type(event).__name__ for _, event in events] == ["SpeechStarted", "SpeechStopped", "UtteranceCommitted"]
    (commit,) = commits(events)
    assert not commit.forced
    assert commit.audio_end_ms == (28 * W + 8000) // 16
    assert not buffer.in_speech


def test_max_turn_ends_the_turn_and_speech_going_on_starts_the_next() -> None:
    params = TurnDetectionParams(prefix_padding_ms=0, max_utterance_ms=1000, max_turn_ms=2000)
    buffer = TurnCommitBuffer(params)
    events = feed(buffer, [SPEECH] * 100 + [QUIET] * 16)
    kinds = [type(event).__name__ for _, event in events]
    assert kinds == ["SpeechStarted", "SegmentCommitted", "SpeechStopped", "UtteranceCommitted",
                     "SpeechStarted", "SegmentCommitted", "SpeechStopped", "UtteranceCommitted"]
    first, second = commits(events)
    # 2000 ms = 32000 samples of turn: reached after 63 windows (32256 samples).
    assert first.forced and (first.audio_start_ms, first.audio_end_ms) == (32 * W // 16, 63 * W // 16)
    assert not second.forced and second.audio_end_ms == (100 * W + 8000) // 16
    assert events[4][1] == SpeechStarted(63 * W // 16)


def test_reset_drops_the_utterance_and_keeps_counting_time() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams())
    feed(buffer, [SPEECH] * 10)
    assert buffer.in_speech
    buffer.reset()
    assert not buffer.in_speech
    events = []
    for i in range(10, 50):  # the stream continues at sample 10 * 512
        ramp = np.arange(i * W, (i + 1) * W, dtype=np.float32)
        events.extend(buffer.push(ramp, SPEECH if i < 20 else QUIET))
    (commit,) = [e for e in events if isinstance(e, UtteranceCommitted)]
    assert_ramp(commit.pcm, 10 * W, 20 * W + 8000)  # the prefix stops at the reset point


def test_new_params_apply_to_the_next_window() -> None:
    buffer = TurnCommitBuffer(TurnDetectionParams(prefix_padding_ms=0))
    feed(buffer, [SPEECH] * 10)
    buffer.params = TurnDetectionParams(prefix_padding_ms=0, silence_duration_ms=2000)
    events = feed(buffer, [QUIET] * 30)
    assert commits(events) == []


@settings(max_examples=150, deadline=None)
# Found by hypothesis: a forced cut in the trailing silence, then new speech after the cut.
@example(runs=[(667, 0.6, 12), (57, 0.0, 12), (359, 0.0, 8), (1, 0.6, 1), (267, 0.0, 12)], prefix_ms=0, min_speech_ms=0)
@given(
    # Runs of equal windows: (window samples, probability, how many windows).
    st.lists(
        st.tuples(st.integers(1, 700), st.sampled_from([0.0, 0.2, 0.4, 0.6, 0.95]), st.integers(1, 12)), max_size=60
    ),
    st.sampled_from([0, 100, 300]),
    st.sampled_from([0, 250]),
)
def test_any_windows_commit_contiguous_non_overlapping_ramps(runs, prefix_ms, min_speech_ms) -> None:
    params = TurnDetectionParams(
        prefix_padding_ms=prefix_ms, silence_duration_ms=200, min_speech_ms=min_speech_ms, max_utterance_ms=700,
        max_turn_ms=1500,
    )
    buffer = TurnCommitBuffer(params)
    position, pushes, events = 0, 0, []  # events: (number of the push that gave it, event)
    for size, probability, repeat in runs:
        for _ in range(repeat):
            pushed = buffer.push(np.arange(position, position + size, dtype=np.float32), probability)
            events.extend((pushes, event) for event in pushed)
            pushes += 1
            position += size

    previous_end = 0
    open_utterance = continues_forced_cut = False
    previous, previous_push = None, -1
    for push, event in events:
        if isinstance(event, SpeechStarted):
            assert not open_utterance
            open_utterance = True
            # A forced cut in mid-speech starts the next utterance in the same push; one in the
            # trailing silence ends the turn, and later speech is a new turn with its own prefix.
            continues_forced_cut = isinstance(previous, UtteranceCommitted) and previous.forced and push == previous_push
            assert event.audio_start_ms >= previous_end // 16
        elif isinstance(event, SpeechStopped):
            assert open_utterance
        elif isinstance(event, SegmentCommitted):  # the utterance goes on right after it
            assert open_utterance
            start = int(event.pcm[0])
            assert start >= previous_end
            assert_ramp(event.pcm, start, start + event.pcm.size)
            previous_end = start + event.pcm.size
            assert (event.audio_start_ms, event.audio_end_ms) == (start // 16, previous_end // 16)
            continues_forced_cut = True  # the next piece starts at its end
        else:
            assert open_utterance
            open_utterance = False
            start = int(event.pcm[0])
            assert start >= previous_end
            if continues_forced_cut:  # speech went on through a forced cut: not one sample lost
                assert start == previous_end
            assert_ramp(event.pcm, start, start + event.pcm.size)
            assert event.audio_start_ms == start // 16
            previous_end = start + event.pcm.size
            assert event.audio_end_ms == previous_end // 16
        previous, previous_push = event, push
    assert buffer.in_speech == open_utterance


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([QUIET, 0.4, SPEECH]), st.integers(1, 30)), min_size=1, max_size=12),
    st.lists(st.integers(40, 1500), min_size=1, max_size=20),  # chunks of 2.5-94 ms
)
def test_any_chunking_commits_contiguous_utterances_that_never_overlap(runs, sizes) -> None:
    """Samples committed short of a window (push_unscored) and then skipped in their window: no
    sample is lost inside an utterance or committed twice, whatever the chunks."""
    pattern = [probability for probability, count in runs for _ in range(count)]
    stream = np.arange((len(pattern) + 20) * W, dtype=np.float32)
    params = TurnDetectionParams(silence_duration_ms=200, min_speech_ms=96)

    def utterances(chunk_sizes: list[int]) -> list[tuple[int, int]]:
        detector = VoiceActivityDetector(_PatternSpeech(pattern), params)
        found, start, turn = [], 0, 0
        while start < stream.size:
            size = chunk_sizes[turn % len(chunk_sizes)]
            for event in detector.push(stream[start : start + size]):
                if isinstance(event, UtteranceCommitted):
                    first = int(event.pcm[0])
                    assert_ramp(event.pcm, first, first + event.pcm.size)
                    found.append((first, first + event.pcm.size))
            start, turn = start + size, turn + 1
        return found

    chunked = utterances(sizes)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(chunked, chunked[1:], strict=False))
