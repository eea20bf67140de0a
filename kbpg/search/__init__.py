"""Reading a knowledge base: the typed search request, the run (embed the question, call
kb.search, the optional rerank and expansion stages), the result and its renderings.

May import: kbpg.store, kbpg.models, kbpg.config, kbpg.errors, kbpg.telemetry. Never
kbpg.ingest.
"""
