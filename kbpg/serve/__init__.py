"""kbpg over the network: the HTTP API and its search page (web/), the request guard and
bearer tokens, probes, Prometheus metrics and logs, and the MCP server. Thin over kbpg.app:
nothing here ranks or formats context.

May import every package below it (kbpg.app, kbpg.search, kbpg.store, ...); only this
package imports the web framework and the metrics library (it subscribes to kbpg.telemetry).
"""
