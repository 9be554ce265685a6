"""Exactly-once past the duplicate window: the replay records of a run and what they tell a retry."""
