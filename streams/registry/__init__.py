"""The tenant's catalog: task types with their definitions, and a Confluent-compatible schema
registry under ``<gateway>/registry`` (``catalog.py``: where it lives; ``compatibility.py``:
Avro resolution; ``payloads.py``: JSON payloads against a schema; ``routes.py``: the REST API).
"""
