"""What another machine could print: compare printed outputs within each number's tolerance, and
perturb a run the way another CPU's kernels would.

CI runs on Intel or AMD hosts whose float kernels round differently: the same code prints other last
digits. Two printouts are *the same* when their words and whole numbers are equal and every decimal
number agrees within what float32 rounding allows:

- a value of at most ``FLOAT32_RTOL`` (1e-4) in magnitude is a rounding residue (a relative error of
  an exact step, a tolerance measured from the run): any two residues are the same;
- any other value printed with d digits stands for every number that rounds to it; two printed values
  are the same when those ranges come within ``FLOAT32_RTOL`` (relative) of each other. So ``1.0000``
  and ``0.9999`` are the same (a rounding boundary between two equal numbers), ``0.5`` and ``0.75``
  are not.

``perturbed_init`` moves every parameter a model is initialised with (``Tensor.uniform_`` and
``Tensor.normal_``, which ``torch.nn.init`` and Transformers' initialisers call) by a relative 1e-7,
about one float32 rounding: what survives ``same_printout`` under it does not depend on the CPU.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from accumlib.tolerances import FLOAT32_RTOL

# A decimal number: 0.75, 1.0000, 1.22e-07, 1e-04 (not part of a word or a version such as 5.23.0).
DECIMAL = re.compile(r"(?<![\w.])-?(?:\d+\.\d+(?:e[-+]\d+)?|\d+e[-+]\d+)(?![\w]|\.\d)")

PERTURBATION = 1e-7  # relative: about one float32 rounding (2^-24 = 6e-8)


def _unit(text: str) -> float:
    """One unit in the last printed digit of ``text`` ('0.75' -> 0.01, '1.22e-07' -> 1e-9)."""
    mantissa, _, exponent = text.lstrip("-").partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def same_number(a: str, b: str, rtol: float = FLOAT32_RTOL) -> bool:
    """Whether two printed decimals can be one number up to float32 rounding (the module's rule)."""
    x, y = float(a), float(b)
    if abs(x) <= rtol and abs(y) <= rtol:
        return True
    return abs(x - y) <= (_unit(a) + _unit(b)) / 2 + rtol * max(abs(x), abs(y))


def _split(text: str) -> tuple[list[str], list[str]]:
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    words = [DECIMAL.sub("<n>", line) for line in lines]
    numbers = [n for line in lines for n in DECIMAL.findall(line)]
    return words, numbers


def differences(actual: str, shown: str) -> list[str]:
    """What differs beyond rounding, one line each (empty: the same printout on any machine)."""
    words_a, numbers_a = _split(actual)
    words_s, numbers_s = _split(shown)
    if words_a != words_s:
        return [line for line in difflib.unified_diff(words_s, words_a, "shown", "printed", lineterm="")]
    return [
        f"{s} shown, {a} printed: not the same number within float32 rounding"
        for a, s in zip(numbers_a, numbers_s)
        if not same_number(a, s)
    ]


def assert_same_printout(actual: str, shown: str) -> None:
    found = differences(actual, shown)
    assert not found, "printed output differs from what is shown:\n" + "\n".join(found)


@dataclass
class Perturbation:
    tensors: int = 0  # how many initialisations it moved: > 0, or the run was not perturbed at all


@contextlib.contextmanager
def perturbed_init(rel: float = PERTURBATION, seed: int = 12345) -> Iterator[Perturbation]:
    """Every ``uniform_``/``normal_`` initialisation inside the block is multiplied by ``1 + rel * u``,
    u uniform in [-1, 1] from a generator of its own (the global RNG stream is left as it was)."""
    done = Perturbation()
    generator = torch.Generator().manual_seed(seed)
    originals = {name: getattr(torch.Tensor, name) for name in ("uniform_", "normal_")}

    def wrap(original):
        def init(tensor, *args, **kwargs):
            out = original(tensor, *args, **kwargs)
            if tensor.is_floating_point():
                u = torch.rand(tensor.shape, generator=generator, dtype=torch.float64) * 2 - 1
                with torch.no_grad():  # in float64, so each value moves by its own rel * u, not by 0 or 1 ulp
                    tensor.copy_(tensor.double() * (1 + rel * u.to(tensor.device)))
                done.tensors += 1
            return out

        return init

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, wrap(original))
        yield done
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
