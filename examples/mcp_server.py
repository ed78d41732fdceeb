"""The MCP server that examples/mcp_traced.py starts: a weather station, written with the
``mcp`` package's own server API, speaking MCP over stdin and stdout.

Needs the ``mcp`` extra (``pip install -e '.[mcp]'``).

python examples/mcp_server.py --serve
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

station = MCPServer("weather-station", log_level="WARNING")


class Forecast(BaseModel):
    """Tomorrow's weather in one city."""

    city: str
    celsius: float
    sky: str


@station.tool()
def forecast(city: str) -> Forecast:
    """Tomorrow's weather for a city."""
    return Forecast(city=city, celsius=21.5, sky="sunny")


@station.tool()
def fahrenheit(celsius: float) -> float:
    """Convert a temperature from Celsius to Fahrenheit."""
    return round(celsius * 9 / 5 + 32, 1)


@station.tool()
def alerts(region: str) -> str:
    """Weather alerts for a region."""
    raise ToolError(f"no alert service covers {region}")


if __name__ == "__main__":
    if "--serve" in sys.argv[1:]:
        station.run("stdio")
    else:
        print("The MCP server examples/mcp_traced.py starts. To serve over stdio, run:")
        print("    python examples/mcp_server.py --serve")
