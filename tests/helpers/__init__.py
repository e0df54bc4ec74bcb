"""Helpers shared by tests (not collected as tests)."""
