"""The platform's data path: log -> processor -> state machine -> outputs."""
