"""The mcp part: what a tool call through the gateway's `/mcp` adds to calling the upstream MCP
server directly.

One streamable-HTTP MCP server written with the SDK's server side (this file run as
`mcp_tools.py upstream PORT`, on core 1) has one tool, `echo`. A gateway on core 0 serves it as
`up_echo`. The client (`mcp_tools.py client URL TOOL CALLS`, on core 1) is the official SDK's
client on the stateless 2026-07-28 revision: it connects once, warms up, then calls the tool
`CALLS` times one after another, timing each. Rounds alternate direct and through the gateway;
reported: p50 and p99 of each, and what the gateway adds (the medians over rounds). The issue's
target: under 2 ms added at p50.

Run alone: `.venv/bin/python bench/run.py --only mcp`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from harness import BENCH, PY, free_port, gateway_command, percentile, spawn, stop, wait_for_port
from scenarios import on_core1

WARMUP = 50


def upstream(port: int) -> None:
    """The upstream MCP server, until killed."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")

    @server.tool()
    def echo(text: str) -> str:
        """Say `text` back."""
        return text

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


async def client(url: str, tool: str, calls: int) -> dict[str, Any]:
    """Each call's seconds, after `WARMUP` calls that are not counted."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": "Bearer bench-key-000001"},
                              timeout=30.0)
    async with http, Client(streamable_http_client(url, http_client=http), mode="2026-07-28",
                            cache=None) as session:
        await session.list_tools()
        timings = []
        for n in range(WARMUP + calls):
            started = time.perf_counter()
            await session.call_tool(tool, {"text": f"call {n}"})
            if n >= WARMUP:
                timings.append(time.perf_counter() - started)
    return {"seconds": timings}


def mcp_cost(work: Path, calls: int, rounds: int) -> dict[str, Any]:
    """Alternating rounds, direct then through the gateway: p50 and p99 of each, in ms."""
    up_port, gw_port = free_port(), free_port()
    config = work / "mcp.json"
    config.write_text(json.dumps({
        "server": {"host": "127.0.0.1", "api_keys": ["bench-key-000001"]},
        "providers": {},
        "mcp_servers": {"up": {"url": f"http://127.0.0.1:{up_port}/mcp"}}}))
    up = spawn([PY, str(BENCH / "mcp_tools.py"), "upstream", str(up_port)], 1,
               work / "mcp-upstream.log")
    gateway = spawn(gateway_command(config, gw_port), 0, work / "mcp-gateway.log")
    try:
        wait_for_port(up_port, up)
        wait_for_port(gw_port, gateway, timeout=60)
        found: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
        for _ in range(rounds):
            for target, url, tool in (("direct", f"http://127.0.0.1:{up_port}/mcp", "echo"),
                                      ("gateway", f"http://127.0.0.1:{gw_port}/mcp",
                                       "up_echo")):
                seconds = on_core1("mcp_tools.py", "client", url, tool, calls)["seconds"]
                found[target].append({"p50_ms": percentile(seconds, 0.5) * 1000,
                                      "p99_ms": percentile(seconds, 0.99) * 1000})
    finally:
        stop(gateway)
        stop(up)
    result: dict[str, Any] = {"calls": calls, "rounds": found}
    for q in ("p50_ms", "p99_ms"):
        for target in ("direct", "gateway"):
            result[f"{target}_{q}"] = round(statistics.median(r[q] for r in found[target]), 3)
        result[f"added_{q}"] = round(result[f"gateway_{q}"] - result[f"direct_{q}"], 3)
    result["target_met"] = result["added_p50_ms"] < 2.0
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("upstream", "client"))
    parser.add_argument("args", nargs="*")
    args = parser.parse_args()
    if args.role == "upstream":
        upstream(int(args.args[0]))
        return
    url, tool, calls = args.args
    print(json.dumps(asyncio.run(client(url, tool, int(calls)))))


if __name__ == "__main__":
    main()
