"""Consumers of the events stream: the Postgres projector and the Prometheus metrics."""
