// Signaling: the ICE servers to build the peer connection with, the SDP offer POSTed to
// /v1/realtime/calls (answered with the SDP answer and, in Location, the call's URL), the DELETE
// that ends a call, and the access key sent with each.

const CALLS_URL = "/v1/realtime/calls";
// omni-rtc's extension: STUN/TURN servers with fresh TURN credentials (404 elsewhere: none).
const ICE_SERVERS_URL = "/v1/realtime/ice_servers";
// The API key is remembered in this browser (localStorage) so a reload needs no retyping; an
// ek_ client secret opens one call only, so it is not kept.
const ACCESS_KEY_STORAGE = "omni-rtc.apiKey";

/** The "Server access key" field: an API key or an ek_ client secret. */
export class AccessKey {
  constructor(input, storage) {
    this.input = input;
    this.storage = storage;
  }

  restore() {
    this.input.value = this.storage.getItem(ACCESS_KEY_STORAGE) ?? "";
  }

  remember() {
    const accessKey = this.input.value.trim();
    if (accessKey && !accessKey.startsWith("ek_")) this.storage.setItem(ACCESS_KEY_STORAGE, accessKey);
    else this.storage.removeItem(ACCESS_KEY_STORAGE);
  }

  // Synchronous on purpose: callers spread the result into fetch headers.
  authorization() {
    const accessKey = this.input.value.trim();
    return accessKey ? { Authorization: `Bearer ${accessKey}` } : {};
  }
}

export class Signaling {
  /** `onAccessKeyNeeded()` runs when the server answers 401 (it wants a key, or another one). */
  constructor(accessKey, onAccessKeyNeeded) {
    this.accessKey = accessKey;
    this.onAccessKeyNeeded = onAccessKeyNeeded;
  }

  /** The RTCIceServer list for a new peer connection; throws an Error whose message is for the person. */
  async iceServers() {
    const response = await this.request(ICE_SERVERS_URL, { headers: this.accessKey.authorization(), cache: "no-store" });
    if (response.status === 404) return [];
    const body = await this.checked(response, "The server refused its ICE servers");
    return JSON.parse(body).ice_servers;
  }

  /** The SDP answer and the call's URL; throws an Error whose message is for the person. */
  async postOffer(sdp) {
    const headers = { "Content-Type": "application/sdp", ...this.accessKey.authorization() };
    const response = await this.request(CALLS_URL, { method: "POST", body: sdp, headers });
    const body = await this.checked(response, "The server refused the call");
    return { sdp: body, location: response.headers.get("Location") };
  }

  async request(url, options) {
    try {
      return await fetch(url, options);
    } catch (error) {
      throw new Error(`Could not reach the server (${error.message}).`);
    }
  }

  /** The body of a successful response; else an Error that says what the person can do. */
  async checked(response, refused) {
    const body = await response.text();
    if (response.status === 401) {
      this.onAccessKeyNeeded();
      throw new Error(`This server needs an access key: enter it under "Server access key" and connect again (${errorMessageOf(body)}).`);
    }
    if (!response.ok) {
      const retryAfter = response.headers.get("Retry-After");
      const wait = retryAfter ? ` Try again in ${retryAfter} s.` : "";
      throw new Error(`${refused} (HTTP ${response.status}): ${errorMessageOf(body)}${wait}`);
    }
    return body;
  }

  // DELETE /v1/realtime/calls/{id}. 404: the server had already ended it. 401: a client secret
  // opens a call but cannot end one; the closed peer connection ends it a moment later.
  endCall(location) {
    fetch(location, { method: "DELETE", headers: this.accessKey.authorization(), keepalive: true }).then(
      (response) => {
        if (!response.ok && response.status !== 404 && response.status !== 401) {
          console.warn(`ending the call on the server answered HTTP ${response.status}`);
        }
      },
      (error) => console.warn("ending the call on the server failed", error),
    );
  }
}

function errorMessageOf(body) {
  try {
    const parsed = JSON.parse(body);
    const detail = parsed.error?.message ?? parsed.detail ?? parsed.message;
    if (detail) return typeof detail === "string" ? detail : JSON.stringify(detail);
  } catch {
    // Not JSON: the body itself is the message.
  }
  return body.trim().slice(0, 200) || "no details";
}
