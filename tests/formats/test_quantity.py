"""Resource quantities as the API server writes them back (tests/e2e/test_seed001.py met "3k")."""

from __future__ import annotations

import pytest
from vgpu_formats.quantity import parse_quantity, quantity_or_zero


@pytest.mark.parametrize(("text", "value"), [
    ("3000", 3000), ("3k", 3000), ("80k", 80000), ("1Ki", 1024), ("2Mi", 2 * 2**20), ("1.5k", 1500),
    ("500m", 1), ("1e3", 1000), ("0", 0), (" 12 ", 12), (7, 7), ("1G", 10**9),
])
def test_canonical_forms_parse_to_their_integer_value(text: object, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "3kb", "k", "1.2.3", "ten", "1 k", None, "1e999999999"])
def test_garbage_is_an_error_naming_the_text_or_zero_in_reports(text: object) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)
    assert quantity_or_zero(text) == 0
