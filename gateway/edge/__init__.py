"""The HTTP edge: the ASGI front for the relay routes, the guard, auth, and the routes beside the
relay (admin, status, stored responses)."""
