"""Webhooks and the events stream's reader: ``stream.py`` (cursor, tail of the events log),
``store.py`` (registrations, deliveries, cursor in SQLite), ``addresses.py`` (where a webhook
may send), ``deliver.py`` (signed, retried deliveries), ``api.py`` (the /v1/webhooks routes)."""
