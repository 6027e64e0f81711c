"""The sample rates every layer agrees on: the one home for them."""

SPEECH_RATE = 16_000  # what the VAD and Qwen3-Omni's audio encoder hear (Whisper log-mel features)
VOICE_RATE = 24_000  # what Code2Wav speaks; also OpenAI's ``audio/pcm`` (PCM16 mono at 24 kHz)
WIRE_RATE = 48_000  # Opus over WebRTC: what aiortc decodes to and encodes from without resampling
