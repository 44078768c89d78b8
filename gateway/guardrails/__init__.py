"""Guardrails: personal data and secrets kept from providers, values given back to clients."""
