"""One module per provider kind; `pool/` is the bundled workers. The app finds them through
entry points (`providers.load_kinds`), never by name."""
