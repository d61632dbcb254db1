"""The HTTP contract: request and reply models, and the table of operations."""
