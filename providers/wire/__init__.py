"""Wire formats the providers and the gateway read and write; pure, no I/O."""
