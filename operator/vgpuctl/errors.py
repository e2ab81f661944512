"""vgpuctl's exit codes and the one error a command raises for bad input.

Kept apart from `vgpuctl.main` so that the commands and the entry point both import them
without importing each other.
"""

from __future__ import annotations

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the user: printed as one line without a traceback, exit code 2."""
