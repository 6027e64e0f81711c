// omni-rtc browser client: one WebRTC call to the server, speaking the OpenAI Realtime
// protocol (GA event names) on the "oai-events" data channel, the way OpenAI's browser
// example does: getUserMedia → RTCPeerConnection + mic track + data channel → SDP offer
// POSTed to /v1/realtime/calls → SDP answer.
//
// Test hook (read-only use, kept stable for tests/e2e/test_browser.py):
//   window.omniRtc.pc         the current RTCPeerConnection, or null
//   window.omniRtc.dc         the current "oai-events" RTCDataChannel, or null
//   window.omniRtc.callUrl    the last call's URL on the server (the answer's Location)
//   window.omniRtc.events     every server event received since the page loaded, in order
//   window.omniRtc.sent       every client event sent since the page loaded, in order
//   window.omniRtc.state      the UI state: idle | connecting | listening | user-speaking |
//                             thinking | speaking | reconnecting (also #status[data-state])
//   window.omniRtc.latencies  one record per response, the browser's own measurements:
//                             {responseId, from ("speech" | "text"), fromMs (end of speech:
//                             speech_stopped's arrival less the VAD's silence wait, or the
//                             text sent; performance.now()), firstAudioEventMs
//                             (output_audio_buffer.started arrived), firstAudioEnergyMs
//                             (inbound-rtp totalAudioEnergy first grew)}

const CALLS_URL = "/v1/realtime/calls";
// Backoff for automatic reconnects after a dropped call: 1 s, 2 s, 4 s, 8 s, 16 s, then give up.
const RECONNECT_DELAYS_MS = [1000, 2000, 4000, 8000, 16000];
// ICE "disconnected" often heals by itself within a few seconds (Wi-Fi hiccup); only a
// disconnect that lasts this long is treated as a dropped call.
const DISCONNECT_GRACE_MS = 4000;
// getStats() poll period while an answer's first sound is awaited: the browser latency
// figure is accurate to about this much.
const STATS_POLL_MS = 50;
// inbound-rtp totalAudioEnergy grows by level² × seconds; decoded Opus silence adds ~0,
// the quietest real speech (-50 dBFS over one 20 ms frame) adds 2e-7.
const AUDIO_ENERGY_EPSILON = 1e-7;
// An answer's first sound is energy after at least this much quiet: the previous answer's tail
// still plays from the browser's jitter buffer (~100-200 ms) after the server says "stopped".
const ANSWER_ONSET_QUIET_MS = 250;
const MAX_ERRORS_SHOWN = 5;

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"),
  statusText: $("status-text"),
  connect: $("connect"),
  hangup: $("hangup"),
  reconnect: $("reconnect"),
  meterFill: $("mic-meter-fill"),
  meter: $("mic-meter"),
  echoCancellation: $("echo-cancellation"),
  errors: $("errors"),
  transcript: $("transcript"),
  textForm: $("text-form"),
  textInput: $("text-input"),
  textSend: $("text-send"),
  sessionForm: $("session-form"),
  voice: $("voice"),
  instructions: $("instructions"),
  bargeIn: $("barge-in"),
  transcribe: $("transcribe"),
  silenceMs: $("silence-ms"),
  sessionNote: $("session-note"),
  remoteAudio: $("remote-audio"),
  accessKey: $("access-key"),
  announcer: $("announcer"),
  access: document.querySelector("details.access"),
};

const STATE_TEXT = {
  idle: "Not connected",
  connecting: "Connecting…",
  listening: "Listening",
  "user-speaking": "Hearing you",
  thinking: "Thinking…",
  speaking: "Speaking",
  reconnecting: "Connection lost — reconnecting",
};

const hook = {
  pc: null,
  dc: null,
  callUrl: null,
  events: [],
  sent: [],
  state: "idle",
  latencies: [],
};
window.omniRtc = hook;

// ---------------------------------------------------------------------------------------
// Call: everything that lives exactly as long as one connection. close() releases it all
// and is safe to call twice.
// ---------------------------------------------------------------------------------------

let call = null;            // the live Call, or null
let userHungUp = true;      // false while the person wants to be connected
let reconnectAttempt = 0;
let reconnectTimer = null;
let session = null;         // the effective session from session.created / session.updated

class Call {
  constructor() {
    this.pc = null;
    this.dc = null;
    this.micStream = null;
    this.audioContext = null;
    this.meterSource = null;
    this.meterFrame = 0;
    this.statsTimer = null;
    this.disconnectTimer = null;
    this.closed = false;
    this.location = null;         // the call's URL on the server (Location of the answer)
    // Conversation flags the status line is derived from (see renderState).
    this.userSpeaking = false;
    this.awaitingAnswer = false;
    this.audioPlaying = false;
    this.responseActive = false;  // between response.created and response.done
    // Latency bookkeeping: the moment the current turn's input ended, and per response.
    this.turnEndedAt = null;
    this.turnInput = "speech";    // what ended the turn: "speech" or "text"
    this.responses = new Map();   // response id → {itemIds, latency record}
    this.pendingLatency = null;   // the record awaiting its first sound
    this.lastAudioEnergy = 0;
    this.lastSoundAt = -Infinity;  // performance.now() of the last poll that found energy
  }

  async open() {
    const micStream = await openMicrophone(ui.echoCancellation.checked);
    if (this.closed) {   // hung up while the browser asked for the microphone
      for (const track of micStream.getTracks()) track.stop();
      return;
    }
    this.micStream = micStream;
    this.startMeter();

    this.pc = new RTCPeerConnection();
    hook.pc = this.pc;
    this.pc.ontrack = (event) => {
      ui.remoteAudio.srcObject = event.streams[0] ?? new MediaStream([event.track]);
    };
    this.pc.onconnectionstatechange = () => this.onConnectionState();
    for (const track of this.micStream.getAudioTracks()) this.pc.addTrack(track, this.micStream);

    this.dc = this.pc.createDataChannel("oai-events");
    hook.dc = this.dc;
    this.dc.onopen = () => this.onChannelOpen();
    this.dc.onmessage = (message) => this.onChannelMessage(message);
    this.dc.onclose = () => {
      if (!this.closed) this.dropped("the event channel closed");
    };

    const offer = await this.pc.createOffer();
    await this.pc.setLocalDescription(offer);
    const answer = await postOffer(offer.sdp);
    this.location = answer.location;
    hook.callUrl = answer.location;
    if (this.closed) {
      endServerCall(this.location);
      return;
    }
    await this.pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    this.statsTimer = setInterval(() => this.pollAudioStats(), STATS_POLL_MS);
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.statsTimer);
    clearTimeout(this.disconnectTimer);
    cancelAnimationFrame(this.meterFrame);
    if (this.dc) this.dc.close();
    if (this.pc) this.pc.close();
    if (this.micStream) for (const track of this.micStream.getTracks()) track.stop();
    if (this.audioContext) {
      this.audioContext.close().catch((error) => console.error("closing the AudioContext failed", error));
    }
    // The server notices a closed peer connection by itself; telling it as well frees the
    // session at once, even when the close never reaches it (network gone).
    if (this.location) endServerCall(this.location);
    if (hook.pc === this.pc) hook.pc = null;
    if (hook.dc === this.dc) hook.dc = null;
    ui.remoteAudio.srcObject = null;
    setMeter(0);
  }

  send(event) {
    if (!this.dc || this.dc.readyState !== "open") {
      showError("Not connected: the message was not sent.");
      return false;
    }
    hook.sent.push(event);
    this.dc.send(JSON.stringify(event));
    return true;
  }

  // --- connection life --------------------------------------------------------------

  onChannelOpen() {
    reconnectAttempt = 0;
    ui.reconnect.hidden = true;
    // Like OpenAI's clients: configure the session right away, without waiting for
    // session.created; the server answers with session.updated (the effective session).
    this.send(sessionUpdateEvent());
    setConnectedControls(true);
    this.renderState();
  }

  onConnectionState() {
    const state = this.pc.connectionState;
    if (state === "connected") {
      clearTimeout(this.disconnectTimer);
      this.disconnectTimer = null;
    } else if (state === "failed") {
      this.dropped("the connection failed");
    } else if (state === "disconnected" && this.disconnectTimer === null) {
      this.disconnectTimer = setTimeout(() => this.dropped("the connection was interrupted"), DISCONNECT_GRACE_MS);
    } else if (state === "closed" && !this.closed) {
      this.dropped("the server closed the call");
    }
  }

  dropped(reason) {
    if (this.closed || call !== this) return;
    showError(`Call dropped: ${reason}.`);
    this.close();
    call = null;
    scheduleReconnect();
  }

  // --- server events ----------------------------------------------------------------

  onChannelMessage(message) {
    let event;
    try {
      event = JSON.parse(message.data);
    } catch (error) {
      showError(`The server sent a message that is not JSON: ${String(message.data).slice(0, 80)}`);
      return;
    }
    hook.events.push(event);
    this.handle(event);
    this.renderState();
  }

  handle(event) {
    switch (event.type) {
      case "session.created":
      case "session.updated":
        session = event.session;
        fillSessionForm(session);
        if (event.type === "session.updated") ui.sessionNote.textContent = "Session updated.";
        break;
      case "input_audio_buffer.speech_started":
        this.userSpeaking = true;
        break;
      case "input_audio_buffer.speech_stopped":
        this.userSpeaking = false;
        this.awaitingAnswer = true;
        // The server says speech stopped once it has heard silence_duration_ms of silence, so
        // the speech itself ended that long before (the server's latency counts it too).
        this.turnEndedAt = performance.now() - silenceWaitMs();
        this.turnInput = "speech";
        break;
      case "input_audio_buffer.committed":
        this.userSpeaking = false;
        if (createsResponses()) this.awaitingAnswer = true;
        break;
      case "input_audio_buffer.cleared":
        this.userSpeaking = false;
        break;
      case "response.output_item.added":
        this.responses.get(event.response_id)?.itemIds.push(event.item.id);
        renderItem(event.item);
        break;
      case "conversation.item.added":
      case "conversation.item.done":
      case "response.output_item.done":
        renderItem(event.item);
        break;
      case "conversation.item.input_audio_transcription.delta":
        appendUserTranscript(event.item_id, event.delta);
        break;
      case "conversation.item.input_audio_transcription.completed":
        setUserTranscript(event.item_id, event.transcript);
        break;
      case "conversation.item.input_audio_transcription.failed":
        markItem(event.item_id, "not transcribed");
        break;
      case "conversation.item.deleted":
        itemElement(event.item_id)?.remove();
        break;
      case "conversation.item.truncated":
        markItem(event.item_id, "cut off");
        break;
      case "response.created":
        this.onResponseCreated(event.response);
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        appendItemText(event.item_id, event.delta);
        break;
      case "response.output_audio_transcript.done":
        setItemText(event.item_id, event.transcript);
        announce(event.transcript);
        break;
      case "response.output_text.done":
        setItemText(event.item_id, event.text);
        announce(event.text);
        break;
      case "output_audio_buffer.started":
        this.audioPlaying = true;
        this.awaitingAnswer = false;
        this.onFirstAudio(event.response_id, "firstAudioEventMs");
        break;
      case "output_audio_buffer.stopped":
      case "output_audio_buffer.cleared":
        this.audioPlaying = false;
        break;
      case "response.done":
        this.onResponseDone(event.response, event.latency);
        break;
      case "error":
        showError(describeServerError(event.error));
        break;
      default:
        break;   // events the page has nothing to show for (rate limits, deltas of other kinds)
    }
  }

  onResponseCreated(response) {
    this.awaitingAnswer = true;
    this.responseActive = true;
    const latency = {
      responseId: response.id,
      from: this.turnInput,
      fromMs: this.turnEndedAt,
      firstAudioEventMs: null,
      firstAudioEnergyMs: null,
    };
    this.turnEndedAt = null;
    this.responses.set(response.id, { latency, itemIds: [], serverLatency: null });
    this.pendingLatency = latency;
    hook.latencies.push(latency);
  }

  // `latency` is this server's extension of response.done (app/protocol.py ResponseLatency).
  onResponseDone(response, latency) {
    this.awaitingAnswer = false;
    this.responseActive = false;
    const itemIds = (response.output ?? []).map((item) => item.id);
    if (response.status === "cancelled") {
      for (const id of itemIds) markItem(id, "cut off");
    } else if (response.status === "incomplete") {
      const reason = response.status_details?.reason;
      const label = reason === "max_output_tokens" ? "length limit" : `stopped${reason ? `: ${reason}` : ""}`;
      for (const id of itemIds) markItem(id, label);
    } else if (response.status === "failed") {
      for (const id of itemIds) markItem(id, "failed");
      // The server explains a failure in an `error` event; show details here only if it
      // put a message in the response itself.
      const error = response.status_details?.error;
      if (error?.message) showError(describeServerError(error));
    }
    const record = this.responses.get(response.id);
    if (record) {
      if (itemIds.length) record.itemIds = itemIds;
      record.serverLatency = latency ?? null;
      renderLatency(record);
    }
    // The latency record stays pending: output_audio_buffer.started may come after response.done
    // (the server reports playback as it happens), and the next response replaces it.
  }

  onFirstAudio(responseId, field) {
    const latency = this.pendingLatency;
    if (!latency || (responseId && latency.responseId !== responseId)) return;
    if (latency[field] === null) latency[field] = performance.now();
    if (latency.firstAudioEventMs !== null && latency.firstAudioEnergyMs !== null) this.pendingLatency = null;
    const record = this.responses.get(latency.responseId);
    if (record) renderLatency(record);
  }

  async pollAudioStats() {
    if (!this.pc || this.closed) return;
    let stats;
    try {
      stats = await this.pc.getStats();
    } catch (error) {
      console.error("getStats failed", error);
      return;
    }
    for (const report of stats.values()) {
      if (report.type !== "inbound-rtp" || report.kind !== "audio") continue;
      const energy = report.totalAudioEnergy ?? 0;
      if (energy - this.lastAudioEnergy > AUDIO_ENERGY_EPSILON) {
        const now = performance.now();
        if (this.pendingLatency && now - this.lastSoundAt >= ANSWER_ONSET_QUIET_MS) {
          this.onFirstAudio(null, "firstAudioEnergyMs");
        }
        this.lastSoundAt = now;
      }
      this.lastAudioEnergy = energy;
    }
  }

  renderState() {
    if (this.closed) return;
    let state = "connecting";
    if (this.dc?.readyState === "open") {
      if (this.userSpeaking) state = "user-speaking";
      else if (this.audioPlaying) state = "speaking";
      else if (this.awaitingAnswer) state = "thinking";
      else state = "listening";
    }
    setState(state);
  }

  // --- microphone -------------------------------------------------------------------

  startMeter() {
    this.audioContext = new AudioContext();
    // Created after awaiting the microphone, a moment after the click: Safari starts such a
    // context suspended.
    this.audioContext.resume().catch((error) => console.error("the level meter's AudioContext did not start", error));
    const analyser = this.audioContext.createAnalyser();
    analyser.fftSize = 1024;
    this.meterSource = this.audioContext.createMediaStreamSource(this.micStream);
    this.meterSource.connect(analyser);
    const samples = new Float32Array(analyser.fftSize);
    const draw = () => {
      analyser.getFloatTimeDomainData(samples);
      let sum = 0;
      for (const sample of samples) sum += sample * sample;
      const rms = Math.sqrt(sum / samples.length);
      // -60 dBFS (room noise) → empty, 0 dBFS → full.
      const db = 20 * Math.log10(rms + 1e-9);
      setMeter(Math.max(0, Math.min(100, ((db + 60) / 60) * 100)));
      this.meterFrame = requestAnimationFrame(draw);
    };
    draw();
  }

  async switchMicrophone(echoCancellation) {
    const stream = await openMicrophone(echoCancellation);
    if (this.closed) {
      for (const track of stream.getTracks()) track.stop();
      return;
    }
    const [track] = stream.getAudioTracks();
    const sender = this.pc.getSenders().find((s) => s.track?.kind === "audio");
    await sender.replaceTrack(track);
    for (const old of this.micStream.getTracks()) old.stop();
    this.micStream = stream;
    this.meterSource.disconnect();
    cancelAnimationFrame(this.meterFrame);
    this.audioContext.close().catch((error) => console.error("closing the AudioContext failed", error));
    this.startMeter();
  }
}

// ---------------------------------------------------------------------------------------
// Connecting, hanging up, reconnecting
// ---------------------------------------------------------------------------------------

class MicrophoneError extends Error {}

async function openMicrophone(echoCancellation) {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new MicrophoneError("This page needs a secure origin (https:// or localhost) to use the microphone.");
  }
  try {
    return await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation, noiseSuppression: true, autoGainControl: true },
    });
  } catch (error) {
    if (error.name === "NotAllowedError" || error.name === "SecurityError") {
      throw new MicrophoneError(
        "Microphone access was refused. Allow this site to use the microphone " +
        "(the icon in the address bar, or your browser's site settings), then press Connect again.");
    }
    if (error.name === "NotFoundError" || error.name === "OverconstrainedError") {
      throw new MicrophoneError("No microphone was found. Plug one in, then press Connect again.");
    }
    if (error.name === "NotReadableError") {
      throw new MicrophoneError("The microphone is in use by another application or could not be opened.");
    }
    throw error;
  }
}

// Synchronous on purpose: callers spread the result into fetch headers.
function authorization() {
  const accessKey = ui.accessKey.value.trim();
  return accessKey ? { Authorization: `Bearer ${accessKey}` } : {};
}

async function postOffer(sdp) {
  const headers = { "Content-Type": "application/sdp", ...authorization() };
  let response;
  try {
    response = await fetch(CALLS_URL, { method: "POST", body: sdp, headers });
  } catch (error) {
    throw new Error(`Could not reach the server (${error.message}).`);
  }
  const body = await response.text();
  if (response.status === 401) {
    ui.access.open = true;
    throw new Error(`This server needs an access key: enter it under "Server access key" and connect again (${errorMessageOf(body)}).`);
  }
  if (!response.ok) {
    const retryAfter = response.headers.get("Retry-After");
    const wait = retryAfter ? ` Try again in ${retryAfter} s.` : "";
    throw new Error(`The server refused the call (HTTP ${response.status}): ${errorMessageOf(body)}${wait}`);
  }
  return { sdp: body, location: response.headers.get("Location") };
}

// DELETE /v1/realtime/calls/{id}. 404: the server had already ended it. 401: a client secret
// opens a call but cannot end one; the closed peer connection ends it a moment later.
function endServerCall(location) {
  fetch(location, { method: "DELETE", headers: authorization(), keepalive: true }).then(
    (response) => {
      if (!response.ok && response.status !== 404 && response.status !== 401) {
        console.warn(`ending the call on the server answered HTTP ${response.status}`);
      }
    },
    (error) => console.warn("ending the call on the server failed", error),
  );
}

function errorMessageOf(body) {
  try {
    const parsed = JSON.parse(body);
    const detail = parsed.error?.message ?? parsed.detail ?? parsed.message;
    if (detail) return typeof detail === "string" ? detail : JSON.stringify(detail);
  } catch {
    // Not JSON: the body itself is the message.
  }
  return body.trim().slice(0, 200) || "no details";
}

async function connect() {
  clearTimeout(reconnectTimer);
  reconnectTimer = null;
  userHungUp = false;
  if (call) call.close();
  const thisCall = new Call();
  call = thisCall;
  setState(reconnectAttempt > 0 ? "reconnecting" : "connecting");
  ui.connect.disabled = true;
  ui.hangup.disabled = false;
  try {
    await thisCall.open();
  } catch (error) {
    if (call !== thisCall) return;   // hung up (or replaced) while connecting
    thisCall.close();
    call = null;
    showError(error.message);
    if (error instanceof MicrophoneError || reconnectAttempt === 0) {
      // A first connect that fails is shown, not retried: the person is looking at it.
      endCall();
    } else {
      scheduleReconnect();
    }
  }
}

function scheduleReconnect() {
  if (userHungUp) return;
  if (reconnectAttempt >= RECONNECT_DELAYS_MS.length) {
    showError("Could not reconnect. Press Reconnect to try again.");
    endCall();
    ui.reconnect.hidden = false;
    return;
  }
  const delay = RECONNECT_DELAYS_MS[reconnectAttempt];
  reconnectAttempt += 1;
  setState("reconnecting", `Connection lost — reconnecting in ${delay / 1000} s (attempt ${reconnectAttempt} of ${RECONNECT_DELAYS_MS.length})`);
  setConnectedControls(false);
  ui.hangup.disabled = false;
  ui.reconnect.hidden = false;
  addDivider("Reconnecting: the server starts a new session.");
  reconnectTimer = setTimeout(connect, delay);
}

function endCall() {
  clearTimeout(reconnectTimer);
  reconnectTimer = null;
  if (call) call.close();
  call = null;
  userHungUp = true;
  setConnectedControls(false);
  ui.connect.disabled = false;
  ui.hangup.disabled = true;
  setState("idle");
}

function hangUp() {
  reconnectAttempt = 0;
  ui.reconnect.hidden = true;
  endCall();
}

function setConnectedControls(connected) {
  ui.textInput.disabled = !connected;
  ui.textSend.disabled = !connected;
}

// ---------------------------------------------------------------------------------------
// Session settings ⇄ session.update
// ---------------------------------------------------------------------------------------

function silenceWaitMs() {
  return session?.audio?.input?.turn_detection?.silence_duration_ms ?? 0;
}

function createsResponses() {
  const detection = session?.audio?.input?.turn_detection;
  return !detection || detection.create_response !== false;
}

function sessionUpdateEvent() {
  const current = session?.audio?.input?.turn_detection;
  const turnDetection = {
    ...(current ?? { type: "server_vad" }),
    silence_duration_ms: Number(ui.silenceMs.value),
    interrupt_response: ui.bargeIn.checked,
  };
  // Any model name is accepted; the server's own model transcribes.
  const transcription = ui.transcribe.checked ? { model: "qwen3-omni" } : null;
  const update = {
    type: "realtime",
    audio: { input: { turn_detection: turnDetection, transcription }, output: { voice: ui.voice.value } },
  };
  const instructions = ui.instructions.value.trim();
  if (instructions) update.instructions = instructions;
  return { type: "session.update", session: update };
}

function fillSessionForm(effective) {
  const voice = effective.audio?.output?.voice;
  if (voice) {
    if (![...ui.voice.options].some((option) => option.value === voice)) ui.voice.add(new Option(voice, voice));
    ui.voice.value = voice;
  }
  if (typeof effective.instructions === "string" && document.activeElement !== ui.instructions) {
    ui.instructions.value = effective.instructions;
  }
  const input = effective.audio?.input;
  if (input && "transcription" in input) ui.transcribe.checked = input.transcription !== null;
  const detection = input?.turn_detection;
  if (detection) {
    if (typeof detection.interrupt_response === "boolean") ui.bargeIn.checked = detection.interrupt_response;
    if (typeof detection.silence_duration_ms === "number") ui.silenceMs.value = detection.silence_duration_ms;
  }
}

function applySession(event) {
  event.preventDefault();
  if (!ui.sessionForm.reportValidity()) return;
  if (call?.dc?.readyState === "open") {
    if (call.send(sessionUpdateEvent())) ui.sessionNote.textContent = "Sent; waiting for the server…";
  } else {
    ui.sessionNote.textContent = "Applied when you connect.";
  }
}

function sendText(event) {
  event.preventDefault();
  const text = ui.textInput.value.trim();
  if (!text || !call) return;
  // A typed message while the assistant is answering interrupts it, as speaking would: clearing
  // the output also cancels the response (a second one cannot start while one is active).
  if (call.audioPlaying || call.responseActive) call.send({ type: "output_audio_buffer.clear" });
  const sent = call.send({
    type: "conversation.item.create",
    item: { type: "message", role: "user", content: [{ type: "input_text", text }] },
  });
  if (!sent) return;
  call.turnEndedAt = performance.now();
  call.turnInput = "text";
  call.send({ type: "response.create" });
  call.awaitingAnswer = true;
  call.renderState();
  ui.textInput.value = "";
}

// ---------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------

function setState(state, text) {
  hook.state = state;
  ui.status.dataset.state = state;
  ui.statusText.textContent = text ?? STATE_TEXT[state];
}

function announce(answer) {
  if (answer) ui.announcer.textContent = `Assistant: ${answer}`;
}

function setMeter(percent) {
  ui.meterFill.style.width = `${percent}%`;
  ui.meter.setAttribute("aria-valuenow", String(Math.round(percent)));
}

function showError(message) {
  console.error(message);
  const entry = document.createElement("p");
  entry.className = "error";
  const text = document.createElement("span");
  text.textContent = message;
  const dismiss = document.createElement("button");
  dismiss.type = "button";
  dismiss.className = "dismiss";
  dismiss.setAttribute("aria-label", "Dismiss this error");
  dismiss.textContent = "×";
  dismiss.addEventListener("click", () => entry.remove());
  entry.append(text, dismiss);
  ui.errors.prepend(entry);
  while (ui.errors.children.length > MAX_ERRORS_SHOWN) ui.errors.lastElementChild.remove();
}

function describeServerError(error) {
  if (!error) return "Server error.";
  const details = [error.code ?? error.type, error.param].filter(Boolean).join(", ");
  return `Server error: ${error.message ?? "no message"}${details ? ` (${details})` : ""}`;
}

function itemElement(itemId) {
  return itemId ? ui.transcript.querySelector(`li[data-item-id="${CSS.escape(itemId)}"]`) : null;
}

function ensureItemElement(itemId, role) {
  let element = itemElement(itemId);
  if (element) return element;
  ui.transcript.querySelector(".placeholder")?.remove();
  element = document.createElement("li");
  element.className = `turn ${role}`;
  element.dataset.itemId = itemId;
  element.dataset.role = role;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "You" : "Assistant";
  const text = document.createElement("p");
  text.className = "text";
  const meta = document.createElement("p");
  meta.className = "meta";
  element.append(who, text, meta);
  ui.transcript.append(element);
  return element;
}

function renderItem(item) {
  if (!item || item.type !== "message") return;
  const element = ensureItemElement(item.id, item.role);
  const textElement = element.querySelector(".text");
  const parts = item.content ?? [];
  if (item.role === "user") {
    textElement.textContent = parts.map((part) => {
      if (part.type === "input_text") return part.text;
      if (part.type === "input_audio") return part.transcript ?? userTranscripts.get(item.id) ?? "(voice message)";
      return "";
    }).join(" ");
    element.classList.toggle(
      "voice", parts.some((part) => part.type === "input_audio" && part.transcript == null && !userTranscripts.has(item.id)),
    );
  } else {
    const text = parts.map((part) => part.transcript ?? part.text ?? "").join("");
    // Streaming deltas may already be ahead of a snapshot taken at item.added.
    if (text.length >= textElement.textContent.length) textElement.textContent = text;
  }
}

// Keeps the newest words in view while the answer streams (the list scrolls on wide screens),
// unless the person has scrolled up to read.
let transcriptPinned = true;
let autoScrollTop = -1;   // where the page last scrolled the list itself
ui.transcript.addEventListener("scroll", () => {
  const list = ui.transcript;
  if (Math.abs(list.scrollTop - autoScrollTop) < 2) return;   // our own scroll, not the person's
  transcriptPinned = list.scrollTop + list.clientHeight >= list.scrollHeight - 24;
});
new MutationObserver(() => {
  if (!transcriptPinned) return;
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
  autoScrollTop = ui.transcript.scrollTop;
}).observe(ui.transcript, { childList: true, subtree: true, characterData: true });

// What the user said, as streamed by input audio transcription (item id → text so far); a
// committed voice item shows it in place of "(voice message)".
const userTranscripts = new Map();

function appendUserTranscript(itemId, delta) {
  setUserTranscript(itemId, (userTranscripts.get(itemId) ?? "") + (delta ?? ""));
}

function setUserTranscript(itemId, text) {
  if (typeof text !== "string") return;
  userTranscripts.set(itemId, text);
  const element = ensureItemElement(itemId, "user");
  element.querySelector(".text").textContent = text;
  element.classList.remove("voice");
}

function appendItemText(itemId, delta) {
  const element = ensureItemElement(itemId, "assistant");
  element.querySelector(".text").textContent += delta;
}

function setItemText(itemId, text) {
  if (typeof text !== "string") return;
  ensureItemElement(itemId, "assistant").querySelector(".text").textContent = text;
}

// Marks an answer that did not end by itself: "cut off", "length limit", "failed". The latest
// word wins: an answer that finished generating at the length limit and was then interrupted
// while playing was cut off.
function markItem(itemId, label) {
  const element = itemElement(itemId);
  if (!element) return;
  element.classList.add("cut-off");
  let badge = element.querySelector(".badge");
  if (!badge) {
    badge = document.createElement("span");
    badge.className = "badge";
    element.querySelector(".who").after(badge);
  }
  badge.textContent = label;
}

function addDivider(text) {
  const divider = document.createElement("li");
  divider.className = "divider";
  divider.textContent = text;
  ui.transcript.append(divider);
}

// The server's own breakdown of end of speech → first audio, when response.done carries it.
function describeServerLatency(latency) {
  const ms = (value) => `${Math.round(value)} ms`;
  const parts = [];
  if (latency.silence_wait_ms > 0) parts.push(`${ms(latency.silence_wait_ms)} silence wait`);
  if (latency.engine_first_audio_ms !== null && latency.engine_first_audio_ms !== undefined) {
    const queue = latency.queue_wait_ms > 0 ? ` incl. ${ms(latency.queue_wait_ms)} queued` : "";
    parts.push(`${ms(latency.engine_first_audio_ms)} model${queue}`);
  }
  parts.push(`${ms(latency.other_ms)} other`);
  return `server: ${ms(latency.end_of_speech_to_first_audio_ms)} (${parts.join(", ")})`;
}

function renderLatency(record) {
  const { latency } = record;
  const element = itemElement(record.itemIds[0]);
  if (!element) return;
  const parts = [];
  const heard = latency.firstAudioEnergyMs ?? latency.firstAudioEventMs;
  const since = latency.from === "text" ? "sending" : "end of speech";
  if (heard !== null && latency.fromMs !== null) {
    parts.push(`Answer began ${Math.round(heard - latency.fromMs)} ms after ${since} (measured here)`);
  }
  if (record.serverLatency) parts.push(describeServerLatency(record.serverLatency));
  element.querySelector(".meta").textContent = parts.join(" · ");
}

// ---------------------------------------------------------------------------------------
// Wiring
// ---------------------------------------------------------------------------------------

ui.connect.addEventListener("click", () => {
  reconnectAttempt = 0;
  connect();
});
ui.reconnect.addEventListener("click", () => {
  reconnectAttempt = 0;
  ui.reconnect.hidden = true;
  connect();
});
ui.hangup.addEventListener("click", hangUp);
// The API key is remembered in this browser (localStorage) so a reload needs no retyping; an
// ek_ client secret opens one call only, so it is not kept.
const ACCESS_KEY_STORAGE = "omni-rtc.apiKey";
ui.accessKey.value = localStorage.getItem(ACCESS_KEY_STORAGE) ?? "";
ui.accessKey.addEventListener("change", () => {
  const accessKey = ui.accessKey.value.trim();
  if (accessKey && !accessKey.startsWith("ek_")) localStorage.setItem(ACCESS_KEY_STORAGE, accessKey);
  else localStorage.removeItem(ACCESS_KEY_STORAGE);
});

// Enter in the access key field connects, like pressing Connect.
$("access-form").addEventListener("submit", (event) => {
  event.preventDefault();
  if (!call) {
    reconnectAttempt = 0;
    connect();
  }
});
ui.sessionForm.addEventListener("submit", applySession);
ui.textForm.addEventListener("submit", sendText);
ui.echoCancellation.addEventListener("change", () => {
  if (!call?.pc) return;
  call.switchMicrophone(ui.echoCancellation.checked).catch((error) => showError(error.message));
});
window.addEventListener("pagehide", () => {
  if (call) call.close();
});
