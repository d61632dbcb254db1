"""Conveyor platform package."""
