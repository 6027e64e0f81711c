// The session settings form (voice, instructions, barge-in, noise reduction, end of turn: server
// VAD with its silence or semantic VAD with its eagerness, input transcription) ⇄ session.update,
// and the effective session the server last reported (session.created / session.updated).

export class SessionControls {
  constructor(elements) {
    this.form = elements.sessionForm;
    this.voice = elements.voice;
    this.instructions = elements.instructions;
    this.bargeIn = elements.bargeIn;
    this.noiseReduction = elements.noiseReduction;
    this.transcribe = elements.transcribe;
    this.silenceMs = elements.silenceMs;
    this.turnDetection = elements.turnDetection;
    this.eagerness = elements.eagerness;
    this.serverVadFields = elements.serverVadFields;
    this.semanticVadFields = elements.semanticVadFields;
    this.note = elements.sessionNote;
    this.recordingNote = elements.recordingNote;
    this.session = null;   // the effective session, kept across calls
    this.turnDetection.addEventListener("change", () => this.showTurnDetectionFields());
  }

  /** Server VAD's fixed silence wait; semantic VAD's varies per turn (response.done's latency has it). */
  silenceWaitMs() {
    return this.session?.audio?.input?.turn_detection?.silence_duration_ms ?? 0;
  }

  showTurnDetectionFields() {
    const semantic = this.turnDetection.value === "semantic_vad";
    this.serverVadFields.hidden = semantic;
    this.semanticVadFields.hidden = !semantic;
  }

  createsResponses() {
    const detection = this.session?.audio?.input?.turn_detection;
    return !detection || detection.create_response !== false;
  }

  updateEvent() {
    const current = this.session?.audio?.input?.turn_detection;
    const common = {
      create_response: current?.create_response ?? true,
      interrupt_response: this.bargeIn.checked,
    };
    const turnDetection = this.turnDetection.value === "semantic_vad"
      ? { type: "semantic_vad", eagerness: this.eagerness.value, ...common }
      : {
        ...(current?.type === "server_vad" ? current : { type: "server_vad" }),
        silence_duration_ms: Number(this.silenceMs.value),
        ...common,
      };
    // Any model name is accepted; the server's own model transcribes.
    const transcription = this.transcribe.checked ? { model: "qwen3-omni" } : null;
    const noiseReduction = this.noiseReduction.value === "off" ? null : { type: this.noiseReduction.value };
    const update = {
      type: "realtime",
      audio: {
        input: { turn_detection: turnDetection, transcription, noise_reduction: noiseReduction },
        output: { voice: this.voice.value },
      },
    };
    const instructions = this.instructions.value.trim();
    if (instructions) update.instructions = instructions;
    return { type: "session.update", session: update };
  }

  /** The server's effective session; `updated`: it answers a session.update. */
  setEffective(session, { updated }) {
    this.session = session;
    this.fill(session);
    // The server says whether it keeps this call (session.recording, an extension; docs/OPERATING.md).
    this.recordingNote.hidden = session.recording?.enabled !== true;
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
    if (input && "noise_reduction" in input) this.noiseReduction.value = input.noise_reduction?.type ?? "off";
    const detection = input?.turn_detection;
    if (detection) {
      if (typeof detection.interrupt_response === "boolean") this.bargeIn.checked = detection.interrupt_response;
      if (typeof detection.silence_duration_ms === "number") this.silenceMs.value = detection.silence_duration_ms;
      if (typeof detection.eagerness === "string") this.eagerness.value = detection.eagerness;
      if (detection.type === "server_vad" || detection.type === "semantic_vad") this.turnDetection.value = detection.type;
      this.showTurnDetectionFields();
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
