"""Stream surfaces on Kafka: the ingest topic's router (``router.py``) and the public task
events topic (``task_events.py``)."""
