// Answer latency, per response of one call: the browser's own measurement (end of the turn →
// the answer's first sound) and the server's breakdown from response.done, shown on the
// answer's meta line and kept in the test hook's `latencies`.

// inbound-rtp totalAudioEnergy grows by level² × seconds; decoded Opus silence adds ~0,
// the quietest real speech (-50 dBFS over one 20 ms frame) adds 2e-7.
const AUDIO_ENERGY_EPSILON = 1e-7;
// An answer's first sound is energy after at least this much quiet: the previous answer's tail
// still plays from the browser's jitter buffer (~100-200 ms) after the server says "stopped".
const ANSWER_ONSET_QUIET_MS = 250;

export class LatencyTracker {
  /** `records`: the array each new latency record is appended to (the test hook's). */
  constructor(transcript, records) {
    this.transcript = transcript;
    this.records = records;
    // The moment the current turn's input ended, and what ended it: "speech" or "text".
    this.turnEndedAt = null;
    this.turnInput = "speech";
    this.responses = new Map();   // response id → {latency record, itemIds, serverLatency}
    this.pending = null;          // the record awaiting its first sound
    this.lastAudioEnergy = 0;
    this.lastSoundAt = -Infinity;  // performance.now() of the last report that found energy
  }

  turnEnded(input, at) {
    this.turnInput = input;
    this.turnEndedAt = at;
  }

  responseCreated(responseId) {
    const latency = {
      responseId,
      from: this.turnInput,
      fromMs: this.turnEndedAt,
      firstAudioEventMs: null,
      firstAudioEnergyMs: null,
    };
    this.turnEndedAt = null;
    this.responses.set(responseId, { latency, itemIds: [], serverLatency: null });
    this.pending = latency;
    this.records.push(latency);
  }

  outputItemAdded(responseId, itemId) {
    this.responses.get(responseId)?.itemIds.push(itemId);
  }

  // `serverLatency` is this server's extension of response.done (app/realtime/protocol/objects.py ResponseLatency).
  // The latency record stays pending: output_audio_buffer.started may come after response.done
  // (the server reports playback as it happens), and the next response replaces it.
  responseDone(responseId, itemIds, serverLatency) {
    const record = this.responses.get(responseId);
    if (!record) return;
    if (itemIds.length) record.itemIds = itemIds;
    record.serverLatency = serverLatency ?? null;
    this.render(record);
  }

  /** `field`: "firstAudioEventMs" or "firstAudioEnergyMs"; `responseId` null matches any. */
  firstAudio(responseId, field) {
    const latency = this.pending;
    if (!latency || (responseId && latency.responseId !== responseId)) return;
    if (latency[field] === null) latency[field] = performance.now();
    if (latency.firstAudioEventMs !== null && latency.firstAudioEnergyMs !== null) this.pending = null;
    const record = this.responses.get(latency.responseId);
    if (record) this.render(record);
  }

  /** One inbound-rtp audio report's totalAudioEnergy, polled through getStats(). */
  audioEnergy(energy) {
    if (energy - this.lastAudioEnergy > AUDIO_ENERGY_EPSILON) {
      const now = performance.now();
      if (this.pending && now - this.lastSoundAt >= ANSWER_ONSET_QUIET_MS) {
        this.firstAudio(null, "firstAudioEnergyMs");
      }
      this.lastSoundAt = now;
    }
    this.lastAudioEnergy = energy;
  }

  render(record) {
    const { latency } = record;
    const parts = [];
    const heard = latency.firstAudioEnergyMs ?? latency.firstAudioEventMs;
    const since = latency.from === "text" ? "sending" : "end of speech";
    if (heard !== null && latency.fromMs !== null) {
      parts.push(`Answer began ${Math.round(heard - latency.fromMs)} ms after ${since} (measured here)`);
    }
    if (record.serverLatency) parts.push(describeServerLatency(record.serverLatency));
    this.transcript.setMeta(record.itemIds[0], parts.join(" · "));
  }
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
  // A speculative answer started at the first quiet moment: this much model time ran before the commit.
  if (latency.speculative) parts.push(`${ms(latency.speculation_hidden_ms)} model ahead of the commit`);
  parts.push(`${ms(latency.other_ms)} other`);
  return `server: ${ms(latency.end_of_speech_to_first_audio_ms)} (${parts.join(", ")})`;
}
