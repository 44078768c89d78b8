"""The MCP gateway: upstream MCP servers aggregated behind `/mcp`, for the gateway's keys.

`upstream.py` keeps one connection per configured server (a spawned process or a remote
session) through the official `mcp` SDK's client; `hub.py` aggregates them for a key (names,
allow-lists, governance); `protocol.py` answers JSON-RPC for both protocol revisions;
`sessions.py` keeps old-revision sessions where every replica finds them. The HTTP route is
the edge's (`gateway.edge.mcp_route`).
"""
