// The operator page (static/debug/timeline.html): recent sessions' turn timelines from
// GET /debug/turns, drawn as the call page draws its own (timeline-draw.js). The API key, when
// the server asks for one, is the call page's remembered one (localStorage) or typed here.

import { drawTurn } from "./timeline-draw.js";

const ACCESS_KEY_STORAGE = "omni-rtc.apiKey";   // the call page's (signaling.js)
const SPAN_STEP_MS = 20;        // a span is drawn as a level this often
const SPAN_LEVEL_DB = -20;      // ... at this level: the server keeps spans, not levels

const sessionsElement = document.getElementById("sessions");
const errorElement = document.getElementById("debug-error");
const keyForm = document.getElementById("debug-key");
const keyInput = document.getElementById("debug-key-input");

/** A span {start_ms, end_ms} as lane points. */
function spanPoints(span) {
  if (!span) return [];
  const points = [];
  for (let t = span.start_ms; t <= span.end_ms; t += SPAN_STEP_MS) points.push({ t, db: SPAN_LEVEL_DB });
  return points;
}

/** A turn of /debug/turns as drawTurn takes it. */
export function drawable(turn, index) {
  const marks = turn.marks.map((mark) => ({ kind: mark.kind, atMs: mark.at_ms, label: mark.label }));
  const times = marks.map((mark) => mark.atMs);
  return {
    index,
    startMs: Math.min(...times),
    endMs: Math.max(...times),
    marks,
    user: spanPoints(turn.user_speech),
    assistant: spanPoints(turn.answer_audio),
    latency: turn.latency,
  };
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
    session.turns.forEach((turn, index) => {
      const figure = document.createElement("figure");
      figure.className = "turn-timeline";
      figure.dataset.responseId = turn.response_id;
      const canvas = document.createElement("canvas");
      const caption = document.createElement("figcaption");
      figure.append(canvas, caption);
      section.append(figure);
      const drawn = drawable(turn, index);
      drawTurn(canvas, caption, drawn, drawn.endMs);
      caption.textContent += ` · ${turn.status ?? "no response.done"}${turn.truncated ? " · cut" : ""}`;
    });
    sessionsElement.append(section);
  }
}

async function load() {
  const key = keyInput.value || localStorage.getItem(ACCESS_KEY_STORAGE);
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
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
  document.body.dataset.loaded = "true";
}

document.getElementById("refresh").addEventListener("click", () => load());
keyForm.addEventListener("submit", (event) => {
  event.preventDefault();
  load();
});
load();
