"""The framework adapters against a real database."""
