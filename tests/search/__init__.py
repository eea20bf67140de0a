"""Reading a knowledge base: the search request, the run and its stages, the CLI's search, evaluation and the quality gates."""
