"""Test-support code shared by the suites (no product logic lives here)."""
