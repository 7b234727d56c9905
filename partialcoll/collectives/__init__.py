"""Collectives built as schedules on the executor (one builder per algorithm)."""
