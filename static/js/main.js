// omni-rtc browser client: one WebRTC call to the server, speaking the OpenAI Realtime
// protocol (GA event names) on the "oai-events" data channel, the way OpenAI's browser
// example does (call.js). This entry builds the page's objects and hands each the others it
// uses; the modules share no mutable globals. window.omniRtc is the test hook (test-hook.js),
// window.omniTimeline the turn timeline's data (timeline.js).

import { CallControls } from "./call-controls.js";
import { Camera } from "./camera.js";
import { SessionControls } from "./session-controls.js";
import { AccessKey, Signaling } from "./signaling.js";
import { installTestHook } from "./test-hook.js";
import { Timeline } from "./timeline.js";
import { Transcript } from "./transcript.js";
import { View, findElements, wireControls } from "./ui.js";

const hook = installTestHook(window);
// The framework snippets name this server as the browser reached it.
const wsBase = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}`;
for (const base of document.querySelectorAll(".ws-base")) base.textContent = wsBase;
for (const base of document.querySelectorAll(".http-base")) base.textContent = location.origin;
const elements = findElements(document);
const view = new View(elements, hook);
const transcript = new Transcript(elements.transcript);
const accessKey = new AccessKey(elements.accessKey, localStorage);
accessKey.restore();
const signaling = new Signaling(accessKey, () => view.openAccessKey());
const sessionControls = new SessionControls(elements);
const camera = new Camera({ toggle: elements.cameraToggle, selfView: elements.selfView, view });
const calls = new CallControls({
  camera,
  timeline: new Timeline(elements.timeline, window),
  view,
  transcript,
  signaling,
  sessionControls,
  hook,
  remoteAudio: elements.remoteAudio,
});

wireControls(elements, {
  connect: () => calls.connectNow(),
  reconnect: () => calls.reconnectNow(),
  hangUp: () => calls.hangUp(),
  connectIfIdle: () => calls.connectIfIdle(),
  accessKeyChanged: () => accessKey.remember(),
  applySession: () => sessionControls.apply(calls.call),
  sendText: (text) => calls.sendText(text),
  echoCancellationChanged: (enabled) => calls.switchMicrophone(enabled),
  cameraChanged: (on) => camera.switchTo(on),
  pageHidden: () => calls.pageHidden(),
});
