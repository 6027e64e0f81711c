// The session settings form (voice, instructions, barge-in, silence wait, input transcription)
// ⇄ session.update,
// and the effective session the server last reported (session.created / session.updated).

export class SessionControls {
  constructor(elements) {
    this.form = elements.sessionForm;
    this.voice = elements.voice;
    this.instructions = elements.instructions;
    this.bargeIn = elements.bargeIn;
    this.transcribe = elements.transcribe;
    this.silenceMs = elements.silenceMs;
    this.note = elements.sessionNote;
    this.session = null;   // the effective session, kept across calls
  }

  silenceWaitMs() {
    return this.session?.audio?.input?.turn_detection?.silence_duration_ms ?? 0;
  }

  createsResponses() {
    const detection = this.session?.audio?.input?.turn_detection;
    return !detection || detection.create_response !== false;
  }

  updateEvent() {
    const current = this.session?.audio?.input?.turn_detection;
    const turnDetection = {
      ...(current ?? { type: "server_vad" }),
      silence_duration_ms: Number(this.silenceMs.value),
      interrupt_response: this.bargeIn.checked,
    };
    // Any model name is accepted; the server's own model transcribes.
    const transcription = this.transcribe.checked ? { model: "qwen3-omni" } : null;
    const update = {
      type: "realtime",
      audio: { input: { turn_detection: turnDetection, transcription }, output: { voice: this.voice.value } },
    };
    const instructions = this.instructions.value.trim();
    if (instructions) update.instructions = instructions;
    return { type: "session.update", session: update };
  }

  /** The server's effective session; `updated`: it answers a session.update. */
  setEffective(session, { updated }) {
    this.session = session;
    this.fill(session);
    if (updated) this.note.textContent = "Session updated.";
  }

  fill(effective) {
    const voice = effective.audio?.output?.voice;
    if (voice) {
      if (![...this.voice.options].some((option) => option.value === voice)) this.voice.add(new Option(voice, voice));
      this.voice.value = voice;
    }
    if (typeof effective.instructions === "string" && this.instructions.ownerDocument.activeElement !== this.instructions) {
      this.instructions.value = effective.instructions;
    }
    const input = effective.audio?.input;
    if (input && "transcription" in input) this.transcribe.checked = input.transcription !== null;
    const detection = input?.turn_detection;
    if (detection) {
      if (typeof detection.interrupt_response === "boolean") this.bargeIn.checked = detection.interrupt_response;
      if (typeof detection.silence_duration_ms === "number") this.silenceMs.value = detection.silence_duration_ms;
    }
  }

  /** The Apply button: sends the form now on an open call (`call` may be null), else on connect. */
  apply(call) {
    if (call?.isOpen) {
      if (call.send(this.updateEvent())) this.note.textContent = "Sent; waiting for the server…";
    } else {
      this.note.textContent = "Applied when you connect.";
    }
  }
}
