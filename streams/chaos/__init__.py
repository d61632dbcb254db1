"""Fault-injection harness (issue 6): a Jepsen-style history, a nemesis against real processes,
and checkers for the promise in DESIGN.md. ``conveyor chaos kill9`` runs P1 of RELIABILITY.md."""
