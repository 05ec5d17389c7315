"""Mutants of accumlib_course/report/: the papermill report's parameters, computation, findings and figures.

accumlib_course/report/__init__.py only re-exports names (a missing one fails at import); no mutant there.
"""

from mutate import Mutant

# the small run first (seconds): with -x a killed mutant stops there; then the papermill report
TESTS = [
    "tests/test_report_findings_and_figures.py",
    "tests/test_report.py",
    "accumlib_course/report/__init__.py",
    "accumlib_course/report/params.py",
]
PYTEST_ARGS = ["--doctest-modules"]  # the package's and parse_accum's examples are part of the suite

# compute.py runs the report; _compute_result.py holds its result classes (cells, findings, tables)
C, CR = "accumlib_course/report/compute.py", "accumlib_course/report/_compute_result.py"
F, P = "accumlib_course/report/figures.py", "accumlib_course/report/params.py"
MUTANTS = [
    # --- compute.py: the cells, the findings, the tables, the amp verdict
    Mutant(
        "a loop's finding names its best k, not its worst",
        CR,
        "top = max(errors.values())",
        "top = min(errors.values())",
    ),
    Mutant(
        "the norm finding quotes the best k's error, not the maximum",
        CR,
        "norm_worst = max(self.norm_errors.values())",
        "norm_worst = min(self.norm_errors.values())",
    ),
    Mutant(
        "the norm section keeps each k's best step, not its worst",
        C,
        "        k: max(\n            c.rel_error",
        "        k: min(\n            c.rel_error",
    ),
    Mutant(
        "a cell's verdict is 'ok' whatever verify's report says", C, "verdict_text(trace.verdict),", '"ok",'
    ),
    Mutant(
        "the amp loop's replay errors dropped (its ok read as exact)",
        C,
        'if "dtype" in kwargs else ()',
        "if False else ()",
    ),
    Mutant(
        "a cell's cosine is its best step's",
        C,
        "min(c.cosine for c in trace.comparisons)",
        "max(c.cosine for c in trace.comparisons)",
    ),
    Mutant(
        "a cell's norm ratio is its best step's",
        C,
        "max(c.norm_ratio for c in trace.comparisons)",
        "min(c.norm_ratio for c in trace.comparisons)",
    ),
    Mutant(
        "a cell's error is its last step's, not its worst",
        CR,
        "return max(self.rel_errors)",
        "return self.rel_errors[-1]",
    ),
    Mutant(
        "steps expected taken from the steps seen (a missing step cannot show)",
        C,
        "expected_steps(trace.n_batches, k),\n                sum(trace.window_items),",
        "len(trace.comparisons),\n                sum(trace.window_items),",
    ),
    Mutant(
        "items stepped counted as micro-batches",
        C,
        "sum(trace.window_items),\n                trace.n_items,",
        "sum(trace.window_batches),\n                trace.n_items,",
    ),
    Mutant(
        "the seed not forwarded to the loops' runs",
        C,
        "lr=LR, seed=p.seed, device=dev, **kwargs",
        "lr=LR, device=dev, **kwargs",
    ),
    Mutant(
        "the large batch's activation memory measured on one micro-batch",
        C,
        "activation_bytes(model, t.merge(window)",
        "activation_bytes(model, first",
    ),
    Mutant("the memory finding at the smallest k", CR, "k_max = max(self.ks)", "k_max = min(self.ks)"),
    Mutant(
        "a dropped-items finding even when every item was stepped",
        CR,
        "if c.items_used < c.items]",
        "if c.items_used <= c.items]",
    ),
    Mutant(
        "the settings count steps per epoch without the tail step",
        CR,
        'f"{expected_steps(self.n_batches, k)} at k = {k}"',
        'f"{self.n_batches // k} at k = {k}"',
    ),
    Mutant("the memory table's saving inverted", CR, 'f"{big / m:.2f}x"', 'f"{m / big:.2f}x"'),
    Mutant(
        "results_path given but no JSON written",
        C,
        "    if p.results_path:\n        with open",
        "    if False:\n        with open",
    ),
    # --- params.py: defaults and the checks before any work
    Mutant(
        "a bare results_path (no folder part) refused: its folder '' does not exist",
        P,
        "if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):",
        "if path and not os.path.isdir(os.path.dirname(path)):",
    ),
    Mutant(
        "results_path not required to end in .json", P, 'if path and not path.endswith(".json"):', "if False:"
    ),
    Mutant(
        "the seed not kept in the checked parameters",
        P,
        "return Parameters(t, ks, batch_size, norm, precision, dev, seed, path)",
        "return Parameters(t, ks, batch_size, norm, precision, dev, 0, path)",
    ),
    Mutant(
        "the three-step rule off by one (two steps allowed)",
        P,
        "if expected_steps(n_batches, k) < MIN_STEPS]",
        "if expected_steps(n_batches, k) < MIN_STEPS - 1]",
    ),
    Mutant(
        "the largest k suggested is one too many",
        P,
        "k_max = (n_batches - 1) // (MIN_STEPS - 1)",
        "k_max = n_batches // (MIN_STEPS - 1)",
    ),
    Mutant(
        "the norm section's data not held to the step rule",
        P,
        ', (f"the norm section\'s {cnn.name!r}", cnn))',
        ",)",
    ),
    Mutant(
        "the CNN built with its default norm, not the report's",
        P,
        "return SmallCNN(norm=norm)",
        "return SmallCNN()",
    ),
    Mutant(
        "a default changed: micro-batches of 4",
        P,
        "    accum_steps=(1, 2, 4, 8),\n    batch_size=3,\n",
        "    accum_steps=(1, 2, 4, 8),\n    batch_size=4,\n",
    ),
    Mutant(
        "comma-separated k not accepted", P, 'accum_steps.replace(",", " ").split()', "accum_steps.split()"
    ),
    # --- figures.py: what each figure plots and its alt text says
    Mutant(
        "the step figure's default k is the smallest",
        F,
        "k = k or max(result.ks)",
        "k = k or min(result.ks)",
        at=0,
    ),
    Mutant(
        "the step figure's alt text defaults to the smallest k",
        F,
        "k = k or max(result.ks)",
        "k = k or min(result.ks)",
        at=1,
    ),
    Mutant(
        "the error figure plots each k's last step, not its worst",
        F,
        "ys = [result.cells[(name, k)].max_rel_error",
        "ys = [result.cells[(name, k)].rel_errors[-1]",
    ),
    Mutant(
        "the error alt text quotes each k's last step",
        F,
        "_alt_number(result.cells[(name, k)].max_rel_error)",
        "_alt_number(result.cells[(name, k)].rel_errors[-1])",
    ),
    Mutant(
        "the tolerance band drawn 10x above the float32 bound",
        F,
        "        ZERO / 3,\n        FLOAT32_RTOL,\n",
        "        ZERO / 3,\n        10 * FLOAT32_RTOL,\n",
    ),
    Mutant(
        "the loss panel plots raw logged losses, not the gap to the large batch",
        F,
        "bx.plot(steps, [a - b for a, b in zip(cell.logged, ref.logged)]",
        "bx.plot(steps, list(cell.logged)",
    ),
    Mutant(
        "every last step labelled a tail, a full window too",
        F,
        "if cell.window_batches and cell.window_batches[-1] < cell.k:",
        "if cell.window_batches:",
    ),
    Mutant(
        "the step alt text's tail is the first window",
        F,
        "{ref.window_batches[-1]} of {k} micro-batches",
        "{ref.window_batches[0]} of {k} micro-batches",
    ),
    Mutant(
        "the memory figure's two lines swapped",
        F,
        "[big / 1024 for _, big in result.memory.values()]",
        "[m / 1024 for m, _ in result.memory.values()]",
    ),
    Mutant("an exact 0 left at 0 on a log axis", F, "return max(value, ZERO)", "return value"),
    # a loop's style role is read from its contract's verdicts (figures.role_of -> Contract.role)
    Mutant(
        "naive drawn in the correct loop's style",
        "accumlib/loops/_contract.py",
        'return "buggy" if any(CODES[c].kind == "bug" for c in self.full_windows) else "other"',
        'return "correct" if any(CODES[c].kind == "bug" for c in self.full_windows) else "other"',
    ),
    Mutant(
        "amp, passed against its own dtype's replay, drawn as a correct loop",
        "accumlib/loops/_contract.py",
        "        if self.low_precision:  # passed against",
        "        if False:  # passed against",
    ),
]
