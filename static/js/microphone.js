// The microphone: opening it with a message a person can act on when that fails, and the level
// meter that shows it hears something.

/** A microphone problem the person has to fix; connecting again would fail the same way. */
export class MicrophoneError extends Error {}

export async function openMicrophone(echoCancellation) {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new MicrophoneError("This page needs a secure origin (https:// or localhost) to use the microphone.");
  }
  try {
    return await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation, noiseSuppression: true, autoGainControl: true },
    });
  } catch (error) {
    if (error.name === "NotAllowedError" || error.name === "SecurityError") {
      throw new MicrophoneError(
        "Microphone access was refused. Allow this site to use the microphone " +
        "(the icon in the address bar, or your browser's site settings), then press Connect again.");
    }
    if (error.name === "NotFoundError" || error.name === "OverconstrainedError") {
      throw new MicrophoneError("No microphone was found. Plug one in, then press Connect again.");
    }
    if (error.name === "NotReadableError") {
      throw new MicrophoneError("The microphone is in use by another application or could not be opened.");
    }
    throw error;
  }
}

/** The microphone's level, 0-100, once per animation frame, to `onLevel`. */
export class LevelMeter {
  constructor(onLevel) {
    this.onLevel = onLevel;
    this.audioContext = null;
    this.source = null;
    this.frame = 0;
  }

  start(stream) {
    this.audioContext = new AudioContext();
    // Created after awaiting the microphone, a moment after the click: Safari starts such a
    // context suspended.
    this.audioContext.resume().catch((error) => console.error("the level meter's AudioContext did not start", error));
    const analyser = this.audioContext.createAnalyser();
    analyser.fftSize = 1024;
    this.source = this.audioContext.createMediaStreamSource(stream);
    this.source.connect(analyser);
    const samples = new Float32Array(analyser.fftSize);
    const draw = () => {
      analyser.getFloatTimeDomainData(samples);
      let sum = 0;
      for (const sample of samples) sum += sample * sample;
      const rms = Math.sqrt(sum / samples.length);
      // -60 dBFS (room noise) → empty, 0 dBFS → full.
      const db = 20 * Math.log10(rms + 1e-9);
      this.onLevel(Math.max(0, Math.min(100, ((db + 60) / 60) * 100)));
      this.frame = requestAnimationFrame(draw);
    };
    draw();
  }

  stop() {
    cancelAnimationFrame(this.frame);
    if (this.source) this.source.disconnect();
    if (this.audioContext) {
      this.audioContext.close().catch((error) => console.error("closing the AudioContext failed", error));
    }
    this.source = null;
    this.audioContext = null;
  }

  /** Stops and shows an empty meter. */
  close() {
    this.stop();
    this.onLevel(0);
  }
}
