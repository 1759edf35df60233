"""Helpers for DistFlow's own tests: launching multi-process jobs with a hard timeout."""
