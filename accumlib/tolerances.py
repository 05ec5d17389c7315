"""Every tolerance accumlib uses, each with the reason for its value.

A tolerance is a claim about rounding; a bug must sit far outside it. The figures
quoted below were measured on the built-in tasks (``accumlib selfcheck``, ``make bench``)
and are re-checked by the tests that import these names.
"""

from __future__ import annotations

# float32 rounding: summing a few hundred float32 terms in a different order moves the
# result by ~1e-7 relative per term in the worst case; 1e-4 leaves a margin of ~10x over
# what we measure (~1e-6) and stays 1000x below the smallest real bug (a 2/4 tail: 0.5).
FLOAT32_RTOL = 1e-4

# A float32 step is judged against this run's own rounding, not only the fixed FLOAT32_RTOL: each
# micro-batch's fit (``.grad`` at a boundary = a s_j + beta .grad before, s_j the oracle's replay of that
# micro-batch) leaves exactly the rounding between the loop's gradient and the oracle's, per boundary.
# Measured: correct loops at rel err 0 to 6.4e-7 with fit residuals 2e-8 to 2e-7; a loop that weighs each
# micro-batch by its labels counted before the shift (torchtune 0.6.1's full-finetune recipe, Alpaca's
# train_on_input) at 1.3e-5 to 2.7e-5 on ~250-token sequences, which the fixed 1e-4 passed. The tolerance
# is ROUNDING_MARGIN x the step's worst fit residual, never under ROUNDING_FLOOR (6x over the worst correct
# loop measured) and never over FLOAT32_RTOL.
ROUNDING_MARGIN = 10.0
ROUNDING_FLOOR = 4e-6

# float64: the same argument with 2^-53 rounding gives ~1e-15 over a few hundred terms; 1e-12 keeps a
# 1000x margin, for tests that recompute the oracle in float64.
FLOAT64_RTOL = 1e-12

# bfloat16 keeps 8 bits of mantissa (eps 2^-8 ~ 4e-3); activations rounded layer by
# layer give gradients ~1e-2 off the float32 large batch (2e-2 to 5e-2 measured on
# digits). Only for figures read against the float32 oracle, never for a verdict.
BF16_RTOL = 1e-1

# A verdict under autocast compares with a replay of the window's micro-batches under
# the loop's own autocast dtype, weighted exactly. The replay runs the very kernels the
# loop ran; what can differ is where the loss scale (1/N, 1/k, GradScaler's S) is applied,
# which re-rounds the bf16 gradient flowing back into the first bf16 matmul. Measured: 0
# (bitwise) on digits for loss.sum()/N, mean/k, GradScaler, Accelerate's and Lightning's bf16,
# and on the GroupNorm CNN; 1.6e-3 to 1.8e-3 on the token task's attention model.
# 1e-2 keeps a 5x margin over that and stays 4x below a 4% misscale (measured 3.9e-2).
AUTOCAST_RTOL = 1e-2

# naive accumulation scales each step by about its micro-batch count m; unequal
# micro-batches (token counts, a smaller last batch) move the ratio by < 25% here
# (lesson 10's check of a never-divided loop by its norm ratio alone).
OFF_BY_K_TOL = 0.25

# verify fits each micro-batch's contribution to .grad as a_j * s_j + b_j * (.grad before).
# A fit that explains the gradient leaves float32 rounding (~1e-6 measured); anything
# unmodelled (a term item_losses does not compute, a wrong item) leaves >= 1e-2.
FIT_RTOL = 1e-3

# Fitted weights of one window must agree this closely to count as "one factor" (misscaled).
# They come from float32 gradients solved in float64 and agree to ~1e-6; under autocast to
# ~1e-3. The smallest factor we must tell from 1 is a 4% misscale.
SAME_FACTOR_RTOL = 1e-2

# The weights a bug predicts (1, m, 1/k, m/k, N/(N+S), 0) are matched within 5%: the closest
# two predictions we tell apart differ by >= 12.5% (m/k = 7/8 vs 1 at k = 8).
COEF_RTOL = 0.05

# GradScaler's scale is a power of two >= 2 while it is in use (2**16 by default, lower once
# it has backed off); a clip that saw unscaled gradients saw the step's own norm, ratio 1 up
# to rounding. 1.5 separates the two even at a scale of 2.
SCALED_CLIP_RATIO = 1.5

# Clipping to max_norm c leaves every clipped step with ||G|| = c (torch: c / (norm + 1e-6));
# float32 rounding moves it ~1e-7. A scale that varies from step to step moves it by >= 1e-2.
CLIP_NORM_RTOL = 1e-3

# A loop's own loss bookkeeping may weigh micro-batches rather than items and may round
# in bf16 (a few %); a loss off by the accumulation factor k >= 2 is >= 50% off.
LOGGED_RTOL = 0.1

__all__ = [
    "AUTOCAST_RTOL",
    "BF16_RTOL",
    "CLIP_NORM_RTOL",
    "COEF_RTOL",
    "FIT_RTOL",
    "FLOAT32_RTOL",
    "LOGGED_RTOL",
    "OFF_BY_K_TOL",
    "ROUNDING_FLOOR",
    "ROUNDING_MARGIN",
    "SAME_FACTOR_RTOL",
    "SCALED_CLIP_RATIO",
]
