"""Anthropic's MCP connector (`mcp_servers`) on any model, run by the gateway (`mcp_loop`)."""
