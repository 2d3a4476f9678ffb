"""Unit parsing: decimal prefixes are powers of ten, bits are an eighth of a byte."""

import pytest

from ddlsim.hardware_models.units import (
    UnitError,
    format_bytes,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    parse_seconds,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100 Gbit/s", 12.5e9),
        ("100Gb/s", 12.5e9),
        ("10 Gbps", 1.25e9),
        ("12.5 GB/s", 12.5e9),
        ("1 GiB/s", 2**30),
        (5, 5.0),
    ],
)
def test_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("16 GB", 16e9), ("64KiB", 65536), ("1e6", 1e6), ("25MB", 25e6), ("1.5 TB", 1.5e12), ("3 B", 3)],
)
def test_bytes(text, expected):
    assert parse_bytes(text) == pytest.approx(expected, rel=1e-12)


def test_seconds_and_flops():
    assert parse_seconds("1.5 us") == pytest.approx(1.5e-6)
    assert parse_seconds("2ms") == pytest.approx(2e-3)
    assert parse_flops("10.6 TFLOP/s") == pytest.approx(10.6e12)


@pytest.mark.parametrize("bad", ["fast", "10 furlongs", "1 XB", "--3 GB"])
def test_rejects_unparsable(bad):
    with pytest.raises(UnitError, match="size"):
        parse_bytes(bad)


def test_bandwidth_error_lists_units():
    with pytest.raises(UnitError, match="allowed: bit/s"):
        parse_bandwidth("3 GHz")


def test_format_bytes():
    assert format_bytes(1.6e8) == "160 MB"
