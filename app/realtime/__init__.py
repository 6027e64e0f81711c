"""The realtime session: OpenAI's Realtime protocol over any transport, one conversation each.

The nouns, one module each (``protocol`` is the wire vocabulary: one pydantic model per event,
one union per direction, the event-type strings):

- ``session``: :class:`~app.realtime.session.RealtimeSession`, the conversation. It takes 16 kHz
  audio and client events, and sends server events and 24 kHz answer audio. Its parts say what
  happened; the session acts on it in one place each.
- ``session_config``: the effective session, read tolerantly, fitted to the engine, its system
  message held to a token budget.
- ``tools``: function tools and ``tool_choice``, checked as JSON Schema.
- ``input``: audio, images and camera frames that reach the session as events, read and bounded.
- ``turn_taking``: the detector's events as the protocol's (speech started and stopped,
  commits, barge-in, half-duplex), and semantic VAD's end-of-turn checks.
- ``interruption``: speech over the playing answer pauses it; it interrupts once it proves to be
  the user taking the turn, else the answer plays on (a cough, a backchannel, its own echo).
- ``held_generation``: an engine generation whose events are held until it is released.
- ``speculation``: the answer started at a candidate end of turn, held until the commit.
- ``transcription``: input transcription, final and partial.
- ``response``: one response run from engine generation to ``response.done``, and its events.
- ``history``: the conversation's items as the user heard them, pruned to the session's limits.
- ``playback``: the answers' audio on its way to the listener, and what of it was played.
- ``gate``: client events admitted by size and rate before they are parsed.
- ``shares``: the session's share of the engine, and its client's, in prompt tokens prefilled over
  time; each client's budgets in one registry (its engine share, its event rate).
- ``failures``: what a client is told when the server fails.
- ``turn_report``: what the session tells an observer (traces, recordings) of its turns, with the
  times their ``latency`` came from, and of its events and audio.

One spoken turn: the transport pushes audio into ``session``; ``turn_taking`` hears speech
start and end and asks the session to commit the user item (``history``) and respond;
``speculation`` may already hold an answer started at the first quiet window; ``response``
renders the conversation from ``history``, runs the engine generation and streams its events while
``playback`` writes the audio out; once the audio has played, ``history`` keeps the answer as
heard. docs/SESSION.md has the rules; docs/ARCHITECTURE.md the layers around it.
"""
