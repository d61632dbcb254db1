"""Fault-injection harness: a Jepsen-style history, a nemesis against real processes,
and checkers for the promise (tests/PLAN.md). ``conveyor chaos kill9`` runs P1 of tests/PLAN.md."""
