"""The size of a device plugin's ListAndWatch message, and the kubelet's limit on it.

A response is `repeated Device devices = 1`, each Device{ID = 1, health = 2}. Device lists here are
numbered: the ids of one GPU are a fixed prefix plus 0, 1, ... Every length stays under 128 (ids
are at most 63 bytes), so each length takes one byte. The device plugin sizes (and caps) its memory
list with this; the operator's validation sizes the lists each plugin generation would send.
"""

from __future__ import annotations

from collections.abc import Iterator

# grpc-go's default receive limit, which the kubelet keeps for ListAndWatch: a larger message is
# dropped and the resource stays at 0.
MESSAGE_LIMIT = 4 * 1024 * 1024
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


def digit_ranges(units: int) -> Iterator[tuple[int, int, int]]:
    """(digits, low, high): the numbers 0 .. units-1 split by how many decimal digits they have."""
    for digits in range(1, len(str(max(units, 1))) + 1):
        low, high = (0 if digits == 1 else 10 ** (digits - 1)), min(units, 10**digits)
        if low < high:
            yield digits, low, high


def numbered_list_bytes(prefix_length: int, units: int, health: str = HEALTHY) -> int:
    """Encoded bytes of Device{ID = <prefix><i>, health} for i < units, `prefix_length` bytes of
    prefix: per entry a tag and a length for the Device, its ID and its health."""
    digits = sum((high - low) * k for k, low, high in digit_ranges(units))
    return max(units, 0) * (2 + 2 + prefix_length + 2 + len(health)) + digits
