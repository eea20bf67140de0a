"""The database side of kbpg: connecting (your server, or the embedded one), migrating, the
named queries every other package runs, read replicas, the vector index, access grants, the
definitions of table sources and the COPY encoding of rows.

May import: kbpg.config, kbpg.errors, kbpg.telemetry. Knows no model, no use case and no face.
"""
