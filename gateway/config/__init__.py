"""llms.json read into the settings types (`gateway.core.settings`): `loader` finds, reads and
checks the file for the composition (the app, the CLI, reload, the runtime); it imports no
consumer of the settings."""

from gateway.config.loader import discover, load, parse
from gateway.config.snapshots import weakening
from gateway.core.settings import ConfigError, Route, ServerConfig, Snapshot

__all__ = ["ConfigError", "Route", "ServerConfig", "Snapshot", "discover", "load", "parse",
           "weakening"]
