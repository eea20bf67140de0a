"""kbpg over the network: the HTTP API and its search page (web/), the request guard and
bearer tokens, and the MCP server. Thin over kbpg.app: nothing here ranks or formats context.

May import every package below it (kbpg.app, kbpg.search, kbpg.store, ...); only this
package imports the web framework.
"""
