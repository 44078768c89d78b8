"""Wire formats and HTTP plumbing shared by the kinds: server-sent events (`sse`, pure) and
upstream HTTP answers as failover decisions, with their timeouts (`http`)."""
