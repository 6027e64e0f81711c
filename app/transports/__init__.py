"""The transports that carry a realtime session: WebRTC calls and WebSockets."""
