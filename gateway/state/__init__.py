"""What the process holds: config snapshots and the runtime, reload, discovery, shared state."""
