"""cbfloat16 rounding on chosen bit patterns, and reduced-precision loss curves near float32."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import pytest
import torch

from csrun.compiler.spec import OptimizerSpec
from csrun.emulator.engine.executor import Engine
from csrun.emulator.engine.precision import CB16_MAX, round_to_cbfloat16

from tests.tiny_models import MLP, TinyTransformer, lm_batches, mlp_batches
from .helpers import make_program, quiet


def f32(bits: int) -> float:
    """The float32 with this bit pattern."""
    return struct.unpack(">f", struct.pack(">I", bits))[0]


def rnd(x: float) -> float:
    return round_to_cbfloat16(torch.tensor([x], dtype=torch.float32)).item()


# (input bits, expected value, why). float32: 1 sign | 8 exponent (bias 127) | 23 mantissa;
# cbfloat16 keeps the top 9 mantissa bits, so the low 14 bits (0x3FFF) are rounded away.
BIT_CASES = [
    (0x3F800000, 1.0, "1.0 is exact"),
    (0x3F802000, 1.0, "1 + 2^-10: exact tie, 1.0's last kept bit is 0 (even) -> down"),
    (0x3F806000, 1.0 + 2**-8, "1 + 3*2^-10: tie, kept lsb odd -> up to 1 + 2^-8"),
    (0x3F802001, 1.0 + 2**-9, "just above the tie -> up"),
    (0x3F801FFF, 1.0, "just below the tie -> down"),
    (0x3FFFE000, 2.0, "1.99951171875 (= 2 - 2^-11): all kept bits 1, rounds up, carry into the exponent"),
    (0xBF806000, -(1.0 + 2**-8), "negative ties round the magnitude"),
    (0x4F7FC000, CB16_MAX, "exponent 158 (2^31), top 9 mantissa bits set: largest finite cbfloat16, exact"),
    (0x4F7FE000, math.inf, "tie above the largest finite: even is 2^32 -> overflow to inf"),
    (0x4F7FD000, CB16_MAX, "below that tie -> largest finite"),
    (0x4F800000, math.inf, "2^32 exceeds the 6-bit exponent -> inf"),
    (0xCF800000, -math.inf, "-2^32 -> -inf"),
    (0x30800000, 2.0**-30, "2^-30, smallest normal, exact"),
    (0x2C000000, 2.0**-39, "2^-39, smallest subnormal, exact"),
    (0x2C400000, 2.0**-38, "1.5 * 2^-39: tie between 1 (odd) and 2 units -> 2 units"),
    (0x2B800000, 0.0, "2^-40: tie between 0 (even) and 1 unit -> 0"),
    (0x2B800001, 2.0**-39, "just above 2^-40 -> 1 unit"),
    (0x30000000, 2.0**-31, "2^-31 is 256 units of 2^-39, exact subnormal"),
    (0x307FFFFF, 2.0**-30, "just below the smallest normal rounds up to it"),
    (0x7F800000, math.inf, "inf passes"),
    (0x80000000, -0.0, "negative zero keeps its sign"),
]


@pytest.mark.parametrize("bits,expected,why", BIT_CASES, ids=[hex(c[0]) for c in BIT_CASES])
def test_cbfloat16_bit_patterns(bits: int, expected: float, why: str) -> None:
    got = rnd(f32(bits))
    assert got == expected, why
    assert math.copysign(1.0, got) == math.copysign(1.0, expected), why


def test_nan_passes() -> None:
    assert math.isnan(rnd(float("nan")))


def _reference(x: float) -> float:
    """Round to cbfloat16 with exact rational arithmetic (IEEE-style, 9 mantissa bits, bias 31)."""
    if x == 0 or not math.isfinite(x):
        return x
    sign = -1.0 if x < 0 else 1.0
    q = Fraction(abs(x))
    e = max(math.floor(math.log2(abs(x))), -30)
    # fix log2 edge effects
    while Fraction(2) ** e > q and e > -30:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    unit = Fraction(2) ** (e - 9)
    n = q / unit
    r = math.floor(n)
    if n - r > Fraction(1, 2) or (n - r == Fraction(1, 2) and r % 2 == 1):
        r += 1
    value = r * unit
    if value > Fraction(CB16_MAX):
        return sign * math.inf
    return sign * float(value)


def test_random_values_match_exact_reference() -> None:
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (3000,), generator=g, dtype=torch.int64).to(torch.int32)
    xs = bits.view(torch.float32)
    scaled = torch.cat([xs, torch.randn(1000, generator=g) * 2.0 ** torch.randint(-45, 35, (1000,), generator=g)])
    got = round_to_cbfloat16(scaled.float())
    for x, y in zip(scaled.tolist(), got.tolist()):
        if math.isnan(x):
            assert math.isnan(y)
            continue
        assert y == _reference(x), (x, y, _reference(x))


def _losses(model: torch.nn.Module, batches: list, precision: str, opt: OptimizerSpec) -> list[float]:
    ep, spec = make_program(model, batches[0], precision=precision, optimizer=opt, learning_rate=0.05)
    eng = Engine(ep, spec, notice=quiet)
    return [eng.run_step(b)["loss"].item() for b in batches]


@pytest.mark.parametrize("precision,tol", [("bfloat16", 0.03), ("float16", 0.01), ("cbfloat16", 0.01)])
def test_reduced_precision_loss_curve_near_float32(precision: str, tol: float) -> None:
    """Stated tolerance: max |loss - loss_fp32| / loss_fp32 over 50 steps <= tol (bf16 has 8 bits
    of mantissa, fp16 11, cbfloat16 10, so bf16 gets the widest band)."""
    torch.manual_seed(0)
    batches = mlp_batches(50)
    model = MLP()
    opt = OptimizerSpec(type="sgd", hyperparameters={"momentum": 0.9})
    ref = _losses(model, batches, "float32", opt)
    low = _losses(model, batches, precision, opt)
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref, low))
    assert worst <= tol, worst
    assert low[-1] < low[0]  # it still trains
    assert ref != low  # and precision was really lowered


def test_cbfloat16_transformer_trains_and_rounds_weights_as_read() -> None:
    torch.manual_seed(0)
    batches = lm_batches(10)
    model = TinyTransformer()
    opt = OptimizerSpec(type="adamw", hyperparameters={})
    ref = _losses(model, batches, "float32", opt)
    low = _losses(model, batches, "cbfloat16", opt)
    assert max(abs(a - b) / a for a, b in zip(ref, low)) < 0.02
    assert ref != low
