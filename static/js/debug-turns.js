// The operator page (static/debug/timeline.html): recent sessions' turn timelines from
// GET /debug/turns, drawn as the call page draws its own (timeline-draw.js), and the recordings
// (GET /debug/recordings): one chosen, its timeline.json is drawn the same way and its audio.wav
// (both sides on the session's clock) plays, a playhead following it over the turns; clicking a
// turn seeks there. The API key, when the server asks for one, is the call page's remembered
// one (localStorage) or typed here.
//
// A recording's lanes are its measured levels (timeline.json's levels: dBFS per step_ms on the
// session's clock); /debug/turns keeps no audio, so its lanes are the speech and answer spans
// at a constant level.
//
// window.omniReplay (read by tests/e2e/test_browser_timeline.py): sessionId (the recording
// shown, or null), playheadMs and moves (the playhead's last time and how often it moved), turns
// (as drawn, the shape of the call page's window.omniTimeline turns: {index, startMs, endMs,
// marks: [{kind, atMs, label}], user / assistant: [{t, db}], latency}, ms on the session's clock).

import { drawTurn, turnScale } from "./timeline-draw.js";

const ACCESS_KEY_STORAGE = "omni-rtc.apiKey";   // the call page's (signaling.js)
const SPAN_STEP_MS = 20;        // a span is drawn as a level this often
const SPAN_LEVEL_DB = -20;      // ... at this level: the server keeps spans, not levels
// A recording's turn shows its levels from this long before its first mark (the VAD reports
// speech a few hundred ms after it began; the call page's lanes take as much).
const LEVEL_PRE_ROLL_MS = 1000;

const sessionsElement = document.getElementById("sessions");
const errorElement = document.getElementById("debug-error");
const keyForm = document.getElementById("debug-key");
const keyInput = document.getElementById("debug-key-input");
const recordingsElement = document.getElementById("recordings");
const replayElement = document.getElementById("replay");
const replayTitle = document.getElementById("replay-title");
const replayTurns = document.getElementById("replay-turns");
const player = document.getElementById("replay-audio");
const playheadNote = document.getElementById("replay-at");

// The chosen recording's drawn turns: {figure, playhead, scale}; and what the tests read.
let replayed = [];
window.omniReplay = { sessionId: null, playheadMs: null, moves: 0, turns: [] };

function accessHeaders() {
  const key = keyInput.value || localStorage.getItem(ACCESS_KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** A span {start_ms, end_ms} as lane points. */
function spanPoints(span) {
  if (!span) return [];
  const points = [];
  for (let t = span.start_ms; t <= span.end_ms; t += SPAN_STEP_MS) points.push({ t, db: SPAN_LEVEL_DB });
  return points;
}

/** One side's levels (a recording's timeline.json levels.input or .output) from `fromMs` to `toMs` as lane points. */
function levelPoints(levels, values, fromMs, toMs) {
  const step = levels.step_ms;
  const points = [];
  for (let i = Math.max(0, Math.floor(fromMs / step)); i < values.length && i * step <= toMs; i += 1) {
    points.push({ t: i * step, db: values[i] });
  }
  return points;
}

/** A turn of /debug/turns or of a recording as drawTurn takes it: its lanes from `levels`
 * (timeline.json's) when given, else from its spans. */
export function drawable(turn, index, levels = null) {
  const marks = turn.marks.map((mark) => ({ kind: mark.kind, atMs: mark.at_ms, label: mark.label }));
  const times = marks.map((mark) => mark.atMs);
  const startMs = Math.min(...times);
  const endMs = Math.max(...times);
  return {
    index,
    startMs,
    endMs,
    marks,
    user: levels ? levelPoints(levels, levels.input, startMs - LEVEL_PRE_ROLL_MS, endMs) : spanPoints(turn.user_speech),
    assistant: levels ? levelPoints(levels, levels.output, startMs - LEVEL_PRE_ROLL_MS, endMs)
      : spanPoints(turn.answer_audio),
    latency: turn.latency,
  };
}

/** One turn's figure: its canvas (in a box a playhead may cover) and caption, drawn; its lanes
 * from `levels` when given (a recording's). */
function turnFigure(turn, index, levels = null) {
  const figure = document.createElement("figure");
  figure.className = "turn-timeline";
  figure.dataset.responseId = turn.response_id;
  const box = document.createElement("div");
  box.className = "turn-canvas";
  const canvas = document.createElement("canvas");
  const caption = document.createElement("figcaption");
  box.append(canvas);
  figure.append(box, caption);
  const drawn = drawable(turn, index, levels);
  drawTurn(canvas, caption, drawn, drawn.endMs);
  caption.textContent += ` · ${turn.status ?? "no response.done"}${turn.truncated ? " · cut" : ""}`;
  return { figure, box, canvas, drawn };
}

function showSessions(sessions) {
  sessionsElement.replaceChildren();
  for (const session of [...sessions].reverse()) {
    const section = document.createElement("section");
    section.className = "debug-session";
    const heading = document.createElement("h2");
    const started = new Date(session.started_at * 1000).toISOString().replace("T", " ").slice(0, 19);
    const state = session.closed_ms === null ? "open" : `closed after ${(session.closed_ms / 1000).toFixed(1)} s`;
    heading.textContent = `${session.session_id} · ${session.transport} · ${session.worker === "front" ? "server process" : `media worker ${session.worker}`} · ${started} UTC · ${state}`;
    section.append(heading);
    if (!session.turns.length) {
      const none = document.createElement("p");
      none.className = "note";
      none.textContent = "No turns.";
      section.append(none);
    }
    session.turns.forEach((turn, index) => section.append(turnFigure(turn, index).figure));
    sessionsElement.append(section);
  }
}

// -- recordings ----------------------------------------------------------------------------

function showRecordings(listing) {
  recordingsElement.replaceChildren();
  if (!listing.recordings.length) {
    const none = document.createElement("p");
    none.className = "note";
    none.textContent = listing.recording ? "No recordings yet." : "The server records nothing (no --record-dir).";
    recordingsElement.append(none);
    return;
  }
  const list = document.createElement("ul");
  list.className = "recording-list";
  for (const recording of listing.recordings) {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.sessionId = recording.session_id;
    button.textContent = recording.session_id;
    button.disabled = recording.ended === null;
    button.addEventListener("click", () => replay(recording.session_id));
    const about = document.createElement("span");
    about.className = "note";
    const started = recording.started.replace("T", " ").slice(0, 19);
    const length = recording.ended === null ? "still being written"
      : `${((Date.parse(recording.ended) - Date.parse(recording.started)) / 1000).toFixed(1)} s`;
    about.textContent = ` ${recording.transport ?? "?"} · ${started} UTC · ${length} · ${recording.turns ?? "?"} turns`
      + ` · ${(recording.bytes / 1024).toFixed(0)} KiB`;
    item.append(button, about);
    list.append(item);
  }
  recordingsElement.append(list);
}

async function replay(sessionId) {
  const base = `/debug/recordings/${encodeURIComponent(sessionId)}`;
  errorElement.textContent = "";
  let response;
  try {
    response = await fetch(`${base}/timeline.json`, { headers: accessHeaders() });
  } catch (error) {
    errorElement.textContent = `The server did not answer: ${error.message}`;
    return;
  }
  if (!response.ok) {
    errorElement.textContent = `GET ${base}/timeline.json: HTTP ${response.status}`;
    return;
  }
  const timeline = await response.json();
  replayTitle.textContent = `${sessionId} · ${timeline.transport} · ${timeline.turns.length} turns`;
  replayTurns.replaceChildren();
  // A timeline.json with no levels is drawn from its spans, as /debug/turns is.
  const levels = timeline.levels ?? null;
  const drawnTurns = [];
  replayed = timeline.turns.map((turn, index) => {
    const { figure, box, canvas, drawn } = turnFigure(turn, index, levels);
    drawnTurns.push(drawn);
    const playhead = document.createElement("div");
    playhead.className = "playhead";
    playhead.hidden = true;
    box.append(playhead);
    const scale = turnScale(drawn, drawn.endMs);
    canvas.addEventListener("click", (event) => {
      const fraction = event.offsetX / canvas.clientWidth;
      player.currentTime = Math.max(0, scale.timeAt(fraction) / 1000);
      movePlayhead();
    });
    replayTurns.append(figure);
    return { playhead, scale };
  });
  if (!replayTurns.children.length) {
    const none = document.createElement("p");
    none.className = "note";
    none.textContent = "No turns.";
    replayTurns.append(none);
  }
  replayElement.hidden = false;
  window.omniReplay = { sessionId, playheadMs: null, moves: 0, turns: drawnTurns };
  player.src = `${base}/audio.wav`;
  // An <audio> sends no Authorization header: where the key is needed, the WAV is fetched whole.
  player.onerror = async () => {
    if (!Object.keys(accessHeaders()).length || player.src.startsWith("blob:")) {
      errorElement.textContent = `The recording's audio did not load (GET ${base}/audio.wav).`;
      return;
    }
    try {
      const wav = await fetch(`${base}/audio.wav`, { headers: accessHeaders() });
      if (wav.ok) player.src = URL.createObjectURL(await wav.blob());
      else errorElement.textContent = `GET ${base}/audio.wav: HTTP ${wav.status}`;
    } catch (error) {
      errorElement.textContent = `The server did not answer: ${error.message}`;
    }
  };
}

/** The playhead at the player's time on the turn that shows it. */
function movePlayhead() {
  const ms = player.currentTime * 1000;
  for (const { playhead, scale } of replayed) {
    const shown = ms >= scale.from && ms <= scale.to;
    playhead.hidden = !shown;
    if (shown) playhead.style.left = `${(scale.fraction(ms) * 100).toFixed(3)}%`;
  }
  playheadNote.textContent = `${(ms / 1000).toFixed(2)} s`;
  if (window.omniReplay.playheadMs !== ms) window.omniReplay.moves += 1;
  window.omniReplay.playheadMs = ms;
}

function followPlayback() {
  movePlayhead();
  if (!player.paused && !player.ended) requestAnimationFrame(followPlayback);
}

player.addEventListener("play", () => requestAnimationFrame(followPlayback));
player.addEventListener("seeked", movePlayhead);
player.addEventListener("timeupdate", movePlayhead);

async function loadRecordings(headers) {
  const response = await fetch("/debug/recordings", { headers });
  if (!response.ok) {
    errorElement.textContent = `GET /debug/recordings: HTTP ${response.status}`;
    return;
  }
  showRecordings(await response.json());
}

async function load() {
  const headers = accessHeaders();
  errorElement.textContent = "";
  let response;
  try {
    response = await fetch("/debug/turns", { headers });
  } catch (error) {
    errorElement.textContent = `The server did not answer: ${error.message}`;
    return;
  }
  if (response.status === 403 || response.status === 401) {
    keyForm.hidden = false;
    errorElement.textContent = "The server wants its API key for this page.";
    return;
  }
  if (!response.ok) {
    errorElement.textContent = `GET /debug/turns: HTTP ${response.status}`;
    return;
  }
  keyForm.hidden = true;
  showSessions((await response.json()).sessions);
  await loadRecordings(headers);
  document.body.dataset.loaded = "true";
}

document.getElementById("refresh").addEventListener("click", () => load());
keyForm.addEventListener("submit", (event) => {
  event.preventDefault();
  load();
});
load();
