"""kbpg over the network: the HTTP API, its guard and tokens, the search page in a real browser, the MCP server."""
