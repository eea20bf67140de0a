"""Writing a knowledge base: finding sources, loading files and JSONL records, chunking,
contexts and entities, embedding in batches, writing whole documents atomically under kbpg's
write lock, the jobs over stored documents (delete, re-embed, re-contextualize), and the rows of
application tables kept as documents (tables: kbpg sync).

May import: kbpg.store, kbpg.models, kbpg.config, kbpg.errors, kbpg.telemetry. Never
kbpg.search.
"""
