"""/v1/responses for providers that speak only chat completions: translate there and back.

`request` turns a Responses request into a chat-completions body, `reply` a chat completion into a
Response object, `events` a chat stream into the Responses event sequence; all pure. `bridge`
wraps a chat-only provider so the router fails over exactly as for chat; the Responses store
(`gateway.adapters.responses.store`) keeps recent responses for `previous_response_id`.
"""
