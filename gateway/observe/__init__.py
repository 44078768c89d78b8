"""Listeners on the request's record and what they feed: metrics, the request log, recent
traffic."""
