"""Writing a knowledge base: loaders, chunking, batching, contexts, the COPY encoding, ingest runs end to end."""
