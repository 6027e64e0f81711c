// One WebRTC call to the server, made the way OpenAI's browser example makes one:
// getUserMedia → RTCPeerConnection + microphone track + "oai-events" data channel → SDP offer
// POSTed to the server → SDP answer. Everything here lives exactly as long as one connection;
// close() releases it all and is safe to call twice.

import { LevelMeter, openMicrophone } from "./microphone.js";

// ICE "disconnected" often heals by itself within a few seconds (Wi-Fi hiccup); only a
// disconnect that lasts this long is treated as a dropped call.
const DISCONNECT_GRACE_MS = 4000;
// The event channel opens a round trip or two after the connection does (SCTP over DTLS); a call
// whose channel is still closed this long after its connection came up cannot be used (no event
// either way) and is treated as dropped, so that the page tries again instead of waiting for ever.
const CHANNEL_OPEN_DEADLINE_MS = 10000;
// getStats() poll period while an answer's first sound is awaited: the browser latency
// figure is accurate to about this much.
const STATS_POLL_MS = 50;

export class Call {
  /**
   * `owner` hears of the call's life: callOpened(call) once the event channel opens,
   * callDropped(call, reason) when the connection is lost.
   */
  constructor({ signaling, conversation, view, hook, remoteAudio, camera, owner, timeline }) {
    this.camera = camera;
    this.timeline = timeline;   // the call's turn timeline (timeline.js)
    this.signaling = signaling;
    this.conversation = conversation;
    this.view = view;
    this.hook = hook;
    this.remoteAudio = remoteAudio;
    this.owner = owner;
    this.pc = null;
    this.dc = null;
    this.micStream = null;
    this.meter = new LevelMeter((percent) => view.setMeter(percent));
    this.statsTimer = null;
    this.disconnectTimer = null;
    this.channelTimer = null;
    this.closed = false;
    this.location = null;         // the call's URL on the server (Location of the answer)
  }

  get isOpen() {
    return this.dc?.readyState === "open";
  }

  async open(echoCancellation) {
    const micStream = await openMicrophone(echoCancellation);
    if (this.closed) {   // hung up while the browser asked for the microphone
      for (const track of micStream.getTracks()) track.stop();
      return;
    }
    this.micStream = micStream;
    this.meter.start(micStream);
    this.timeline.begin(micStream);

    // Asked for each call, after the microphone (whose prompt may wait long): TURN credentials are fresh.
    const iceServers = await this.signaling.iceServers();
    if (this.closed) return;
    this.pc = new RTCPeerConnection({ iceServers });
    this.hook.pc = this.pc;
    // No jitterBufferTarget on the receiver: libwebrtc takes it as a floor under NetEq's adaptive
    // delay (SetBaseMinimumPlayoutDelayMs, 0 when unset), so nothing lower can be asked for.
    this.pc.ontrack = (event) => {
      this.remoteAudio.srcObject = event.streams[0] ?? new MediaStream([event.track]);
      this.timeline.remoteStream(this.remoteAudio.srcObject);
    };
    this.pc.onconnectionstatechange = () => this.onConnectionState();
    for (const track of this.micStream.getAudioTracks()) this.pc.addTrack(track, this.micStream);
    this.camera.attach(this.pc);  // sendonly video, the camera's track while it is on

    this.dc = this.pc.createDataChannel("oai-events");
    this.hook.dc = this.dc;
    this.dc.onopen = () => this.owner.callOpened(this);
    this.dc.onmessage = (message) => this.onChannelMessage(message);
    this.dc.onclose = () => {
      if (!this.closed) this.dropped("the event channel closed");
    };

    const offer = await this.pc.createOffer();
    await this.pc.setLocalDescription(offer);
    const answer = await this.signaling.postOffer(offer.sdp);
    this.location = answer.location;
    this.hook.callUrl = answer.location;
    if (this.closed) {
      this.signaling.endCall(this.location);
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
    clearTimeout(this.channelTimer);
    if (this.dc) this.dc.close();
    if (this.pc) {
      this.camera.detach();
      this.pc.close();
    }
    if (this.micStream) for (const track of this.micStream.getTracks()) track.stop();
    // The server notices a closed peer connection by itself; telling it as well frees the
    // session at once, even when the close never reaches it (network gone).
    if (this.location) this.signaling.endCall(this.location);
    if (this.hook.pc === this.pc) this.hook.pc = null;
    if (this.hook.dc === this.dc) this.hook.dc = null;
    this.remoteAudio.srcObject = null;
    this.meter.close();
    this.timeline.end();
  }

  send(event) {
    if (!this.isOpen) {
      this.view.showError("Not connected: the message was not sent.");
      return false;
    }
    this.hook.sent.push(event);
    this.dc.send(JSON.stringify(event));
    this.timeline.clientEvent(event, performance.now());
    return true;
  }

  renderState() {
    if (this.closed) return;
    const state = this.conversation.state(this.isOpen);
    if (state !== null) this.view.setState(state);
  }

  onConnectionState() {
    const state = this.pc.connectionState;
    if (state === "connected") {
      clearTimeout(this.disconnectTimer);
      this.disconnectTimer = null;
      if (!this.isOpen && this.channelTimer === null) {
        this.channelTimer = setTimeout(() => {
          if (!this.isOpen) this.dropped("the event channel did not open");
        }, CHANNEL_OPEN_DEADLINE_MS);
      }
    } else if (state === "failed") {
      this.dropped("the connection failed");
    } else if (state === "disconnected" && this.disconnectTimer === null) {
      this.disconnectTimer = setTimeout(() => this.dropped("the connection was interrupted"), DISCONNECT_GRACE_MS);
    } else if (state === "closed" && !this.closed) {
      this.dropped("the server closed the call");
    }
  }

  dropped(reason) {
    if (!this.closed) this.owner.callDropped(this, reason);
  }

  onChannelMessage(message) {
    const arrivedAt = performance.now();
    let event;
    try {
      event = JSON.parse(message.data);
    } catch (error) {
      this.view.showError(`The server sent a message that is not JSON: ${String(message.data).slice(0, 80)}`);
      return;
    }
    this.hook.events.push(event);
    this.hook.eventTimes.push(arrivedAt);
    this.timeline.serverEvent(event, arrivedAt);
    this.conversation.handle(event);
    this.renderState();
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
      this.conversation.latency.audioEnergy(report.totalAudioEnergy ?? 0);
    }
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
    this.timeline.microphone(stream);
    this.meter.stop();
    this.meter.start(stream);
  }
}
