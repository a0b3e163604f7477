"""Test support: helpers, fixture modules (registered by tests/conftest.py) and contracts shared by tests."""
