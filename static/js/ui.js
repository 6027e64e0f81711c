// The page's DOM: the elements the other modules are given, the status line, the error list,
// the microphone meter, and the listeners that turn clicks and form submits into actions.

const MAX_ERRORS_SHOWN = 5;

const STATE_TEXT = {
  idle: "Not connected",
  connecting: "Connecting…",
  listening: "Listening",
  "user-speaking": "Hearing you",
  thinking: "Thinking…",
  speaking: "Speaking",
  reconnecting: "Connection lost — reconnecting",
};

/** Every element the page's modules use, by role. */
export function findElements(document) {
  const byId = (id) => document.getElementById(id);
  return {
    status: byId("status"),
    statusText: byId("status-text"),
    connect: byId("connect"),
    hangup: byId("hangup"),
    reconnect: byId("reconnect"),
    meterFill: byId("mic-meter-fill"),
    meter: byId("mic-meter"),
    echoCancellation: byId("echo-cancellation"),
    cameraToggle: byId("camera-toggle"),
    selfView: byId("self-view"),
    errors: byId("errors"),
    transcript: byId("transcript"),
    textForm: byId("text-form"),
    textInput: byId("text-input"),
    textSend: byId("text-send"),
    sessionForm: byId("session-form"),
    voice: byId("voice"),
    instructions: byId("instructions"),
    bargeIn: byId("barge-in"),
    noiseReduction: byId("noise-reduction"),
    transcribe: byId("transcribe"),
    silenceMs: byId("silence-ms"),
    turnDetection: byId("turn-detection"),
    eagerness: byId("eagerness"),
    serverVadFields: byId("server-vad-fields"),
    semanticVadFields: byId("semantic-vad-fields"),
    sessionNote: byId("session-note"),
    recordingNote: byId("recording-note"),
    remoteAudio: byId("remote-audio"),
    accessForm: byId("access-form"),
    accessKey: byId("access-key"),
    announcer: byId("announcer"),
    timeline: byId("timeline-turns"),
    access: document.querySelector("details.access"),
  };
}

/** What the page shows about the call: status, errors, meter, buttons. */
export class View {
  constructor(elements, hook) {
    this.elements = elements;
    this.hook = hook;
  }

  get echoCancellation() {
    return this.elements.echoCancellation.checked;
  }

  setState(state, text) {
    this.hook.state = state;
    this.elements.status.dataset.state = state;
    this.elements.statusText.textContent = text ?? STATE_TEXT[state];
  }

  announce(answer) {
    if (answer) this.elements.announcer.textContent = `Assistant: ${answer}`;
  }

  setMeter(percent) {
    this.elements.meterFill.style.width = `${percent}%`;
    this.elements.meter.setAttribute("aria-valuenow", String(Math.round(percent)));
  }

  showError(message) {
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
    const errors = this.elements.errors;
    errors.prepend(entry);
    while (errors.children.length > MAX_ERRORS_SHOWN) errors.lastElementChild.remove();
  }

  setConnectedControls(connected) {
    this.elements.textInput.disabled = !connected;
    this.elements.textSend.disabled = !connected;
  }

  enableConnect(enabled) {
    this.elements.connect.disabled = !enabled;
  }

  enableHangUp(enabled) {
    this.elements.hangup.disabled = !enabled;
  }

  showReconnect(shown) {
    this.elements.reconnect.hidden = !shown;
  }

  openAccessKey() {
    this.elements.access.open = true;
  }
}

export function describeServerError(error) {
  if (!error) return "Server error.";
  const details = [error.code ?? error.type, error.param].filter(Boolean).join(", ");
  return `Server error: ${error.message ?? "no message"}${details ? ` (${details})` : ""}`;
}

/**
 * Connects the page's controls to `actions`: connect(), reconnect(), hangUp(),
 * connectIfIdle(), accessKeyChanged(), applySession(), sendText(text) → true once sent,
 * echoCancellationChanged(enabled), cameraChanged(on), pageHidden().
 */
export function wireControls(elements, actions) {
  elements.connect.addEventListener("click", () => actions.connect());
  elements.reconnect.addEventListener("click", () => actions.reconnect());
  elements.hangup.addEventListener("click", () => actions.hangUp());
  elements.accessKey.addEventListener("change", () => actions.accessKeyChanged());
  // Enter in the access key field connects, like pressing Connect.
  elements.accessForm.addEventListener("submit", (event) => {
    event.preventDefault();
    actions.connectIfIdle();
  });
  elements.sessionForm.addEventListener("submit", (event) => {
    event.preventDefault();
    if (elements.sessionForm.reportValidity()) actions.applySession();
  });
  elements.textForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = elements.textInput.value.trim();
    if (text && actions.sendText(text)) elements.textInput.value = "";
  });
  elements.echoCancellation.addEventListener("change", () => {
    actions.echoCancellationChanged(elements.echoCancellation.checked);
  });
  elements.cameraToggle.addEventListener("change", () => actions.cameraChanged(elements.cameraToggle.checked));
  window.addEventListener("pagehide", () => actions.pageHidden());
}
