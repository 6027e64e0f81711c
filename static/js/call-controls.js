// Connecting, hanging up and reconnecting: the one live call, and the backoff after a drop.
// Also what is sent on the live call at the person's request (a typed message, the echo
// cancellation switch).

import { Call } from "./call.js";
import { Conversation } from "./conversation.js";
import { MicrophoneError } from "./microphone.js";
import { PageTools } from "./tools.js";

// Backoff for automatic reconnects after a dropped call: 1 s, 2 s, 4 s, 8 s, 16 s, then give up.
const RECONNECT_DELAYS_MS = [1000, 2000, 4000, 8000, 16000];

export class CallControls {
  constructor({ view, transcript, signaling, sessionControls, hook, remoteAudio, camera, timeline }) {
    this.camera = camera;
    this.timeline = timeline;
    this.view = view;
    this.transcript = transcript;
    this.signaling = signaling;
    this.sessionControls = sessionControls;
    this.hook = hook;
    this.remoteAudio = remoteAudio;
    this.call = null;            // the live Call, or null
    this.userHungUp = true;      // false while the person wants to be connected
    this.reconnectAttempt = 0;
    this.reconnectTimer = null;
  }

  /** The Connect button (and Enter in the access key field while not connected). */
  connectNow() {
    this.reconnectAttempt = 0;
    this.connect();
  }

  connectIfIdle() {
    if (!this.call) this.connectNow();
  }

  /** The Reconnect button, shown once automatic reconnects are underway or gave up. */
  reconnectNow() {
    this.reconnectAttempt = 0;
    this.view.showReconnect(false);
    this.connect();
  }

  hangUp() {
    this.reconnectAttempt = 0;
    this.view.showReconnect(false);
    this.endCall();
  }

  async connect() {
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    this.userHungUp = false;
    if (this.call) this.call.close();
    let thisCall = null;
    const tools = new PageTools({ transcript: this.transcript, send: (event) => thisCall?.send(event) });
    const conversation = new Conversation({
      transcript: this.transcript,
      sessionControls: this.sessionControls,
      view: this.view,
      latencyRecords: this.hook.latencies,
      tools,
    });
    thisCall = new Call({
      signaling: this.signaling,
      conversation,
      view: this.view,
      hook: this.hook,
      remoteAudio: this.remoteAudio,
      camera: this.camera,
      timeline: this.timeline,
      owner: this,
    });
    this.call = thisCall;
    this.view.setState(this.reconnectAttempt > 0 ? "reconnecting" : "connecting");
    this.view.enableConnect(false);
    this.view.enableHangUp(true);
    try {
      await thisCall.open(this.view.echoCancellation);
    } catch (error) {
      if (this.call !== thisCall) return;   // hung up (or replaced) while connecting
      thisCall.close();
      this.call = null;
      this.view.showError(error.message);
      if (error instanceof MicrophoneError || this.reconnectAttempt === 0) {
        // A first connect that fails is shown, not retried: the person is looking at it.
        this.endCall();
      } else {
        this.scheduleReconnect();
      }
    }
  }

  callOpened(call) {
    this.reconnectAttempt = 0;
    this.view.showReconnect(false);
    // Like OpenAI's clients: configure the session right away, without waiting for
    // session.created; the server answers with session.updated (the effective session).
    const update = this.sessionControls.updateEvent();
    Object.assign(update.session, call.conversation.tools.sessionFields());
    call.send(update);
    this.view.setConnectedControls(true);
    call.renderState();
  }

  callDropped(call, reason) {
    if (call !== this.call) return;
    this.view.showError(`Call dropped: ${reason}.`);
    call.close();
    this.call = null;
    this.scheduleReconnect();
  }

  scheduleReconnect() {
    if (this.userHungUp) return;
    if (this.reconnectAttempt >= RECONNECT_DELAYS_MS.length) {
      this.view.showError("Could not reconnect. Press Reconnect to try again.");
      this.endCall();
      this.view.showReconnect(true);
      return;
    }
    const delay = RECONNECT_DELAYS_MS[this.reconnectAttempt];
    this.reconnectAttempt += 1;
    this.view.setState(
      "reconnecting",
      `Connection lost — reconnecting in ${delay / 1000} s (attempt ${this.reconnectAttempt} of ${RECONNECT_DELAYS_MS.length})`,
    );
    this.view.setConnectedControls(false);
    this.view.enableHangUp(true);
    this.view.showReconnect(true);
    this.transcript.addDivider("Reconnecting: the server starts a new session.");
    this.reconnectTimer = setTimeout(() => this.connect(), delay);
  }

  endCall() {
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    if (this.call) this.call.close();
    this.call = null;
    this.userHungUp = true;
    this.view.setConnectedControls(false);
    this.view.enableConnect(true);
    this.view.enableHangUp(false);
    this.view.setState("idle");
  }

  /** Sends a typed message and asks for its answer; true once the message went out. */
  sendText(text) {
    const call = this.call;
    if (!call) return false;
    // A typed message while the assistant is answering interrupts it, as speaking would: clearing
    // the output also cancels the response (a second one cannot start while one is active).
    if (call.conversation.answering) call.send({ type: "output_audio_buffer.clear" });
    const sent = call.send({
      type: "conversation.item.create",
      item: { type: "message", role: "user", content: [{ type: "input_text", text }] },
    });
    if (!sent) return false;
    call.conversation.textSent();
    call.send({ type: "response.create" });
    call.renderState();
    return true;
  }

  switchMicrophone(echoCancellation) {
    if (!this.call?.pc) return;
    this.call.switchMicrophone(echoCancellation).catch((error) => this.view.showError(error.message));
  }

  pageHidden() {
    if (this.call) this.call.close();
  }
}
