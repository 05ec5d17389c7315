"""Mutants of accumlib/harness.py and accumlib/reference.py: the reference loops' judge and table; and of
what the table reads from the loops (a contract's verdict per kind of task) and one loop's own default that
no reference run can show (amp's autocast dtype on CUDA: its test stops the loop at autocast)."""

from mutate import Mutant

TESTS = [
    "tests/test_harness.py",
    "tests/test_contracts.py",
    "tests/test_compare_memory_oracle.py",
    "accumlib/harness.py",
    "accumlib/reference.py",
]
PYTEST_ARGS = ["--doctest-modules"]  # the modules' own examples are part of the suite

H, R = "accumlib/harness.py", "accumlib/reference.py"
CT, AMP = "accumlib/loops/_contract.py", "accumlib/loops/amp.py"
MUTANTS = [
    Mutant(
        "classify judges the best step instead of the worst (any step, not all steps)",
        H,
        "worst = max(c.rel_error",
        "worst = min(c.rel_error",
    ),
    Mutant("exact tolerance loosened 10x", H, "if worst <= FLOAT32_RTOL:", "if worst <= 10 * FLOAT32_RTOL:"),
    Mutant(
        "bf16 tolerance granted to a float32 loop (low-precision gate skipped)",
        H,
        "if low_precision and worst <= BF16_RTOL:",
        "if worst <= BF16_RTOL:",
    ),
    Mutant(
        "off by ~k when any step is, not all",
        H,
        "    if all(\n        abs(c.norm_ratio - m)",
        "    if any(\n        abs(c.norm_ratio - m)",
    ),
    Mutant("off-by-k tolerance loosened 10x", H, "<= OFF_BY_K_TOL * m", "<= 10 * OFF_BY_K_TOL * m"),
    Mutant(
        "off by k judged against k, not the window's own micro-batch count m",
        H,
        "trace.window_batches.append(len(window))",
        "trace.window_batches.append(k)",
    ),
    Mutant(
        "the contract's task fields override the caller's (count_items)",
        H,
        "loop_kwargs = contract.kwargs_for(task) | loop_kwargs",
        "loop_kwargs = loop_kwargs | contract.kwargs_for(task)",
    ),
    Mutant(
        "micro-batches drawn after the last step (a dropped tail) not counted",
        H,
        "    everything.extend(loader.take())  # drawn after the last step: a dropped tail\n",
        "",
    ),
    Mutant(
        "the oracle over everything drawn so far, not the window",
        H,
        "oracle = true_gradient(model, window,",
        "oracle = true_gradient(model, everything,",
    ),
    Mutant(
        "window items counted as micro-batches",
        H,
        "trace.window_items.append(sum(task.count_items(b) for b in window))",
        "trace.window_items.append(len(window))",
    ),
    Mutant(
        "the reference table's steps expected taken from the steps seen (a missing step cannot show)",
        R,
        "expected_steps=expected_steps(trace.n_batches, task.accum_steps)",
        "expected_steps=len(trace.comparisons)",
    ),
    Mutant(
        "items available taken from the items used (a dropped tail cannot show)",
        R,
        "items_available=trace.n_items",
        "items_available=sum(trace.window_items)",
    ),
    Mutant("the table's cosine is the best step's", R, "min_cosine=min(c.cosine", "min_cosine=max(c.cosine"),
    Mutant(
        "the table's error is the best step's",
        R,
        "max_rel_error=max(c.rel_error",
        "max_rel_error=min(c.rel_error",
    ),
    Mutant(
        "the table is ok when any row holds",
        R,
        "return all(r.holds for r in self.rows)",
        "return any(r.holds for r in self.rows)",
    ),
    Mutant(
        "every loop gets the bf16 tolerance", R, "low_precision=contract.low_precision", "low_precision=True"
    ),
    Mutant(
        "several tags taken alphabetically, not by priority (a ragged tail before token counts)",
        CT,
        'kind = next((k for k in KINDS if k in tags), "full-windows")',
        'kind = next((k for k in sorted(tags) if k in KINDS), "full-windows")',
    ),
    Mutant(
        "token counts and a ragged tail swapped in priority",
        CT,
        'KINDS = ("batchnorm", "token-counts", "ragged-tail", "full-windows")',
        'KINDS = ("batchnorm", "ragged-tail", "token-counts", "full-windows")',
    ),
    Mutant(
        "amp's default dtypes swapped: float16 on CPU, bfloat16 on CUDA",
        AMP,
        'dtype = dtype or (torch.float16 if device.type == "cuda" else torch.bfloat16)',
        'dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float16)',
        tests=("tests/test_loops.py::test_amp_autocasts_to_bfloat16_on_cpu_and_float16_on_cuda",),
    ),
    Mutant(
        "an unknown loop name is not refused up front",
        R,
        "        if name not in CONTRACTS:\n            raise",
        "        if False:\n            raise",
    ),
]
