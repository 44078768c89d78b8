"""A local MCP server the gateway spawns over stdio in the tests (the SDK's server side).

Tools: `add` two numbers; `env`: the names of the environment variables it was started with
(the gateway must give it only what its config names, plus PATH and HOME); `pid`; `crash`.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("local")


@server.tool()
def add(a: int, b: int) -> int:
    """The sum of `a` and `b`."""
    return a + b


@server.tool()
def env() -> str:
    """The names of this process's environment variables, sorted, comma-separated."""
    return ",".join(sorted(os.environ))


@server.tool()
def pid() -> int:
    """This process's id."""
    return os.getpid()


@server.tool()
def crash() -> str:
    """End this process at once, as a server that dies does."""
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
