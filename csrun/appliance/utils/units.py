"""``cerebras.appliance.utils.units``: byte units."""

from __future__ import annotations

from csrun.appliance.errors import ApplianceError

_FACTORS = {"B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
            "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4}


def convert_byte_unit(value: float, target_unit: str, src_unit: str = "B", precision: int | None = None) -> float:
    """``value`` in ``src_unit`` expressed in ``target_unit`` (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)."""
    try:
        result = value * _FACTORS[src_unit.upper()] / _FACTORS[target_unit.upper()]
    except KeyError:
        raise ApplianceError(f"convert_byte_unit: unit {src_unit!r} or {target_unit!r} is not one of "
                             f"B, KB, MB, GB, TB, KiB, MiB, GiB, TiB") from None
    return round(result, precision) if precision is not None else result


__all__ = ["convert_byte_unit"]
