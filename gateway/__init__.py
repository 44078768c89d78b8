"""llms-gateway: one OpenAI-compatible endpoint in front of many model providers."""
