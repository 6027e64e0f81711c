// The current call's turn timeline: per turn, the user's and the assistant's audio level as two
// lanes and a mark for each event the page saw, at its arrival on the page's clock
// (performance.now()), with the server's latency split from response.done. Drawn on a canvas
// per turn inside the collapsed "Turn timeline" <details> below the conversation.
//
// window.omniTimeline (read by tests/e2e/test_browser_timeline.py):
//   callStartMs        performance.now() when the call's microphone opened, or null
//   turns              one per turn, oldest first: {index, startMs, endMs (null while current),
//                      marks: [{kind, atMs, label, responseId}], user / assistant: [{t, db}]
//                      (t: performance.now() ms, db: dBFS of that 21 ms window), latency
//                      (response.done's latency block, or null), responseId}

import { drawTurn } from "./timeline-draw.js";

// Both lanes are sampled this often (ms): a mark is placed to the event's own time, the lanes to
// within one sample.
const SAMPLE_INTERVAL_MS = 20;
// Audio this loud (dBFS) counts as heard: the fake microphone's and the answers' speech is
// above -40, decoded Opus silence below -90.
export const HEARD_FLOOR_DB = -50;
// A new turn takes this much of the lanes from before its first event: the VAD reports speech a
// few hundred ms after it began.
const PRE_ROLL_MS = 1000;
// The turns the page keeps for one call (a long call's oldest are dropped), and how long a
// turn's lanes run from its start (a two-minute story fits): at most 50 × 2 × 6000 samples.
const MAX_TURNS = 50;
const MAX_LANE_MS = 120_000;

// The server events that get a mark, and its label.
const SERVER_MARKS = {
  "input_audio_buffer.speech_started": "speech started",
  "input_audio_buffer.speech_stopped": "speech stopped",
  "input_audio_buffer.committed": "committed",
  "response.created": "response created",
  "output_audio_buffer.started": "audio started",
  "output_audio_buffer.stopped": "audio stopped",
  "output_audio_buffer.cleared": "output cleared",
  "conversation.item.truncated": "truncated",
  "response.done": "response done",
};
// The client events (sent by the page) that get a mark.
const CLIENT_MARKS = {
  "response.cancel": "cancel sent",
  "conversation.item.truncate": "truncate sent",
  "output_audio_buffer.clear": "clear sent",
  "conversation.item.create": "message sent",   // a typed message; a function's output: "output sent"
};

class LevelLane {
  /** One stream's level through an AnalyserNode of `context`. */
  constructor(context, stream) {
    this.analyser = context.createAnalyser();
    this.analyser.fftSize = 1024;
    this.source = context.createMediaStreamSource(stream);
    this.source.connect(this.analyser);
    this.samples = new Float32Array(this.analyser.fftSize);
  }

  /** The level now, in dBFS. */
  db() {
    this.analyser.getFloatTimeDomainData(this.samples);
    let sum = 0;
    for (const sample of this.samples) sum += sample * sample;
    return 20 * Math.log10(Math.sqrt(sum / this.samples.length) + 1e-9);
  }

  disconnect() {
    this.source.disconnect();
  }
}

export class Timeline {
  /** `container`: the element the turns' canvases go in; `target`: where omniTimeline is published. */
  constructor(container, target) {
    this.container = container;
    this.state = { callStartMs: null, turns: [] };
    target.omniTimeline = this.state;
    this.context = null;
    this.user = null;
    this.assistant = null;
    this.timer = null;
    this.awaitingHeard = null;   // the turn whose answer's first sound is awaited
    this.recent = { user: [], assistant: [] };  // the last PRE_ROLL_MS of samples
  }

  /** A new call: forgets the last call's turns and starts sampling the microphone. */
  begin(micStream) {
    this.end();
    this.state.callStartMs = performance.now();
    this.state.turns.length = 0;
    this.container.replaceChildren();
    this.context = new AudioContext();
    this.context.resume().catch((error) => console.error("the timeline's AudioContext did not start", error));
    this.user = new LevelLane(this.context, micStream);
    this.timer = setInterval(() => this.sample(), SAMPLE_INTERVAL_MS);
  }

  /** The answer's track arrived (the page also plays it in an <audio> element). */
  remoteStream(stream) {
    if (!this.context) return;
    this.assistant?.disconnect();
    this.assistant = new LevelLane(this.context, stream);
  }

  /** The microphone was switched. */
  microphone(stream) {
    if (!this.context) return;
    this.user?.disconnect();
    this.user = new LevelLane(this.context, stream);
  }

  end() {
    clearInterval(this.timer);
    this.timer = null;
    this.user?.disconnect();
    this.assistant?.disconnect();
    this.user = this.assistant = null;
    this.context?.close().catch((error) => console.error("closing the timeline's AudioContext failed", error));
    this.context = null;
    const current = this.current();
    if (current && current.endMs === null) current.endMs = performance.now();
    this.render();
  }

  current() {
    return this.state.turns.at(-1) ?? null;
  }

  sample() {
    const t = performance.now();
    for (const [name, lane] of [["user", this.user], ["assistant", this.assistant]]) {
      const point = { t, db: lane ? lane.db() : -Infinity };
      const recent = this.recent[name];
      recent.push(point);
      while (recent.length && recent[0].t < t - PRE_ROLL_MS) recent.shift();
      const turn = this.current();
      if (turn && t - turn.startMs <= MAX_LANE_MS) turn[name].push(point);
    }
    const waiting = this.awaitingHeard;
    const last = this.current()?.assistant.at(-1);
    // Counted once the server says it began sending: before, the lane may still hold the
    // previous answer's tail (a barge-in).
    const sending = waiting?.marks.some((mark) => mark.kind === "output_audio_buffer.started");
    if (sending && last && last.db > HEARD_FLOOR_DB) {
      this.addMark(waiting, "answer_heard", t, "answer heard", waiting.responseId);
      this.awaitingHeard = null;
    }
    if (this.container.closest("details")?.open) this.renderCurrent();
  }

  startTurn(at) {
    const previous = this.current();
    if (previous && previous.endMs === null) previous.endMs = at;
    const turn = {
      index: (previous?.index ?? -1) + 1,
      startMs: at,
      endMs: null,
      marks: [],
      user: this.recent.user.filter((point) => point.t < at),
      assistant: this.recent.assistant.filter((point) => point.t < at),
      latency: null,
      responseId: null,
    };
    this.state.turns.push(turn);
    if (this.state.turns.length > MAX_TURNS) this.state.turns.shift();
    return turn;
  }

  addMark(turn, kind, atMs, label, responseId = null) {
    turn.marks.push({ kind, atMs, label, responseId });
  }

  /** A server event, arrived at `at` (performance.now()). */
  serverEvent(event, at) {
    if (event.type === "response.output_item.done" && event.item?.type === "function_call") {
      this.functionCall(event.item.name, event.response_id, at);
      return;
    }
    const label = SERVER_MARKS[event.type];
    if (!label) return;
    let turn = this.current();
    // A turn opens with the user's speech, or with a response the page did not see begin
    // (a typed message opens one itself).
    const opensTurn = event.type === "input_audio_buffer.speech_started"
      || (event.type === "response.created" && (!turn || turn.responseId !== null));
    if (!turn || opensTurn) turn = this.startTurn(at);
    const responseId = event.response?.id ?? event.response_id ?? null;
    if (event.type === "response.created") {
      turn.responseId = responseId;
      this.awaitingHeard = turn;
    } else if (responseId !== null) {
      // A response's events go to the turn it was created in (a barge-in opened the next one).
      turn = this.state.turns.findLast((t) => t.responseId === responseId) ?? turn;
    }
    this.addMark(turn, event.type, at, label, responseId);
    if (event.type === "response.done") {
      turn.latency = event.latency ?? null;
      if (this.awaitingHeard === turn && !turn.marks.some((m) => m.kind === "output_audio_buffer.started")) {
        this.awaitingHeard = null;   // nothing of it is to be heard (cancelled before its audio, or text only)
      }
    }
    this.render();
  }

  /** A client event the page sent, at `at`. */
  clientEvent(event, at) {
    let label = CLIENT_MARKS[event.type];
    if (!label) return;
    const typed = event.type === "conversation.item.create" && event.item?.type === "message";
    if (event.type === "conversation.item.create" && !typed) label = "output sent";
    let turn = this.current();
    // A typed message opens a turn; a function's output and the answer it asks for stay on the
    // turn of the call.
    if (typed || !turn) turn = this.startTurn(at);
    this.addMark(turn, event.type, at, label);
    this.render();
  }

  /** A function call item the model wrote (response.output_item.done of type function_call). */
  functionCall(name, responseId, at) {
    const turn = this.state.turns.findLast((t) => t.responseId === responseId) ?? this.current();
    if (turn) this.addMark(turn, "function_call", at, `call ${name}`, responseId);
    this.render();
  }

  render() {
    const turns = this.state.turns;
    while (this.container.children.length > turns.length) this.container.firstElementChild.remove();
    for (let i = 0; i < turns.length; i += 1) this.renderTurn(turns[i], i);
  }

  renderCurrent() {
    const turns = this.state.turns;
    if (turns.length) this.renderTurn(turns.at(-1), turns.length - 1);
  }

  renderTurn(turn, position) {
    let figure = this.container.children[position];
    if (!figure || figure.dataset.turn !== String(turn.index)) {
      figure = document.createElement("figure");
      figure.className = "turn-timeline";
      figure.dataset.turn = String(turn.index);
      figure.append(document.createElement("canvas"), document.createElement("figcaption"));
      if (this.container.children[position]) this.container.children[position].replaceWith(figure);
      else this.container.append(figure);
    }
    drawTurn(figure.querySelector("canvas"), figure.querySelector("figcaption"), turn, performance.now());
  }
}
