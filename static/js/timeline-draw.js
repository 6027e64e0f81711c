// Draws one turn of a timeline on a canvas: the user's lane above, the assistant's below (level
// in dBFS, -70 to 0, as bars), a labelled vertical line per mark, and the latency split as text.
// Shared by the call page (timeline.js) and the operator page (debug-turns.js); a turn here is
// {startMs, endMs, marks: [{kind, atMs, label}], user, assistant: [{t, db}], latency}.

const WIDTH = 900;
const LANE_HEIGHT = 44;
const LABEL_ROWS = 6;     // close marks' labels stack in this many rows
const ROW_HEIGHT = 13;
const TOP = LABEL_ROWS * ROW_HEIGHT + 8;
const LANE_GAP = 8;
const HEIGHT = TOP + 2 * LANE_HEIGHT + LANE_GAP + 16;
const MIN_DB = -70;
const LEFT = 74;          // room for the lanes' names
const PAD_MS = 200;       // shown before the first mark and after the last
const QUIET_SHOWN_MS = 2000;  // of the current turn's silence after its last mark or sound
const HEARD_DB = -50;     // a sample this loud is sound (timeline.js HEARD_FLOOR_DB)

const MARK_COLOURS = {
  "input_audio_buffer.speech_started": "#1b6ac9",
  "input_audio_buffer.speech_stopped": "#1b6ac9",
  "input_audio_buffer.committed": "#0b3d7a",
  end_of_speech: "#1b6ac9",      // the server's marks (debug-turns.js)
  engine_started: "#7a4bc9",
  first_audio: "#1f8a4c",
  playback_end: "#1f8a4c",
  "response.created": "#7a4bc9",
  "output_audio_buffer.started": "#1f8a4c",
  "output_audio_buffer.stopped": "#1f8a4c",
  answer_heard: "#0d5e2f",
  "response.done": "#555",
  function_call: "#b5651d",
};
const CUT_COLOUR = "#c0392b";   // cleared, truncated, cancelled

/** The span of time a turn covers: its lanes and marks, padded. */
export function turnWindow(turn, nowMs) {
  const times = [turn.startMs, ...turn.marks.map((m) => m.atMs)];
  const first = turn.user[0]?.t ?? turn.startMs;
  // The current turn runs to now, but a long silence (the call left open) is not stretched out.
  const loud = [...turn.user, ...turn.assistant].filter((p) => p.db > HEARD_DB).map((p) => p.t);
  const end = turn.endMs ?? Math.min(nowMs, Math.max(...times, ...loud) + QUIET_SHOWN_MS);
  return { from: Math.min(first, ...times) - PAD_MS, to: Math.max(end, ...times) + PAD_MS };
}

/** A drawn turn's time axis: where a time (ms) falls, as a fraction of the canvas's width, and
 * which time a fraction of it shows (the operator page's playhead and seeking). */
export function turnScale(turn, nowMs) {
  const { from, to } = turnWindow(turn, nowMs);
  const span = Math.max(1, to - from);
  const plot = WIDTH - LEFT - 8;
  return {
    from,
    to,
    fraction: (t) => (LEFT + ((t - from) / span) * plot) / WIDTH,
    timeAt: (fraction) => from + ((fraction * WIDTH - LEFT) / plot) * span,
  };
}

export function drawTurn(canvas, caption, turn, nowMs) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = WIDTH * ratio;
  canvas.height = HEIGHT * ratio;
  canvas.style.width = "100%";
  canvas.style.maxWidth = `${WIDTH}px`;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, WIDTH, HEIGHT);
  const scale = turnScale(turn, nowMs);
  const { from, to } = scale;
  const x = (t) => scale.fraction(t) * WIDTH;
  g.font = "11px system-ui, sans-serif";
  g.textBaseline = "middle";
  lane(g, "you", turn.user, TOP, "#1b6ac9", x);
  lane(g, "assistant", turn.assistant, TOP + LANE_HEIGHT + LANE_GAP, "#1f8a4c", x);
  // Time axis: a tick per second from the turn's start.
  g.fillStyle = "#777";
  const axisY = TOP + 2 * LANE_HEIGHT + LANE_GAP + 9;
  for (let s = Math.ceil((from - turn.startMs) / 1000); turn.startMs + s * 1000 <= to; s += 1) {
    const tx = x(turn.startMs + s * 1000);
    g.fillRect(tx, axisY - 4, 1, 4);
    g.fillText(`${s} s`, tx + 2, axisY + 2);
  }
  const rowEnds = new Array(LABEL_ROWS).fill(-Infinity);   // where each row's last label ends
  for (const mark of [...turn.marks].sort((a, b) => a.atMs - b.atMs)) {
    const mx = x(mark.atMs);
    g.fillStyle = MARK_COLOURS[mark.kind] ?? CUT_COLOUR;
    g.fillRect(mx, TOP - 4, 1.5, 2 * LANE_HEIGHT + LANE_GAP + 4);
    const width = g.measureText(mark.label).width;
    const left = Math.min(mx + 2, WIDTH - width - 2);
    let row = rowEnds.findIndex((end) => end < left);
    if (row < 0) row = rowEnds.indexOf(Math.min(...rowEnds));
    rowEnds[row] = left + width + 4;
    g.fillText(mark.label, left, 7 + row * ROW_HEIGHT);
  }
  caption.textContent = describe(turn);
}

function lane(g, name, points, top, colour, x) {
  g.fillStyle = "#f2f4f7";
  g.fillRect(LEFT, top, WIDTH - LEFT - 8, LANE_HEIGHT);
  g.fillStyle = "#333";
  g.fillText(name, 4, top + LANE_HEIGHT / 2);
  g.fillStyle = colour;
  for (let i = 0; i < points.length; i += 1) {
    const { t, db } = points[i];
    const height = (Math.max(0, db - MIN_DB) / -MIN_DB) * LANE_HEIGHT;
    if (height <= 0) continue;
    const next = points[i + 1]?.t ?? t + 20;
    g.fillRect(x(t), top + (LANE_HEIGHT - height) / 2, Math.max(1, x(next) - x(t)), height);
  }
}

/** The turn's latency split (response.done's latency block), in words. */
export function describe(turn) {
  const latency = turn.latency;
  if (!latency) return `Turn ${turn.index + 1}: no latency reported (yet).`;
  const ms = (value) => (value === null || value === undefined ? "–" : `${Math.round(value)} ms`);
  return `Turn ${turn.index + 1}: end of speech → first audio ${ms(latency.end_of_speech_to_first_audio_ms)}`
    + ` = silence wait ${ms(latency.silence_wait_ms)} + model ${ms(latency.engine_first_audio_ms)}`
    + ` (of which queued ${ms(latency.queue_wait_ms)}) + other ${ms(latency.other_ms)}`
    + (latency.speculative ? `; speculative, ${ms(latency.speculation_hidden_ms)} ahead of the commit` : "");
}
