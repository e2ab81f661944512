"""The one error type of the wire-format layer: it names the field and the fix."""

from __future__ import annotations


class FormatError(ValueError):
    """A value in an upstream format (ConfigMap text, annotation) that cannot be used.

    `field` is a path a person can find (``device-config.yaml: nvidia.gpuMemoryFactor``,
    ``annotation volcano.sh/devices-to-allocate, container 0, device 1``); `fix` says what to do.
    """

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        message = f"{field}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)
