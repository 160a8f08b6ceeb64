"""The embedded engine: an OpenAI-compatible server on transformers that swaps weights while serving."""
