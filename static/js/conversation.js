// What the server's events mean for the page during one call: the transcript, the status the
// page shows (derived from the flags below), errors, the session form and answer latency.

import { LatencyTracker } from "./latency.js";
import { describeServerError } from "./ui.js";

export class Conversation {
  constructor({ transcript, sessionControls, view, latencyRecords, tools }) {
    this.transcript = transcript;
    this.tools = tools;   // the page's function tools (tools.js): calls shown, run and answered
    this.sessionControls = sessionControls;
    this.view = view;
    this.latency = new LatencyTracker(transcript, latencyRecords);
    // The flags the status line is derived from (see state()).
    this.userSpeaking = false;
    this.awaitingAnswer = false;
    this.audioPlaying = false;
    this.responseActive = false;  // between response.created and response.done
    // Chrome says the event channel is open once SCTP is up, before the server has seen the
    // channel: the call is up at both ends once the server's session.created has come.
    this.sessionCreated = false;
  }

  /** True while an answer plays or is being generated: a new turn has to interrupt it. */
  get answering() {
    return this.audioPlaying || this.responseActive;
  }

  /** A typed message was sent; its response is asked for next. */
  textSent() {
    this.latency.turnEnded("text", performance.now());
    this.awaitingAnswer = true;
  }

  /**
   * The UI state to show, or null while the call is not up (`channelOpen`: the event channel is
   * open; and the server's session.created has come): the page keeps showing connecting or
   * reconnecting until then.
   */
  state(channelOpen) {
    if (!channelOpen || !this.sessionCreated) return null;
    if (this.userSpeaking) return "user-speaking";
    if (this.audioPlaying) return "speaking";
    if (this.awaitingAnswer) return "thinking";
    return "listening";
  }

  handle(event) {
    this.tools?.handle(event);
    switch (event.type) {
      case "session.created":
      case "session.updated":
        if (event.type === "session.created") this.sessionCreated = true;
        this.sessionControls.setEffective(event.session, { updated: event.type === "session.updated" });
        break;
      case "input_audio_buffer.speech_started":
        this.userSpeaking = true;
        break;
      case "input_audio_buffer.speech_stopped":
        this.userSpeaking = false;
        this.awaitingAnswer = true;
        // The server says speech stopped once it has heard silence_duration_ms of silence, so
        // the speech itself ended that long before (the server's latency counts it too).
        this.latency.turnEnded("speech", performance.now() - this.sessionControls.silenceWaitMs());
        break;
      case "input_audio_buffer.committed":
        this.userSpeaking = false;
        if (this.sessionControls.createsResponses()) this.awaitingAnswer = true;
        break;
      case "input_audio_buffer.cleared":
        this.userSpeaking = false;
        this.transcript.dropGuesses();
        break;
      case "response.output_item.added":
        this.latency.outputItemAdded(event.response_id, event.item.id);
        this.transcript.renderItem(event.item);
        break;
      case "conversation.item.added":
      case "conversation.item.done":
      case "response.output_item.done":
        this.transcript.renderItem(event.item);
        break;
      case "conversation.item.input_audio_transcription.delta":
        // This server's deltas carry the whole text heard so far (`transcript`): while the user
        // speaks (`partial: true`) each one replaces the previous guess, words it revised
        // included (docs/SESSION.md "Partial transcripts"). Another server's deltas append.
        if (typeof event.transcript === "string") {
          this.transcript.setUserText(event.item_id, event.transcript, { partial: event.partial === true });
        } else {
          this.transcript.appendUserText(event.item_id, event.delta);
        }
        break;
      case "conversation.item.input_audio_transcription.completed":
        this.transcript.setUserText(event.item_id, event.transcript);
        break;
      case "conversation.item.input_audio_transcription.failed":
        this.transcript.mark(event.item_id, "not transcribed");
        break;
      case "conversation.item.deleted":
        this.transcript.forget(event.item_id);
        break;
      case "conversation.item.truncated":
        this.transcript.mark(event.item_id, "cut off");
        break;
      case "response.created":
        this.awaitingAnswer = true;
        this.responseActive = true;
        this.latency.responseCreated(event.response.id);
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        this.transcript.appendText(event.item_id, event.delta);
        break;
      case "response.output_audio_transcript.done":
        this.transcript.setText(event.item_id, event.transcript);
        this.view.announce(event.transcript);
        break;
      case "response.output_text.done":
        this.transcript.setText(event.item_id, event.text);
        this.view.announce(event.text);
        break;
      case "output_audio_buffer.started":
        this.audioPlaying = true;
        this.awaitingAnswer = false;
        this.latency.firstAudio(event.response_id, "firstAudioEventMs");
        break;
      case "output_audio_buffer.stopped":
      case "output_audio_buffer.cleared":
        this.audioPlaying = false;
        break;
      case "response.done":
        this.responseDone(event.response, event.latency);
        break;
      case "error":
        this.view.showError(describeServerError(event.error));
        break;
      default:
        break;   // events the page has nothing to show for (rate limits, deltas of other kinds)
    }
  }

  // `latency` is this server's extension of response.done (app/realtime/protocol/objects.py ResponseLatency).
  responseDone(response, latency) {
    this.awaitingAnswer = false;
    this.responseActive = false;
    const itemIds = (response.output ?? []).map((item) => item.id);
    if (response.status === "cancelled") {
      for (const id of itemIds) this.transcript.mark(id, "cut off");
    } else if (response.status === "incomplete") {
      const reason = response.status_details?.reason;
      const label = reason === "max_output_tokens" ? "length limit" : `stopped${reason ? `: ${reason}` : ""}`;
      for (const id of itemIds) this.transcript.mark(id, label);
    } else if (response.status === "failed") {
      for (const id of itemIds) this.transcript.mark(id, "failed");
      // The server explains a failure in an `error` event; show details here only if it
      // put a message in the response itself.
      const error = response.status_details?.error;
      if (error?.message) this.view.showError(describeServerError(error));
    }
    this.latency.responseDone(response.id, itemIds, latency);
  }
}
