// The camera: the person switches it on and off, before a call or during one, and sees
// themselves in the self-view. Every call offers one video transceiver, sendonly (the server
// never sends video); the camera's track rides on it while the camera is on. Switching is a
// replaceTrack, never a new offer: the server samples a few frames a second of whatever
// arrives and puts them into the spoken turns (docs/SESSION.md, "Camera").

// Enough for the model (the server scales frames to its pixel budget, 352 x 256 for 4:3) and cheap to
// encode; the server samples 1 frame a second while the person speaks, so 15 fps is plenty.
const CAMERA_CONSTRAINTS = { width: { ideal: 640 }, height: { ideal: 480 }, frameRate: { ideal: 15 } };

/** A camera problem the person has to fix (permission, no device). */
export class CameraError extends Error {}

export class Camera {
  /** `toggle`: the on/off checkbox; `selfView`: a muted <video>; `view.showError(message)`. */
  constructor({ toggle, selfView, view }) {
    this.toggle = toggle;
    this.selfView = selfView;
    this.view = view;
    this.stream = null;
    this.sender = null;   // the current call's video sender, or null
    this.pending = null;  // the switch under way, so that clicks in a row apply in order
  }

  get track() {
    return this.stream?.getVideoTracks()[0] ?? null;
  }

  /** The toggle changed: open or close the camera, and send it on the call if there is one. */
  switchTo(on) {
    const previous = this.pending ?? Promise.resolve();
    this.pending = previous.then(() => (on ? this.open() : this.close())).catch((error) => {
      this.toggle.checked = false;
      this.close();
      this.view.showError(error.message);
    });
    return this.pending;
  }

  /** A new call: its video transceiver, carrying the camera when it is on. */
  attach(pc) {
    this.sender = pc.addTransceiver(this.track ?? "video", { direction: "sendonly" }).sender;
  }

  /** The call ended: the camera stays on (or off) for the next one. */
  detach() {
    this.sender = null;
  }

  async open() {
    if (this.stream) return;
    this.stream = await openCamera();
    if (!this.toggle.checked) {  // switched off again while the browser asked
      this.close();
      return;
    }
    this.selfView.srcObject = this.stream;
    this.selfView.hidden = false;
    if (this.sender) await this.sender.replaceTrack(this.track);
  }

  close() {
    if (this.sender) this.sender.replaceTrack(null).catch((error) => console.warn("stopping the camera track", error));
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    this.stream = null;
    this.selfView.srcObject = null;
    this.selfView.hidden = true;
  }
}

async function openCamera() {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new CameraError("This page needs a secure origin (https:// or localhost) to use the camera.");
  }
  try {
    return await navigator.mediaDevices.getUserMedia({ video: CAMERA_CONSTRAINTS });
  } catch (error) {
    if (error.name === "NotAllowedError" || error.name === "SecurityError") {
      throw new CameraError("Camera access was refused. Allow this site to use the camera, then switch it on again.");
    }
    if (error.name === "NotFoundError" || error.name === "OverconstrainedError") {
      throw new CameraError("No camera was found.");
    }
    if (error.name === "NotReadableError") {
      throw new CameraError("The camera is in use by another application or could not be opened.");
    }
    throw error;
  }
}
