"""Helper programs and fixtures of the lifecycle integration tests."""
