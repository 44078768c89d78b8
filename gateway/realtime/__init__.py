"""The Realtime API (`/v1/realtime`, a WebSocket): sessions relayed, governed like requests."""
