"""Byte-bounded stores with an optional Redis tier: the response cache and the Responses store."""
