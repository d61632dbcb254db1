"""Example Conveyor apps (``conveyor dev --app examples.shop:app``)."""
