// The test hook, window.omniRtc: what the browser tests read (tests/e2e/test_browser.py,
// tests/e2e/test_browser_auth.py). Read-only use, kept stable:
//   window.omniRtc.pc         the current RTCPeerConnection, or null
//   window.omniRtc.dc         the current "oai-events" RTCDataChannel, or null
//   window.omniRtc.callUrl    the last call's URL on the server (the answer's Location)
//   window.omniRtc.events     every server event received since the page loaded, in order
//   window.omniRtc.eventTimes each event's arrival, performance.now() ms, by the same index
//   window.omniRtc.sent       every client event sent since the page loaded, in order
//   window.omniRtc.state      the UI state: idle | connecting | listening | user-speaking |
//                             thinking | speaking | reconnecting (also #status[data-state])
//   window.omniRtc.latencies  one record per response, the browser's own measurements:
//                             {responseId, from ("speech" | "text"), fromMs (end of speech:
//                             speech_stopped's arrival less the VAD's silence wait, or the
//                             text sent; performance.now()), firstAudioEventMs
//                             (output_audio_buffer.started arrived), firstAudioEnergyMs
//                             (inbound-rtp totalAudioEnergy first grew)}
//
// main.js creates the hook and hands it to the modules that write to it (call.js: pc, dc,
// callUrl, events, eventTimes, sent; ui.js: state; latency.js: latencies); no module reads it back.

/** Creates the hook, publishes it as `target.omniRtc` and returns it. */
export function installTestHook(target) {
  const hook = {
    pc: null,
    dc: null,
    callUrl: null,
    events: [],
    eventTimes: [],
    sent: [],
    state: "idle",
    latencies: [],
  };
  target.omniRtc = hook;
  return hook;
}
