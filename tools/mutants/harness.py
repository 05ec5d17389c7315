"""Mutants of accumlib/harness.py and accumlib/reference.py: the reference loops' run under verify and their
table; and of what the table reads from the loops (a contract's verdict per kind of task), a step's cosine,
and one loop's own default that no reference run can show (amp's autocast dtype on CUDA: its test stops the
loop at autocast)."""

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
        "the contract's task fields override the caller's (count_items)",
        H,
        "loop_kwargs = contract.kwargs_for(task) | loop_kwargs",
        "loop_kwargs = loop_kwargs | contract.kwargs_for(task)",
    ),
    Mutant(
        "the logged losses of every run verify made, not the judged one's (amp runs twice)",
        H,
        "logged[:] = [] if out is None else list(out)",
        "logged += [] if out is None else list(out)",
    ),
    Mutant(
        "the epoch's micro-batches counted per window of k, not per batch",
        H,
        "math.ceil(len(dataset) / bs)",
        "math.ceil(len(dataset) / k)",
    ),
    Mutant(
        "window items counted as micro-batches",
        H,
        "return [s.items for s in self.report.steps]",
        "return [s.micro_batches for s in self.report.steps]",
    ),
    Mutant(
        "the verdict is the first finding's code alone",
        H,
        "return tuple(sorted(self.report.codes))",
        "return tuple(sorted(self.report.codes))[:1]",
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
        "the table's verdict read from the promise, not from verify",
        R,
        "verdict=trace.verdict,",
        "verdict=CONTRACTS[name].expected(task.tags),",
    ),
    Mutant(
        "the table says float32 for every row (an autocast loop's ok read as exact)",
        R,
        'judged_against=", ".join(dict.fromkeys(s.judged_against for s in trace.comparisons)),',
        'judged_against="float32",',
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
        "a contract's codes not checked against the codes table",
        CT,
        "unknown = sorted(set(verdict) - set(CODES))",
        "unknown = []",
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
    Mutant(
        "a step's cosine from the norm ratio alone",
        "accumlib/_verify/report.py",
        "(1 + r * r - e * e) / (2 * r)",
        "(1 + r * r) / (2 * r)",
    ),
]
