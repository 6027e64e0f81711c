"""A real room: backchannels, noises, speakerphone echo, interruptions and background noise, as a
WebRTC client that talks to the server in real time meets them, with the session's noise reduction
off and on.

Run: .venv/bin/python tests/bench/real_room.py [--scenarios backchannels noises echo interruptions
     noise speech_in_noise latency] [--noise-reduction off near_field [far_field]] [--trials N]
     [--noise-seconds 60] [--repo PATH] [--server-args '--media-workers 1'] [--session-extra JSON]
     [--label before] [--out tests/bench/results/real_room.json]

``omni-rtc serve --engine-url`` runs as deployed (a subprocess on 127.0.0.1, ``--ice-loopback``)
against the replay of a vLLM-Omni server (tests/vllm_omni_replay.py, on a thread of this process,
first audio 0.4 s after the request, then decoding at RTF 0.15: its first chunk holds 320 ms and the
next 2 s are ready 0.3 s later, so the answer plays without a hole; at the replay's default RTF 0.5
it has a ~0.6 s hole after its first 320 ms). Every answer the replay gives is
recorded speech: the three CMU ARCTIC sentences of tests/fixtures/turns/arctic, one after another
with 250 ms between them (9.3 s, 24 kHz), their words as its text. ``--repo PATH`` runs the server
of another checkout (``PATH/.venv/bin/python -m app.cli serve`` with PATH as its working directory
and ``PYTHONPATH``; this tree's interpreter when PATH has no ``.venv``), so that a "before" and an
"after" are measured in one sitting with the same client; ``--server-args`` adds serve flags.

The client is ``app.client.webrtc.RealtimeClient`` (a real aiortc peer, Opus both ways, the answer
through the client's jitter buffer) with its microphone replaced by a mixer that sends, every
20 ms in real time: the user's speech queued by the scenario, a background bed (noise, music,
babble, a distant talker), and, for the echo scenario, the answer's audio as the client received it
played back into the microphone (below). Nothing cancels echo or noise on the client.

Each session is ``server_vad`` with ``silence_duration_ms`` 500 and ``audio.input.noise_reduction``
as the mode says (``off``: null; ``near_field``/``far_field``: ``{"type": ...}``), one session per
mode, every mode's session open at once, the modes taking turns trial by trial (so that other jobs'
load falls on each alike). ``--session-extra JSON`` is merged into every session (a dict merged key
by key: ``'{"audio": {"input": {"turn_detection": {"interrupt_min_speech_ms": 300}}}}'``); nothing
else is sent. The session the server states (``session.created``) is recorded per mode: a server
that ignores noise reduction says so there (today's does: it accepts the field and keeps nothing).

Levels: dBFS is the RMS re a full scale of 1.0. Every user utterance is scaled to an active level of
-20 dBFS (the RMS of the 20 ms frames within 30 dB of its loudest; the fixtures are peak-normalized
to -3 dBFS, ~-20 dBFS active). "Audible" in the answer's audio is a received 20 ms frame with a peak
at or above -50 dBFS (-60 dBFS for first audio, as e2e_latency takes it). Times are this process's
``time.monotonic()``: when a microphone frame left the mixer for the Opus encoder, when a received
frame left the client's jitter buffer, when an event arrived on the data channel.

Scenarios (``--scenarios``), each a row of the table, one column per noise-reduction mode:

- ``backchannels``: 10 trials. The client says a question (tests/fixtures/hello.wav or
  weather.wav); 2 s after the answer's first audible frame it says a backchannel: "uh-huh",
  "yeah", "okay", "right", "I see", synthesized at run time with flite (its CMU ARCTIC voices slt,
  rms and awb; espeak-ng if flite is missing: ``apt-get install flite``). Flite and espeak-ng spell
  "mm-hmm" out letter by letter, so "uh-huh" stands for it. ``cut``: the answer's ``response.done``
  came ``cancelled`` or an ``output_audio_buffer.cleared`` named it; ``answered``: another
  ``response.created`` came after the backchannel's onset. The trial is watched until the answer
  has stopped playing (``output_audio_buffer.stopped``/``cleared``) and at least 2.5 s after the
  backchannel's last sample; then what still plays is cancelled (``response.cancel``,
  ``output_audio_buffer.clear``) and the call left quiet before the next trial. Only events that
  arrived before that cancel count.
- ``noises``: 6 trials, as above with a noise instead of a word: tests/fixtures/short_cough.wav,
  three knocks (decaying noise bursts on a 180 Hz body, 130 ms apart), typing (1.5 s of 3 ms
  clicks 70-190 ms apart), in turn. ``cut`` and ``answered`` as above.
- ``echo``: speakerphone. The client plays the answer's received audio back into its microphone:
  each received frame, 150 ms after it arrived (a FIFO; ± a frame of clock drift), convolved with a
  room's impulse response (a direct path and 200 ms of noise decaying by 60 dB, unit energy: numpy
  FFT convolution) and scaled by -12 dB, then -6 dB. No echo cancellation. 4 answers at each level:
  ``cut by echo`` counts answers cut with nobody talking over them. Then 10 interruptions at -12 dB:
  a whole ARCTIC sentence (a0009, a0007 in turn) 2 s into the answer while its echo runs;
  ``honoured``: the answer was cut after the interruption's onset (an answer its echo had cut
  before the onset is counted apart, as ``cut by echo first``).
- ``interruptions``: 10 trials, no echo: a whole ARCTIC sentence 2 s into the answer.
  ``honoured`` as above; ``stopped``: the interruption's onset (the mixer's time for the frame that
  held its first sample) to the arrival of the answer's last audible frame before the first 400 ms
  with no audible frame (and before any later response's ``output_audio_buffer.started``): median
  and p90 over the honoured trials. ``speech_started``: the onset to the first
  ``input_audio_buffer.speech_started`` that arrived after it (median, p90).
- ``noise``: nobody talks; ``--noise-seconds`` (60) of each bed: brown, pink, fan (noise low-passed
  at 300 Hz with a 100 Hz hum and its harmonics), music (piano-like triads and a bass, a chord a
  second, each note decaying), babble (6 recordings of 5 speakers summed, each looped from its own
  offset: ARCTIC a0001/a0007/a0009, LibriVox 0870, JFK, CMU Sphinx cards_005; a 300 ms room) at
  -35 and -45 dBFS, and a distant talker (ARCTIC a0001 alone, looped, through a 500 ms room) at
  -45 dBFS. The sessions say ``create_response: false`` here (nothing answers, so the VAD alone is
  measured) and the modes' sessions listen at once (they share only the server). ``turns``:
  ``input_audio_buffer.committed`` events; ``started``: ``speech_started``; ``VAD open``: the
  seconds from each ``speech_started``'s ``audio_start_ms`` to its ``speech_stopped``'s
  ``audio_end_ms``, summed (one still open at the end counts to the bed's end).
- ``speech_in_noise``: 16 finished sentences (the 8 recorded ones of tests/fixtures/turns: ARCTIC,
  LibriVox, CMU Sphinx; and 8 Flite ones, its ARCTIC voices), each followed by 2.2 s of silence,
  over a bed of brown noise, music and babble at 10 dB below the speech's active level (-30 dBFS),
  and clean; ``create_response: false``; 1.5 s of bed before the first. ``once``: sentences with
  exactly one ``committed`` arriving between their onset and the next's (the JSON adds ``split``:
  more than one, ``missed``: none, as when the bed holds the turn open through the 2.2 s that
  follow, and ``before_first``: commits in the bed before any speech); ``delay``: the last such
  commit's arrival less the sentence's end (its onset plus its manifest ``speech_end_ms``), mean
  over the sentences; ``vs clean``: the mean of (noisy - clean) over the sentences committed
  exactly once in both.
- ``latency``: 5 finished sentences, clean: the last sample sent to the first received frame with
  a peak >= -60 dBFS (e2e_latency's ``client_ms``), median; each answer is cancelled once heard.

After each trial the server's ``/metrics`` is read: the change of
``omni_rtc_false_interruptions_resumed_total``, ``omni_rtc_backchannels_ignored_total``,
``omni_rtc_echo_suppressed_seconds_total`` and ``omni_rtc_ignored_speech_total`` is added to the trial's
mode (null where the server has no such counter); the noise-only beds, heard by every mode at once,
add theirs to the modes joined (``off+near_field``), which the table leaves out.

``--trials N`` runs at most N trials of each kind (a smoke run: ``--trials 1 --noise-seconds 10``).
Next to the JSON, one PNG per scenario (``real_room_<scenario>.png``, no matplotlib here: numpy,
zlib and a 5x7 bitmap font): per mode, the trial with the most ``speech_started`` events (the first
of them), two lanes: the microphone as sent (light: everything mixed; dark: the user's own speech)
and the answer as received, 20 ms peaks from -70 to 0 dBFS, with a vertical line at each event.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import soundfile as sf
import soxr
from aiortc.mediastreams import MediaStreamError
from harness import free_port, machine, wait_until_healthy, write_report

from app.client.base import ClientError
from app.client.webrtc import MicrophoneTrack, RealtimeClient
from media.pacing import FRAME_SAMPLES, FramePacer
from media.rates import SPEECH_RATE, WIRE_RATE
from tests.vllm_omni_replay import VOICE_RATE, Pace, ReplayServer

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
TURNS = FIXTURES / "turns"
DEFAULT_OUT = REPO / "tests" / "bench" / "results" / "real_room.json"
SCENARIOS = ("backchannels", "noises", "echo", "interruptions", "noise", "speech_in_noise", "latency")
TITLES = {
    "backchannels": "backchannels over the answer",
    "noises": "coughs, knocks, typing over the answer",
    "echo": "speakerphone echo (no echo cancellation)",
    "interruptions": "real interruptions",
    "noise": "noise only, nobody talking",
    "speech_in_noise": "speech in noise, 10 dB SNR",
    "latency": "end of speech -> first audio, clean",
}
TRIALS = {"backchannels": 10, "noises": 6, "echo_turns": 4, "echo_interruptions": 10, "interruptions": 10,
          "speech_in_noise": 16, "latency": 5}

GUARD_S = 60.0  # against hangs only
USER_LEVEL_DBFS = -20.0
AUDIBLE_DBFS = -50.0
FIRST_AUDIO_DBFS = -60.0  # e2e_latency's rule
STIMULUS_AT_S = 2.0  # into the answer's received audio
OBSERVE_AFTER_S = 2.5  # after a stimulus's last sample: silence wait, VAD lag, a response.created
STOP_GAP_S = 0.4  # no audible frame this long: the answer's audio has stopped
ANSWER_GAP_S = 0.25
REPLAY_PACE = Pace(first_audio_s=0.4, real_time_factor=0.15)
ECHO_DELAY_MS = 150.0
ECHO_ROOM_MS = 200.0
ECHO_LEVELS_DB = (-12.0, -6.0)
NOISE_BEDS = (("brown", -35.0), ("brown", -45.0), ("pink", -35.0), ("pink", -45.0), ("fan", -35.0), ("fan", -45.0),
              ("music", -35.0), ("music", -45.0), ("babble", -35.0), ("babble", -45.0), ("talker", -45.0))
SNR_DB = 10.0
SIN_BEDS = ("clean", "brown", "music", "babble")
SIN_LEAD_S = 1.5
SIN_GAP_S = 2.2
QUESTIONS = ("hello.wav", "weather.wav")
ANSWER = ("turns/arctic/finished_a0001.wav", "turns/arctic/finished_a0007.wav", "turns/arctic/finished_a0009.wav")
INTERRUPTIONS = ("turns/arctic/finished_a0009.wav", "turns/arctic/finished_a0007.wav")
BACKCHANNELS = (("uh-huh", "uh huh", "slt"), ("yeah", "yeah", "rms"), ("okay", "okay", "awb"),
                ("right", "right", "slt"), ("I see", "I see", "rms"))
BABBLE = ("turns/arctic/finished_a0001.wav", "turns/arctic/finished_a0007.wav", "turns/arctic/finished_a0009.wav",
          "turns/librivox/librivox_0870.wav", "turns/jfk/jfk.wav", "turns/cmu-sphinx/cards_005.wav")
LATENCY_SENTENCES = ("turns/arctic/finished_a0009.wav", "turns/cmu-sphinx/goforward.wav",
                     "turns/arctic/finished_a0007.wav", "turns/cmu-sphinx/cards_005.wav",
                     "turns/arctic/finished_a0001.wav")
COUNTERS = {
    "false_interruptions_resumed": "omni_rtc_false_interruptions_resumed_total",
    "backchannels_ignored": "omni_rtc_backchannels_ignored_total",
    "echo_suppressed": "omni_rtc_echo_suppressed_seconds_total",
    "ignored_speech": "omni_rtc_ignored_speech_total",
}


# -- sounds ----------------------------------------------------------------------------------------

def dbfs(level: float) -> float:
    return 10 ** (level / 20)


def read_pcm(name: str | Path) -> np.ndarray:
    """A fixture as float32 mono at 16 kHz."""
    pcm, rate = sf.read(FIXTURES / name if isinstance(name, str) else name, dtype="float32", always_2d=True)
    mono = pcm[:, 0]
    return mono if rate == SPEECH_RATE else soxr.resample(mono, rate, SPEECH_RATE).astype(np.float32)


def active_rms(pcm: np.ndarray, rate: int = SPEECH_RATE) -> float:
    """RMS of the 20 ms frames within 30 dB of the loudest one."""
    step = rate // 50
    frames = pcm[: len(pcm) // step * step].reshape(-1, step)
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    if not len(rms) or rms.max() == 0:
        return 0.0
    return float(np.sqrt(np.mean(rms[rms >= rms.max() * dbfs(-30)] ** 2)))


def at_active_level(pcm: np.ndarray, level: float = USER_LEVEL_DBFS) -> np.ndarray:
    return (pcm * (dbfs(level) / max(active_rms(pcm), 1e-9))).astype(np.float32)


def at_rms(pcm: np.ndarray, level: float) -> np.ndarray:
    rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))
    return (pcm * (dbfs(level) / max(rms, 1e-12))).astype(np.float32)


def shaped_noise(seconds: float, gain: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """White noise shaped in the frequency domain by ``gain(frequencies)``, 16 kHz."""
    n = int(seconds * SPEECH_RATE)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    frequencies = np.fft.rfftfreq(n, 1 / SPEECH_RATE)
    return np.fft.irfft(spectrum * gain(np.maximum(frequencies, 1.0)), n).astype(np.float32)


def room(ms: float, rng: np.random.Generator, rate: int = SPEECH_RATE) -> np.ndarray:
    """A room's impulse response: a direct path and ``ms`` of noise decaying by 60 dB, unit energy."""
    n = int(ms * rate / 1000)
    t = np.arange(n) / rate
    ir = rng.standard_normal(n) * np.exp(-t * 6.91 / (ms / 1000)) * 0.5
    ir[0] = 1.0
    return (ir / np.sqrt(np.sum(ir**2))).astype(np.float32)


def convolve(pcm: np.ndarray, ir: np.ndarray) -> np.ndarray:
    n = len(pcm) + len(ir) - 1
    size = 1 << (n - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(pcm, size) * np.fft.rfft(ir, size), size)[: len(pcm)].astype(np.float32)


def looped(pcm: np.ndarray, samples: int, offset: int = 0) -> np.ndarray:
    reps = -(-(samples + offset) // len(pcm))
    return np.tile(pcm, reps)[offset : offset + samples]


def noise_bed(kind: str, level: float, seconds: float, seed: int = 0) -> np.ndarray:
    """A background at ``level`` dBFS RMS, 16 kHz."""
    rng = np.random.default_rng(seed)

    def highpass(f: np.ndarray) -> np.ndarray:  # no DC drift
        return 1 / (1 + (20 / f) ** 4)

    n = int(seconds * SPEECH_RATE)
    if kind == "brown":
        pcm = shaped_noise(seconds, lambda f: highpass(f) / f, rng)
    elif kind == "pink":
        pcm = shaped_noise(seconds, lambda f: highpass(f) / np.sqrt(f), rng)
    elif kind == "fan":
        body = at_rms(shaped_noise(seconds, lambda f: highpass(f) / (1 + (f / 300) ** 2), rng), -20)
        t = np.arange(n) / SPEECH_RATE
        wobble = 1 + 0.1 * np.sin(2 * np.pi * 0.5 * t)
        hum = sum(amp * np.sin(2 * np.pi * 100 * k * t + k) for k, amp in ((1, 1.0), (2, 0.5), (3, 0.25)))
        pcm = body + at_rms((hum * wobble).astype(np.float32), -26)
    elif kind == "music":
        pcm = music(seconds)
    elif kind == "babble":
        voices = []
        for index, name in enumerate(BABBLE):
            speech = at_active_level(read_pcm(name))
            speech = np.concatenate([speech, np.zeros(int(0.3 * SPEECH_RATE), np.float32)])
            voices.append(looped(speech, n, int(rng.integers(len(speech))) if index else 0))
        pcm = convolve(np.sum(voices, axis=0).astype(np.float32), room(300, rng))
    elif kind == "talker":
        speech = np.concatenate([at_active_level(read_pcm(ANSWER[0])), np.zeros(int(0.8 * SPEECH_RATE), np.float32)])
        pcm = convolve(looped(speech, n), room(500, rng))
    else:
        raise ValueError(kind)
    return at_rms(pcm[:n], level)


def music(seconds: float) -> np.ndarray:
    """Triads and a bass, a chord a second, each note struck and decaying (harmonics 1-5)."""
    n = int(seconds * SPEECH_RATE)
    out = np.zeros(n, np.float32)
    chords = ((60, 64, 67), (55, 59, 62), (57, 60, 64), (53, 57, 60))  # C G Am F (MIDI)
    length = SPEECH_RATE
    t = np.arange(length) / SPEECH_RATE
    envelope = np.minimum(t / 0.01, 1.0) * np.exp(-t / 0.35)
    for start in range(0, n, length):
        chord = chords[(start // length) % len(chords)]
        note = np.zeros(length)
        for midi in (*chord, chord[0] - 12):
            f0 = 440 * 2 ** ((midi - 69) / 12)
            note += sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6) if f0 * k < SPEECH_RATE / 2)
        piece = (note * envelope).astype(np.float32)[: n - start]
        out[start : start + len(piece)] += piece
    return out


def knocks(rng: np.random.Generator) -> np.ndarray:
    """Three knocks on a table: decaying noise bursts on a 180 Hz body, 130 ms apart."""
    one_n = int(0.08 * SPEECH_RATE)
    t = np.arange(one_n) / SPEECH_RATE
    out = np.zeros(int(0.45 * SPEECH_RATE), np.float32)
    for index in range(3):
        burst = rng.standard_normal(one_n) * np.exp(-t / 0.006) + 2 * np.sin(2 * np.pi * 180 * t) * np.exp(-t / 0.02)
        start = int(index * 0.13 * SPEECH_RATE)
        out[start : start + one_n] += burst.astype(np.float32)
    return (out / np.abs(out).max() * dbfs(-6)).astype(np.float32)


def typing(rng: np.random.Generator) -> np.ndarray:
    """1.5 s of keys: 3 ms clicks (high-passed noise, decaying) 70-190 ms apart."""
    out = np.zeros(int(1.5 * SPEECH_RATE), np.float32)
    click_n = int(0.003 * SPEECH_RATE)
    decay = np.exp(-np.arange(click_n) / (0.001 * SPEECH_RATE))
    at = 0.0
    while at < 1.45:
        click = np.diff(rng.standard_normal(click_n + 1)) * decay * rng.uniform(0.5, 1.0)
        start = int(at * SPEECH_RATE)
        out[start : start + click_n] += click[: len(out) - start].astype(np.float32)
        at += rng.uniform(0.07, 0.19)
    return (out / np.abs(out).max() * dbfs(-12)).astype(np.float32)


def backchannels(scratch: Path) -> list[tuple[str, np.ndarray]]:
    """The backchannel words, synthesized now (flite, else espeak-ng), trimmed, at the user's level."""
    flite, espeak = shutil.which("flite"), shutil.which("espeak-ng")
    if flite is None and espeak is None:
        raise SystemExit("the backchannels need flite or espeak-ng (Debian: apt-get install flite)")
    words = []
    for name, text, voice in BACKCHANNELS:
        path = scratch / f"{voice}_{name.replace(' ', '_')}.wav"
        if flite is not None:
            command = [flite, "-voice", voice, "-t", text, "-o", str(path)]
        else:
            command = [str(espeak), "-w", str(path), text]
        subprocess.run(command, check=True, capture_output=True)
        words.append((name, at_active_level(trimmed(read_pcm(path)))))
    return words


def trimmed(pcm: np.ndarray) -> np.ndarray:
    """Without the leading and trailing frames more than 40 dB below the loudest."""
    step = SPEECH_RATE // 100
    frames = pcm[: len(pcm) // step * step].reshape(-1, step)
    loud = np.flatnonzero(np.abs(frames).max(axis=1) >= np.abs(pcm).max() * dbfs(-40))
    return pcm[loud[0] * step : (loud[-1] + 1) * step] if len(loud) else pcm


def answer_speech() -> tuple[np.ndarray, str]:
    """The replay's answer: the ARCTIC sentences with 250 ms between them, 24 kHz, and their words."""
    manifest = {entry["file"]: entry for entry in json.loads((TURNS / "manifest.json").read_text())}
    gap = np.zeros(int(ANSWER_GAP_S * SPEECH_RATE), np.float32)
    parts: list[np.ndarray] = []
    for name in ANSWER:
        parts += [read_pcm(name), gap]
    pcm = np.concatenate(parts[:-1])
    text = " ".join(manifest[name.removeprefix("turns/")]["text"] for name in ANSWER)
    return soxr.resample(pcm, SPEECH_RATE, VOICE_RATE).astype(np.float32), text


def speech_in_noise_sentences() -> list[tuple[str, np.ndarray, float]]:
    """(name, speech at the user's level, its end in seconds) for the 16 finished sentences."""
    manifest = json.loads((TURNS / "manifest.json").read_text())
    recorded = [e for e in manifest if e["family"] == "recorded" and e["kind"] == "finished"]
    flite = list({e["text"]: e for e in reversed(manifest)
                  if e["family"] == "flite" and e["kind"] == "finished"}.values())[::-1]  # one voice a sentence
    chosen = recorded[:8] + flite[: 16 - len(recorded[:8])]
    return [(e["file"], at_active_level(read_pcm(TURNS / e["file"])),
             e.get("speech_end_ms", 0) / 1000 or len(read_pcm(TURNS / e["file"])) / SPEECH_RATE) for e in chosen]


def to_wire(pcm16k: np.ndarray) -> np.ndarray:
    return soxr.resample(np.asarray(pcm16k, np.float32), SPEECH_RATE, WIRE_RATE).astype(np.float32)


# -- the client ------------------------------------------------------------------------------------

@dataclass
class Utterance:
    """Audio queued on the microphone: when its first and its last sample left the mixer."""

    pcm: np.ndarray
    started: asyncio.Future[float]
    done: asyncio.Future[float]
    sent: int = 0


class EchoPath:
    """The answer as the client heard it, back into its microphone: a FIFO of ``delay_ms``, a room's
    impulse response (FFT overlap-add), a gain."""

    def __init__(self, gain_db: float, delay_ms: float = ECHO_DELAY_MS, room_ms: float = ECHO_ROOM_MS) -> None:
        self.gain_db = gain_db
        self._gain = dbfs(gain_db)
        self._ir = room(room_ms, np.random.default_rng(7), WIRE_RATE)
        self._size = 1 << (FRAME_SAMPLES + len(self._ir) - 2).bit_length()
        self._ir_spectrum = np.fft.rfft(self._ir, self._size)
        self._tail = np.zeros(len(self._ir) - 1, np.float32)
        self._delay = int(delay_ms * WIRE_RATE / 1000)
        self._fifo = np.zeros(self._delay, np.float32)
        self.dropped = 0  # samples dropped to keep the delay (the two clocks drift apart)

    def push(self, heard: np.ndarray) -> None:
        if not len(heard):
            return
        wet = np.fft.irfft(np.fft.rfft(heard, self._size) * self._ir_spectrum, self._size)[: len(heard) + len(self._tail)]
        wet[: len(self._tail)] += self._tail
        self._tail = wet[len(heard) :].astype(np.float32)
        self._fifo = np.concatenate([self._fifo, (wet[: len(heard)] * self._gain).astype(np.float32)])

    def pull(self, samples: int) -> np.ndarray:
        excess = len(self._fifo) - (self._delay + 3 * FRAME_SAMPLES)
        if excess > 0:
            self._fifo = self._fifo[excess:]
            self.dropped += excess
        out = self._fifo[:samples]
        self._fifo = self._fifo[samples:]
        return np.pad(out, (0, samples - len(out)))


class Bed:
    """A background looped from its start, at 48 kHz."""

    def __init__(self, name: str, pcm16k: np.ndarray) -> None:
        self.name = name
        self._pcm = to_wire(pcm16k)
        self._at = 0

    def next(self, samples: int) -> np.ndarray:
        out = looped(self._pcm, samples, self._at)
        self._at = (self._at + samples) % len(self._pcm)
        return out


@dataclass
class MicFrame:
    at: float  # monotonic: the frame left the mixer
    peak: float  # everything mixed
    speech_peak: float  # the user's own speech


class RoomMicrophone(MicrophoneTrack):
    """The microphone in the room: queued speech + a bed + the answer's echo, 20 ms in real time.
    Its log holds every frame sent (its time and peaks)."""

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[Utterance] = deque()
        self._room_pacer = FramePacer()
        self.bed: Bed | None = None
        self.echo: EchoPath | None = None
        self.heard: Callable[[], np.ndarray] | None = None  # the answer received since the last call
        self.log: list[MicFrame] = []

    @property
    def queued_until_ms(self) -> float:
        queued = sum(len(u.pcm) - u.sent for u in self._queue)
        return (self._room_pacer.pts + queued) * 1000 / WIRE_RATE

    def say(self, pcm16k: np.ndarray) -> Utterance:
        if self.readyState != "live":
            raise ClientError("the microphone track has ended")
        loop = asyncio.get_running_loop()
        utterance = Utterance(to_wire(pcm16k), loop.create_future(), loop.create_future())
        self._queue.append(utterance)
        return utterance

    def play(self, pcm48k: np.ndarray) -> asyncio.Future[float]:
        loop = asyncio.get_running_loop()
        utterance = Utterance(np.asarray(pcm48k, np.float32), loop.create_future(), loop.create_future())
        self._queue.append(utterance)
        return utterance.done

    def stop(self) -> None:
        super().stop()
        for utterance in self._queue:
            for future in (utterance.started, utterance.done):
                if not future.done():
                    future.set_exception(ClientError("the microphone track ended"))

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._room_pacer.wait_until_due()
        now = time.monotonic()
        speech = np.zeros(FRAME_SAMPLES, np.float32)
        filled = 0
        while filled < FRAME_SAMPLES and self._queue:
            head = self._queue[0]
            if head.sent == 0 and not head.started.done():
                head.started.set_result(now)
            take = min(FRAME_SAMPLES - filled, len(head.pcm) - head.sent)
            speech[filled : filled + take] = head.pcm[head.sent : head.sent + take]
            filled += take
            head.sent += take
            if head.sent == len(head.pcm):
                self._queue.popleft()
                if not head.done.done():
                    head.done.set_result(now)
        mixed = speech.copy()
        if self.bed is not None:
            mixed += self.bed.next(FRAME_SAMPLES)
        heard = self.heard() if self.heard is not None else np.zeros(0, np.float32)
        if self.echo is not None:
            self.echo.push(heard)
            mixed += self.echo.pull(FRAME_SAMPLES)
        self.log.append(MicFrame(now, float(np.abs(mixed).max()), float(np.abs(speech).max())))
        return self._room_pacer.frame((np.clip(mixed, -1.0, 1.0) * 32767).astype(np.int16))


class RoomClient(RealtimeClient):
    """A ``RealtimeClient`` whose microphone is the room's."""

    def __init__(self, url: str, session: dict[str, Any]) -> None:
        super().__init__(url, ice_loopback=True, session=session, timeout_s=GUARD_S)
        self.mic = RoomMicrophone()
        self._microphone = self.mic
        self._heard_mark = 0
        self.mic.heard = self._heard_since_last

    def _heard_since_last(self) -> np.ndarray:
        audio = self.audio_since(self._heard_mark)
        self._heard_mark = self.frames_received
        return audio

    def arrivals(self, start: int = 0) -> list[tuple[float, dict[str, Any]]]:
        return list(zip(self.event_arrivals[start:], self.events[start:], strict=True))


async def until(test: Callable[[], bool], timeout_s: float = GUARD_S, poll_s: float = 0.01) -> None:
    async with asyncio.timeout(timeout_s):
        while not test():
            await asyncio.sleep(poll_s)


async def first_audible(client: RoomClient, frame: int, after: float, level_dbfs: float = FIRST_AUDIO_DBFS,
                        timeout_s: float = GUARD_S) -> float | None:
    """The arrival of the first received frame from ``frame`` on that arrived at or after ``after``
    with a peak at or above ``level_dbfs`` (each frame looked at once); None past ``timeout_s``."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        for received in client.frames_since(frame):
            frame += 1
            if received.arrived_at >= after and received.peak >= dbfs(level_dbfs):
                return received.arrived_at
        await asyncio.sleep(0.01)
    return None


def response_state(client: RoomClient) -> tuple[set[str], set[str]]:
    """(responses created and not done, responses whose audio is playing)."""
    active: set[str] = set()
    playing: set[str] = set()
    for event in client.events:
        kind = event.get("type")
        if kind == "response.created":
            active.add(event["response"]["id"])
        elif kind == "response.done":
            active.discard(event["response"]["id"])
        elif kind == "output_audio_buffer.started":
            playing.add(event["response_id"])
        elif kind in ("output_audio_buffer.stopped", "output_audio_buffer.cleared"):
            playing.discard(event["response_id"])
    return active, playing


async def quiet(client: RoomClient, settle_s: float = 0.8) -> None:
    """Cancels whatever still answers or plays, then waits until nothing has come for ``settle_s``
    and nothing audible for as long."""
    client.mic.echo = None
    client.mic.bed = None
    cancelled: set[str] = set()
    cleared: set[str] = set()
    give_up = time.monotonic() + GUARD_S
    while time.monotonic() < give_up:
        active, playing = response_state(client)
        for response_id in active - cancelled:
            await client.send({"type": "response.cancel", "response_id": response_id})
            cancelled.add(response_id)
        for response_id in playing - cleared:
            await client.send({"type": "output_audio_buffer.clear"})
            cleared.add(response_id)
        now = time.monotonic()
        last_event = client.event_arrivals[-1] if client.event_arrivals else 0.0
        recent = client.frames_since(max(0, client.frames_received - int(settle_s * 50)))
        if (not active and not playing and now - last_event >= settle_s
                and all(frame.peak < dbfs(FIRST_AUDIO_DBFS) for frame in recent)):
            return
        await asyncio.sleep(0.05)
    raise ClientError(f"the call did not go quiet in {GUARD_S:g} s")


# -- the server ------------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})? (?P<value>\S+)$')


def counters(url: str) -> dict[str, float | None]:
    """The room counters from ``/metrics`` summed over their labels; None for one the server lacks."""
    values: dict[str, float | None] = dict.fromkeys(COUNTERS)
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return values
    names = {metric: key for key, metric in COUNTERS.items()}
    for line in text.splitlines():
        sample = _SAMPLE.match(line)
        if sample is not None and sample["name"] in names:
            key = names[sample["name"]]
            values[key] = (values[key] or 0.0) + float(sample["value"])
    return values


def counter_change(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, float | None]:
    change: dict[str, float | None] = {}
    for key, value in after.items():
        change[key] = None if value is None else value - (before[key] or 0.0)
    return change


@contextlib.contextmanager
def serve(repo: Path, engine_url: str, extra: list[str]) -> Iterator[str]:
    """``omni-rtc serve`` from ``repo`` on a free loopback port against ``engine_url``; its URL once healthy."""
    python = repo / ".venv" / "bin" / "python"
    port = free_port()
    command = [str(python) if python.exists() else sys.executable, "-m", "app.cli", "serve", "--port", str(port),
               "--engine-url", engine_url, "--ice-loopback", "--log-level", "warning", *extra]
    server = subprocess.Popen(command, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, server, deadline_s=180)
        yield url
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def checkout(repo: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        return result.stdout.strip()
    return {"path": str(repo), "commit": git("rev-parse", "HEAD") or None, "branch": git("branch", "--show-current"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


# -- trials ----------------------------------------------------------------------------------------

@dataclass
class Trace:
    """A trial's span of one call: its events, microphone frames and received frames, for the plot."""

    mode: str
    label: str
    t0: float
    t1: float = 0.0
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (time, type, detail)
    mic: list[MicFrame] = field(default_factory=list)
    heard: list[tuple[float, float]] = field(default_factory=list)  # (arrival, peak)
    marks: list[tuple[float, str]] = field(default_factory=list)  # the client's own: onsets


@dataclass
class Mark:
    """Where a trial began in a call's records."""

    event: int
    frame: int
    mic: int
    at: float

    @classmethod
    def now(cls, client: RoomClient) -> Mark:
        return cls(len(client.events), client.frames_received, len(client.mic.log), time.monotonic())


def trace(client: RoomClient, mark: Mark, mode: str, label: str, marks: list[tuple[float, str]]) -> Trace:
    t1 = time.monotonic()
    out = Trace(mode, label, mark.at, t1, marks=marks)
    for at, event in client.arrivals(mark.event):
        if at > t1:
            break
        kind = event.get("type", "")
        detail = ""
        if kind == "response.done":
            detail = event["response"]["status"]
        out.events.append((at, kind, detail))
    out.mic = [frame for frame in client.mic.log[mark.mic :] if frame.at <= t1]
    out.heard = [(frame.arrived_at, frame.peak) for frame in client.frames_since(mark.frame) if frame.arrived_at <= t1]
    return out


def rel(value: float | None, origin: float) -> float | None:
    return None if value is None else round((value - origin) * 1000, 1)


async def answer_trial(client: RoomClient, mode: str, label: str, question: np.ndarray,
                       stimulus: np.ndarray | None, echo: EchoPath | None = None) -> tuple[dict[str, Any], Trace]:
    """A question, its answer, and ``stimulus`` said 2 s into the answer's received audio (none: the
    answer plays out alone). What happened to the answer, on this call's events."""
    mark = Mark.now(client)
    client.mic.echo = echo
    asked = client.mic.say(question)
    asked_at = await asked.done
    created = await client.wait_for("response.created", start=mark.event)
    answer_id = created["response"]["id"]
    started = await client.wait_for(lambda e: e.get("type") == "output_audio_buffer.started"
                                    and e.get("response_id") == answer_id, start=mark.event)
    started_at = client.event_arrivals[client.events.index(started)]
    first_audio_at = await first_audible(client, mark.frame, min(asked_at, started_at))
    if first_audio_at is None:
        raise ClientError(f"{label}: the answer {answer_id} was never heard")
    onset = stimulus_end = None
    marks: list[tuple[float, str]] = [(asked_at, "asked"), (first_audio_at, "first audio")]
    if stimulus is not None:
        await asyncio.sleep(max(0.0, first_audio_at + STIMULUS_AT_S - time.monotonic()))
        said = client.mic.say(stimulus)
        onset = await said.started
        stimulus_end = await said.done
        marks.append((onset, "onset"))

    def answer_over() -> bool:
        ended = any(e.get("type") in ("output_audio_buffer.stopped", "output_audio_buffer.cleared")
                    and e.get("response_id") == answer_id for e in client.events[mark.event :])
        return ended and (stimulus_end is None or time.monotonic() >= stimulus_end + OBSERVE_AFTER_S)

    await until(answer_over)
    if stimulus is None:
        await asyncio.sleep(OBSERVE_AFTER_S)  # a response its echo caused
    window = trace(client, mark, mode, label, marks)
    row = judge_answer(client, mark, window.t1, answer_id, first_audio_at, onset, stimulus_end)
    row |= {"trial": label, "asked_at_ms": rel(asked_at, mark.at), "first_audio_ms": rel(first_audio_at, mark.at)}
    if echo is not None:
        row["echo_samples_dropped"] = echo.dropped
    await quiet(client)
    return row, window


def judge_answer(client: RoomClient, mark: Mark, t1: float, answer_id: str, first_audio_at: float,
                 onset: float | None, stimulus_end: float | None) -> dict[str, Any]:
    events = [(at, e) for at, e in client.arrivals(mark.event) if at <= t1]
    cut_at = next((at for at, e in events if (e.get("type") == "response.done" and e["response"]["id"] == answer_id
                                               and e["response"]["status"] == "cancelled")
                   or (e.get("type") == "output_audio_buffer.cleared" and e.get("response_id") == answer_id)), None)
    since = onset if onset is not None else first_audio_at
    others = [e["response"]["id"] for at, e in events
              if e.get("type") == "response.created" and e["response"]["id"] != answer_id and at >= since]
    speech_started = [at for at, e in events if e.get("type") == "input_audio_buffer.speech_started" and at >= since]
    reason = next((e["response"].get("status_details") for _, e in events if e.get("type") == "response.done"
                   and e["response"]["id"] == answer_id), None)
    row: dict[str, Any] = {
        "response_id": answer_id,
        "cut": cut_at is not None,
        "cut_before_onset": cut_at is not None and onset is not None and cut_at < onset,
        "cut_ms": rel(cut_at, since),
        "status_details": reason,
        "answered": len(others),
        "speech_started": len(speech_started),
        "committed": sum(1 for at, e in events if e.get("type") == "input_audio_buffer.committed" and at >= since),
        "onset_ms": rel(onset, mark.at),
        "stimulus_end_ms": rel(stimulus_end, mark.at),
        "speech_started_ms": rel(speech_started[0], onset) if speech_started and onset is not None else None,
        "audio_stopped_ms": None,
    }
    if onset is not None:
        next_start = next((at for at, e in events if e.get("type") == "output_audio_buffer.started"
                           and e.get("response_id") != answer_id and at >= onset), t1)
        frames = [f for f in client.frames_since(mark.frame) if onset <= f.arrived_at <= next_start]
        last_audible, run_from = None, None
        for frame in frames:
            if frame.peak >= dbfs(AUDIBLE_DBFS):
                last_audible, run_from = frame.arrived_at, None
            else:
                run_from = run_from or frame.arrived_at
                if run_from is not None and frame.arrived_at - run_from >= STOP_GAP_S:
                    break
        row["audio_stopped_ms"] = rel(last_audible, onset)
    return row


@dataclass
class Call:
    """One mode's session on the server."""

    mode: str
    client: RoomClient
    stated: dict[str, Any]


def mode_session(mode: str, extra: dict[str, Any], *, create_response: bool = True) -> dict[str, Any]:
    turn_detection: dict[str, Any] = {"type": "server_vad", "silence_duration_ms": 500}
    if not create_response:
        turn_detection["create_response"] = False
    session = {"type": "realtime", "audio": {"input": {
        "turn_detection": turn_detection, "noise_reduction": None if mode == "off" else {"type": mode}}}}
    return merged(session, extra)


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@contextlib.asynccontextmanager
async def calls(url: str, modes: list[str], extra: dict[str, Any], **session: bool) -> Any:
    async with contextlib.AsyncExitStack() as stack:
        opened = []
        for mode in modes:
            client = await stack.enter_async_context(RoomClient(url, mode_session(mode, extra, **session)))
            stated = next(e for e in client.events if e["type"] == "session.created")["session"]
            opened.append(Call(mode, client, stated))
        await asyncio.gather(*(quiet(call.client) for call in opened))
        yield opened


class Run:
    """The run's state: the server, the sounds, the results and plots."""

    def __init__(self, args: argparse.Namespace, url: str, scratch: Path) -> None:
        self.args = args
        self.url = url
        self.modes: list[str] = args.noise_reduction
        self.extra: dict[str, Any] = args.session_extra
        self.rng = np.random.default_rng(0)
        self.questions = [at_active_level(read_pcm(name)) for name in QUESTIONS]
        self.interrupting = [(name, at_active_level(read_pcm(name))) for name in INTERRUPTIONS]
        self.scratch = scratch
        self.results: dict[str, Any] = {}
        self.traces: dict[str, list[Trace]] = {}
        self.stated: dict[str, Any] = {}
        self.seconds: dict[str, float] = {}  # each scenario's wall time
        self.counters: dict[str, dict[str, float | None]] = {mode: dict.fromkeys(COUNTERS) for mode in self.modes}

    def trials(self, kind: str) -> int:
        return min(TRIALS[kind], self.args.trials) if self.args.trials else TRIALS[kind]

    def count(self, mode: str, change: dict[str, float | None]) -> None:
        mine = self.counters.setdefault(mode, dict.fromkeys(COUNTERS))
        for key, value in change.items():
            if value is not None:
                mine[key] = (mine[key] or 0.0) + value

    async def metered(self, mode: str, work: Any) -> Any:
        before = await asyncio.to_thread(counters, self.url)
        result = await work
        self.count(mode, counter_change(before, await asyncio.to_thread(counters, self.url)))
        return result

    def keep(self, scenario: str, window: Trace) -> None:
        self.traces.setdefault(scenario, []).append(window)

    async def answer_trials(self, scenario: str, stimuli: list[tuple[str, np.ndarray | None]],
                            echo_db: float | None = None) -> dict[str, list[dict[str, Any]]]:
        rows: dict[str, list[dict[str, Any]]] = {mode: [] for mode in self.modes}
        async with calls(self.url, self.modes, self.extra) as opened:
            for call in opened:
                self.stated[call.mode] = call.stated
            for index, (name, stimulus) in enumerate(stimuli):
                for call in opened:
                    echo = None if echo_db is None else EchoPath(echo_db)
                    label = f"{scenario} {index + 1}: {name}"
                    row, window = await self.metered(call.mode, answer_trial(
                        call.client, call.mode, label, self.questions[index % len(self.questions)], stimulus, echo))
                    row["stimulus"] = name
                    rows[call.mode].append(row)
                    self.keep(scenario, window)
                    print(f"  {call.mode:<11} {label:<42} cut {row['cut']!s:<5} answered {row['answered']} "
                          f"speech_started {row['speech_started']} stopped {row['audio_stopped_ms']} ms", flush=True)
        return rows

    async def backchannels(self) -> dict[str, Any]:
        words = backchannels(self.scratch)
        stimuli: list[tuple[str, np.ndarray | None]] = [
            words[i % len(words)] for i in range(self.trials("backchannels"))]
        rows = await self.answer_trials("backchannels", stimuli)
        return {"trials": rows, "summary": {mode: answer_summary(r) for mode, r in rows.items()}}

    async def noises(self) -> dict[str, Any]:
        sounds = [("cough", read_pcm("short_cough.wav")), ("knocks", knocks(self.rng)), ("typing", typing(self.rng))]
        stimuli: list[tuple[str, np.ndarray | None]] = [
            sounds[i % len(sounds)] for i in range(self.trials("noises"))]
        rows = await self.answer_trials("noises", stimuli)
        return {"trials": rows, "summary": {mode: answer_summary(r) for mode, r in rows.items()}}

    async def echo(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for level in ECHO_LEVELS_DB:
            rows = await self.answer_trials("echo", [(f"echo {level:g} dB", None)] * self.trials("echo_turns"),
                                            echo_db=level)
            out[f"echo {level:g} dB"] = {"trials": rows, "summary": {m: answer_summary(r) for m, r in rows.items()}}
        level = ECHO_LEVELS_DB[0]
        stimuli: list[tuple[str, np.ndarray | None]] = [
            (f"{self.interrupting[i % 2][0].rsplit('/', 1)[-1]} over echo {level:g} dB", self.interrupting[i % 2][1])
            for i in range(self.trials("echo_interruptions"))]
        rows = await self.answer_trials("echo", stimuli, echo_db=level)
        out[f"interruptions over echo {level:g} dB"] = {
            "trials": rows, "summary": {m: answer_summary(r) for m, r in rows.items()}}
        return out

    async def interruptions(self) -> dict[str, Any]:
        stimuli: list[tuple[str, np.ndarray | None]] = [
            (self.interrupting[i % 2][0].rsplit("/", 1)[-1], self.interrupting[i % 2][1])
            for i in range(self.trials("interruptions"))]
        rows = await self.answer_trials("interruptions", stimuli)
        return {"trials": rows, "summary": {mode: answer_summary(r) for mode, r in rows.items()}}

    async def noise(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        seconds = self.args.noise_seconds
        async with calls(self.url, self.modes, self.extra, create_response=False) as opened:
            for kind, level in NOISE_BEDS:
                name = f"{kind} {level:g} dBFS"
                bed = noise_bed(kind, level, min(seconds, 30.0))
                results = await self.metered("+".join(self.modes), asyncio.gather(
                    *(self.listen(call, name, bed, seconds) for call in opened)))
                out[name] = {call.mode: result for call, result in zip(opened, results, strict=True)}
                print(f"  {name:<20}" + "".join(f"{call.mode:>12}: {r['committed']} turns, {r['vad_open_s']} s open"
                                                for call, r in zip(opened, results, strict=True)), flush=True)
        return {"beds": out}

    async def listen(self, call: Call, name: str, bed: np.ndarray, seconds: float) -> dict[str, Any]:
        client = call.client
        mark = Mark.now(client)
        client.mic.bed = Bed(name, bed)
        await asyncio.sleep(seconds)
        client.mic.bed = None
        bed_end = time.monotonic()
        await asyncio.sleep(1.5)
        window = trace(client, mark, call.mode, f"noise: {name}", [(bed_end, "bed ends")])
        self.keep("noise", window)
        events = client.arrivals(mark.event)
        started = {e["item_id"]: (at, e) for at, e in events if e.get("type") == "input_audio_buffer.speech_started"}
        stopped = {e["item_id"]: e for _, e in events if e.get("type") == "input_audio_buffer.speech_stopped"}
        open_s = 0.0
        for item, (at, event) in started.items():
            if item in stopped:
                open_s += (stopped[item]["audio_end_ms"] - event["audio_start_ms"]) / 1000
            else:
                open_s += max(0.0, bed_end - at)
        await quiet(client)
        return {"speech_started": len(started),
                "committed": sum(1 for _, e in events if e.get("type") == "input_audio_buffer.committed"),
                "vad_open_s": round(open_s, 2), "seconds": seconds}

    async def speech_in_noise(self) -> dict[str, Any]:
        sentences = speech_in_noise_sentences()[: self.trials("speech_in_noise")]
        level = USER_LEVEL_DBFS - SNR_DB
        out: dict[str, Any] = {}
        async with calls(self.url, self.modes, self.extra, create_response=False) as opened:
            for kind in SIN_BEDS:
                length = sum(len(s) for _, s, _ in sentences) / SPEECH_RATE + SIN_GAP_S * len(sentences) + 5
                bed = None if kind == "clean" else noise_bed(kind, level, min(length, 60.0), seed=1)
                for call in opened:
                    result = await self.metered(call.mode, self.sentences(call, kind, bed, sentences))
                    out.setdefault(kind, {})[call.mode] = result
                    print(f"  {kind:<8} {call.mode:<11} once {result['once']}/{len(sentences)}, mean delay "
                          f"{result['mean_delay_ms']} ms", flush=True)
        for kind in SIN_BEDS[1:]:
            for mode in self.modes:
                if kind in out:
                    out[kind][mode]["vs_clean_ms"] = vs_clean(out[kind][mode]["sentences"], out["clean"][mode]["sentences"])
        return {"snr_db": SNR_DB, "bed_level_dbfs": level, "beds": out}

    async def sentences(self, call: Call, kind: str, bed: np.ndarray | None,
                        sentences: list[tuple[str, np.ndarray, float]]) -> dict[str, Any]:
        client = call.client
        mark = Mark.now(client)
        if bed is not None:
            client.mic.bed = Bed(kind, bed)
        await asyncio.sleep(SIN_LEAD_S)
        spoken: list[tuple[str, float, float]] = []  # name, onset, end of speech
        for name, speech, end_s in sentences:
            said = client.mic.say(speech)
            onset = await said.started
            await said.done
            spoken.append((name, onset, onset + end_s))
            await asyncio.sleep(SIN_GAP_S)
        client.mic.bed = None
        marks = [(onset, name.rsplit("/", 1)[-1].removesuffix(".wav")) for name, onset, _ in spoken]
        window = trace(client, mark, call.mode, f"speech in noise: {kind}", marks)
        self.keep("speech_in_noise", window)
        commits = [at for at, e in client.arrivals(mark.event) if e.get("type") == "input_audio_buffer.committed"]
        rows: list[dict[str, Any]] = []
        for index, (name, onset, end) in enumerate(spoken):
            until_at = spoken[index + 1][1] if index + 1 < len(spoken) else window.t1
            mine = [at for at in commits if onset <= at < until_at]
            rows.append({"sentence": name, "commits": len(mine), "delay_ms": rel(mine[-1], end) if mine else None})
        await quiet(client)
        delays = [r["delay_ms"] for r in rows if r["delay_ms"] is not None]
        return {"once": sum(r["commits"] == 1 for r in rows), "missed": sum(r["commits"] == 0 for r in rows),
                "split": sum(r["commits"] > 1 for r in rows),
                "before_first": sum(1 for at in commits if at < spoken[0][1]) if spoken else 0,
                "mean_delay_ms": round(statistics.mean(delays), 1) if delays else None, "sentences": rows}

    async def latency(self) -> dict[str, Any]:
        rows: dict[str, list[dict[str, Any]]] = {mode: [] for mode in self.modes}
        names = [LATENCY_SENTENCES[i % len(LATENCY_SENTENCES)] for i in range(self.trials("latency"))]
        async with calls(self.url, self.modes, self.extra) as opened:
            for name in names:
                speech = at_active_level(read_pcm(name))
                for call in opened:
                    row = await self.metered(call.mode, self.first_audio(call, name, speech))
                    rows[call.mode].append(row)
                    print(f"  {call.mode:<11} {name:<40} {row['first_audio_ms']} ms", flush=True)
        summary = {}
        for mode, mode_rows in rows.items():
            values = [r["first_audio_ms"] for r in mode_rows if r["first_audio_ms"] is not None]
            summary[mode] = {"median_ms": round(statistics.median(values), 1) if values else None,
                             "p90_ms": percentile(values, 0.9), "turns": len(mode_rows)}
        return {"trials": rows, "summary": summary}

    async def first_audio(self, call: Call, name: str, speech: np.ndarray) -> dict[str, Any]:
        client = call.client
        mark = Mark.now(client)
        said = client.mic.say(speech)
        spoken_at = await said.done
        heard_at = await first_audible(client, mark.frame, spoken_at, timeout_s=20.0)
        window = trace(client, mark, call.mode, f"latency: {name}", [(spoken_at, "end of speech")])
        self.keep("latency", window)
        await quiet(client)
        return {"sentence": name, "first_audio_ms": rel(heard_at, spoken_at)}


def vs_clean(noisy: list[dict[str, Any]], clean: list[dict[str, Any]]) -> float | None:
    differences = [n["delay_ms"] - c["delay_ms"] for n, c in zip(noisy, clean, strict=True)
                   if n["commits"] == 1 and c["commits"] == 1]
    return round(statistics.mean(differences), 1) if differences else None


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


def answer_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    honoured = [r for r in rows if r["cut"] and not r["cut_before_onset"]]
    stopped = [r["audio_stopped_ms"] for r in honoured if r["audio_stopped_ms"] is not None]
    started = [r["speech_started_ms"] for r in rows if r["speech_started_ms"] is not None]
    return {
        "trials": len(rows),
        "cut": sum(r["cut"] for r in rows),
        "cut_before_onset": sum(r["cut_before_onset"] for r in rows),
        "honoured": len(honoured),
        "answered": sum(r["answered"] > 0 for r in rows),
        "stopped_ms": {"p50": round(statistics.median(stopped), 1) if stopped else None, "p90": percentile(stopped, 0.9)},
        "speech_started_ms": {"p50": round(statistics.median(started), 1) if started else None,
                              "p90": percentile(started, 0.9)},
    }


# -- the table -------------------------------------------------------------------------------------

def table(results: dict[str, Any], modes: list[str], counters_by_mode: dict[str, dict[str, float | None]]) -> str:
    lines = ["| scenario | measure | " + " | ".join(f"noise reduction {m}" for m in modes) + " |",
             "|---|---|" + "---|" * len(modes)]

    def row(scenario: str, measure: str, cells: list[str]) -> None:
        lines.append(f"| {scenario} | {measure} | " + " | ".join(cells) + " |")

    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:g}"

    for scenario in ("backchannels", "noises"):
        if scenario in results:
            s = results[scenario]["summary"]
            row(TITLES[scenario], "answers cut", [f"{s[m]['cut']}/{s[m]['trials']}" for m in modes])
            row("", "answered as a turn", [f"{s[m]['answered']}/{s[m]['trials']}" for m in modes])
    if "echo" in results:
        for name, part in results["echo"].items():
            s = part["summary"]
            if name.startswith("interruptions"):
                row(name, "honoured (cut by echo first)",
                    [f"{s[m]['honoured']}/{s[m]['trials']} ({s[m]['cut_before_onset']})" for m in modes])
            else:
                row(name, "answers cut by their echo", [f"{s[m]['cut']}/{s[m]['trials']}" for m in modes])
                row("", "responses to the echo", [f"{s[m]['answered']}/{s[m]['trials']}" for m in modes])
    if "interruptions" in results:
        s = results["interruptions"]["summary"]
        row(TITLES["interruptions"], "honoured", [f"{s[m]['honoured']}/{s[m]['trials']}" for m in modes])
        row("", "onset -> answer audio stopped, p50 / p90 ms",
            [f"{ms(s[m]['stopped_ms']['p50'])} / {ms(s[m]['stopped_ms']['p90'])}" for m in modes])
        row("", "onset -> speech_started, p50 / p90 ms",
            [f"{ms(s[m]['speech_started_ms']['p50'])} / {ms(s[m]['speech_started_ms']['p90'])}" for m in modes])
    if "noise" in results:
        for name, by_mode in results["noise"]["beds"].items():
            row(f"noise only: {name}", "turns committed; VAD open s",
                [f"{by_mode[m]['committed']}; {by_mode[m]['vad_open_s']:g}" for m in modes])
    if "speech_in_noise" in results:
        beds = results["speech_in_noise"]["beds"]
        for kind, by_mode in beds.items():
            measure = "committed once; mean delay ms" + ("" if kind == "clean" else " (vs clean)")
            cells = []
            for m in modes:
                r = by_mode[m]
                versus = r.get("vs_clean_ms")
                extra = "" if kind == "clean" else " (-)" if versus is None else f" ({versus:+g})"
                cells.append(f"{r['once']}/{len(r['sentences'])}; {ms(r['mean_delay_ms'])}{extra}")
            row(f"speech in noise, 10 dB SNR: {kind}", measure, cells)
    if "latency" in results:
        s = results["latency"]["summary"]
        row(TITLES["latency"], "p50 / p90 ms", [f"{ms(s[m]['median_ms'])} / {ms(s[m]['p90_ms'])}" for m in modes])
    shown = {key: [counters_by_mode.get(m, {}).get(key) for m in modes] for key in COUNTERS}
    row("server counters", "false interruptions resumed / backchannels ignored / echo suppressed / ignored speech",
        [" / ".join("null" if shown[key][i] is None else f"{shown[key][i]:g}" for key in COUNTERS)
         for i in range(len(modes))])
    return "\n".join(lines)


# -- the plots: PNG with numpy and zlib ------------------------------------------------------------

# A 5x7 font, column by column, bit 0 at the top (the classic 5x7 LCD font).
_FONT = {
    " ": "0000000000", "!": "00005f0000", "%": "2313086462", "(": "001c224100", ")": "0041221c00",
    "+": "08083e0808", ",": "0050300000", "-": "0808080808", ".": "0060600000", "/": "2010080402",
    "0": "3e5149453e", "1": "00427f4000", "2": "4261514946", "3": "2141454b31", "4": "1814127f10",
    "5": "2745454539", "6": "3c4a494930", "7": "0171090503", "8": "3649494936", "9": "064949291e",
    ":": "0036360000", ";": "0056360000", "<": "0008142241", "=": "1414141414", ">": "4122140800",
    "?": "0201510906", "A": "7e1111117e", "B": "7f49494936", "C": "3e41414122", "D": "7f4141221c",
    "E": "7f49494941", "F": "7f09090101", "G": "3e41415132", "H": "7f0808087f", "I": "00417f4100",
    "J": "2040413f01", "K": "7f08142241", "L": "7f40404040", "M": "7f0204027f", "N": "7f0408107f",
    "O": "3e4141413e", "P": "7f09090906", "Q": "3e4151215e", "R": "7f09192946", "S": "4649494931",
    "T": "01017f0101", "U": "3f4040403f", "V": "1f2040201f", "W": "7f2018207f", "X": "6314081463",
    "Y": "0304780403", "Z": "6151494543", "_": "4040404040", "'": "0005030000",
}

WHITE = (255, 255, 255)
GREY = (200, 200, 200)
DARK = (40, 40, 40)
EVENT_COLOURS = {
    "input_audio_buffer.speech_started": (255, 140, 0),
    "input_audio_buffer.speech_stopped": (150, 60, 200),
    "input_audio_buffer.committed": (200, 0, 0),
    "response.created": (120, 120, 120),
    "output_audio_buffer.started": (0, 150, 0),
    "output_audio_buffer.cleared": (230, 0, 120),
    "response.done cancelled": (0, 0, 0),
    "client's marks (dotted): asked, first audio, onset, end": (0, 90, 255),
}
LANE_H = 70
LEFT = 90
WIDTH = 1400


def text(image: np.ndarray, x: int, y: int, words: str, colour: tuple[int, int, int] = DARK) -> int:
    """Draws ``words`` (upper case) with its top left at (x, y); returns the x after it."""
    for char in words.upper():
        glyph = _FONT.get(char, _FONT["?"])
        for column in range(5):
            bits = int(glyph[2 * column : 2 * column + 2], 16)
            for row in range(7):
                if bits >> row & 1 and 0 <= y + row < image.shape[0] and 0 <= x + column < image.shape[1]:
                    image[y + row, x + column] = colour
        x += 6
    return x


def vline(image: np.ndarray, x: int, top: int, bottom: int, colour: tuple[int, int, int]) -> None:
    if 0 <= x < image.shape[1]:
        image[top:bottom, x] = colour


def lane(image: np.ndarray, top: int, points: list[tuple[float, float]], t0: float, t1: float,
         colour: tuple[int, int, int], floor_db: float = -70.0) -> None:
    """20 ms peaks as bars from the lane's bottom, -70..0 dBFS."""
    span = max(t1 - t0, 1e-3)
    columns = np.full(WIDTH - LEFT - 10, floor_db)
    for at, peak in points:  # each frame fills the columns its 20 ms cover
        x0 = int((at - t0) / span * (len(columns) - 1))
        x1 = max(x0 + 1, int((at + 0.02 - t0) / span * (len(columns) - 1)))
        if x1 > 0 and x0 < len(columns):
            part = columns[max(x0, 0) : x1]
            np.maximum(part, 20 * np.log10(max(peak, 1e-7)), out=part)
    for x, level in enumerate(columns):
        height = int((min(level, 0.0) - floor_db) / -floor_db * (LANE_H - 4))
        if height > 0:
            image[top + LANE_H - 2 - height : top + LANE_H - 2, LEFT + x] = colour


def plot(path: Path, title: str, traces: list[Trace]) -> None:
    """Per trace: the microphone lane and the answer lane, events as vertical lines; a legend on top."""
    block = 2 * LANE_H + 40
    height = 60 + block * len(traces) + 10
    image = np.full((height, WIDTH, 3), 255, np.uint8)
    text(image, 10, 8, title)
    x = 10
    for name, colour in EVENT_COLOURS.items():
        image[24:31, x : x + 7] = colour
        x = text(image, x + 10, 24, name.removeprefix("input_audio_buffer.").replace("_buffer.", " "))
        x += 14
        if x > WIDTH - 200:
            break
    text(image, 10, 40, "LANES: MIC SENT (LIGHT: ALL MIXED, DARK: THE USER'S SPEECH), ANSWER RECEIVED; 20 MS PEAKS, "
         "-70..0 DBFS")
    for index, window in enumerate(traces):
        top = 60 + index * block
        text(image, 10, top, f"{window.mode}: {window.label} ({window.t1 - window.t0:.1f} S)")
        mic_top, heard_top = top + 12, top + 12 + LANE_H + 4
        for lane_top in (mic_top, heard_top):
            image[lane_top : lane_top + LANE_H, LEFT - 1] = GREY
            image[lane_top + LANE_H - 1, LEFT : WIDTH - 10] = GREY
        text(image, 10, mic_top + LANE_H // 2, "MIC")
        text(image, 10, heard_top + LANE_H // 2, "ANSWER")
        lane(image, mic_top, [(f.at, f.peak) for f in window.mic], window.t0, window.t1, (150, 190, 255))
        lane(image, mic_top, [(f.at, f.speech_peak) for f in window.mic], window.t0, window.t1, (0, 60, 200))
        lane(image, heard_top, window.heard, window.t0, window.t1, (0, 150, 60))
        span = max(window.t1 - window.t0, 1e-3)
        usable = WIDTH - LEFT - 10
        step = next(s for s in (1, 2, 5, 10, 20, 30, 60) if span / s <= 20)
        for second in range(0, int(span) + 1, step):
            x = LEFT + int(second / span * (usable - 1))
            vline(image, x, heard_top + LANE_H - 1, heard_top + LANE_H + 3, DARK)
            text(image, x - 3, heard_top + LANE_H + 5, f"{second}")
        taken: dict[int, int] = {}  # events at one pixel stand side by side, 2 px apart
        for at, kind, detail in window.events:
            key = "response.done cancelled" if kind == "response.done" and detail == "cancelled" else kind
            if key in EVENT_COLOURS:
                x = LEFT + int((at - window.t0) / span * (usable - 1))
                taken[x] = taken.get(x, -1) + 1
                vline(image, x + 2 * taken[x], mic_top, heard_top + LANE_H, EVENT_COLOURS[key])
        for at, _ in window.marks:
            x = LEFT + int((at - window.t0) / span * (usable - 1))
            for y in range(mic_top, heard_top + LANE_H, 6):
                image[y : y + 3, x : x + 1] = EVENT_COLOURS["client's marks (dotted): asked, first audio, onset, end"]
    write_png(path, image)


def write_png(path: Path, image: np.ndarray) -> None:
    height, width, _ = image.shape
    raw = b"".join(b"\x00" + image[row].tobytes() for row in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
                     + chunk(b"IEND", b""))


def chosen(traces: list[Trace], modes: list[str]) -> list[Trace]:
    """Per mode, the trace with the most speech_started events (the first of them)."""
    out = []
    for mode in modes:
        mine = [t for t in traces if t.mode == mode]
        if mine:
            out.append(max(mine, key=lambda t: sum(kind == "input_audio_buffer.speech_started"
                                                    for _, kind, _ in t.events)))
    return out


# -- main ------------------------------------------------------------------------------------------

async def run_all(run: Run) -> None:
    for scenario in run.args.scenarios:
        print(f"{TITLES[scenario]}:", flush=True)
        started = time.monotonic()
        run.results[scenario] = await getattr(run, scenario)()
        run.seconds[scenario] = round(time.monotonic() - started, 1)


def session_extra(value: str) -> dict[str, Any]:
    extra = json.loads(value)
    if not isinstance(extra, dict):
        raise argparse.ArgumentTypeError("--session-extra must be a JSON object")
    return extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--noise-reduction", nargs="+", choices=["off", "near_field", "far_field"],
                        default=["off", "near_field"], help="one session per value (off: null)")
    parser.add_argument("--trials", type=int, default=0, help="at most this many trials of each kind (0: all)")
    parser.add_argument("--noise-seconds", type=float, default=60.0, help="each noise-only bed's length")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose server runs (default: this one)")
    parser.add_argument("--server-args", default="", help="extra `omni-rtc serve` flags, one string")
    parser.add_argument("--session-extra", type=session_extra, default={}, help="JSON merged into every session")
    parser.add_argument("--label", default="", help="recorded in the result (before, after...)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.repo = args.repo.resolve()

    answer, answer_text = answer_speech()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch, ReplayServer(pace=REPLAY_PACE) as replay:
        replay.answer, replay.answer_text = answer, answer_text
        with serve(args.repo, replay.url, shlex.split(args.server_args)) as url:
            run = Run(args, url, Path(scratch))
            asyncio.run(run_all(run))
    elapsed = time.monotonic() - started

    summary = table(run.results, run.modes, run.counters)
    print(summary)
    plots = {}
    for scenario, traces in run.traces.items():
        path = args.out.with_name(f"{args.out.stem}_{scenario}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        plot(path, f"{TITLES[scenario]} ({args.label or 'unlabelled'})", chosen(traces, run.modes))
        plots[scenario] = path.name
        print(f"wrote {path}")
    write_report(args.out, {
        "label": args.label,
        "args": {key: str(value) for key, value in vars(args).items()},
        "server": {"checkout": checkout(args.repo), "server_args": args.server_args,
                   "engine": "vLLM-Omni replay (tests/vllm_omni_replay.py), answers: ARCTIC a0001, a0007, a0009 "
                             f"({len(answer) / VOICE_RATE:.1f} s)"},
        "sessions_stated": run.stated,
        "session_extra": args.session_extra,
        "machine": machine(),
        "seconds": {"all": round(elapsed, 1), **run.seconds},
        "table": summary,
        "counters": run.counters,
        "plots": plots,
        "results": run.results,
    })


if __name__ == "__main__":
    main()
