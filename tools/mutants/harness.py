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

MUTANTS = [
    Mutant(
        "the contract's task fields override the caller's (count_items)",
        "swap-args",
        "contract.kwargs_for(task) | loop_kwargs",
        killers=("tests/test_harness.py::test_a_callers_count_items_is_the_one_the_loop_uses",),
    ),
    Mutant(
        "the logged losses of every run verify made, not the judged one's (amp runs twice)",
        "replace",
        "logged[:] = [] if out is None else list(out)",
        "logged += [] if out is None else list(out)",
        killers=("tests/test_harness.py::test_a_trace_is_verifys_report_of_the_same_run",),
    ),
    Mutant(
        "the epoch's micro-batches counted per window of k, not per batch",
        "replace",
        "len(dataset) / bs",
        "k",
        node="bs",
        killers=(
            "tests/test_harness.py::test_a_loop_that_drops_its_partial_window_shows_3_of_4_steps_and_96_of_110_items",
        ),
    ),
    Mutant(
        "window items counted as micro-batches",
        "replace",
        "[s.items for s in self.report.steps]",
        "s.micro_batches",
        node="s.items",
        killers=(
            "tests/test_harness.py::test_a_loop_that_drops_its_partial_window_shows_3_of_4_steps_and_96_of_110_items",
        ),
    ),
    Mutant(
        "the verdict is the first finding's code alone",
        "replace",
        "tuple(sorted(self.report.codes))",
        "tuple(sorted(self.report.codes))[:1]",
        killers=("tests/test_contracts.py::test_the_table_reads_each_promise_from_the_contract",),
    ),
    Mutant(
        "the reference table's steps expected taken from the steps seen (a missing step cannot show)",
        "replace",
        "expected_steps(trace.n_batches, task.accum_steps)",
        "len(trace.comparisons)",
        killers=(
            "tests/test_harness.py::test_a_loop_that_drops_its_partial_window_shows_3_of_4_steps_and_96_of_110_items",
        ),
    ),
    Mutant(
        "items available taken from the items used (a dropped tail cannot show)",
        "replace",
        "trace.n_items",
        "sum(trace.window_items)",
        within="check_reference_loops",
        killers=(
            "tests/test_harness.py::test_a_loop_that_drops_its_partial_window_shows_3_of_4_steps_and_96_of_110_items",
        ),
    ),
    Mutant(
        "the table's cosine is the best step's",
        "replace",
        "min",
        "max",
        within="check_reference_loops",
        killers=("tests/test_harness.py::test_the_table_reports_the_worst_step_of_each_row",),
    ),
    Mutant(
        "the table's error is the best step's",
        "replace",
        "max",
        "min",
        within="check_reference_loops",
        killers=("tests/test_harness.py::test_the_table_reports_the_worst_step_of_each_row",),
    ),
    Mutant(
        "the table is ok when any row holds",
        "replace",
        "all((r.holds for r in self.rows))",
        "any",
        node="all",
        killers=("tests/test_harness.py::test_one_broken_promise_among_kept_ones_turns_the_table_red",),
    ),
    Mutant(
        "the table's verdict read from the promise, not from verify",
        "replace",
        "trace.verdict",
        "CONTRACTS[name].expected(task.tags)",
        within="check_reference_loops",
        killers=(
            "tests/test_harness.py::test_a_loop_that_drops_its_partial_window_shows_3_of_4_steps_and_96_of_110_items",
        ),
    ),
    Mutant(
        "the table says float32 for every row (an autocast loop's ok read as exact)",
        "replace",
        "', '.join(dict.fromkeys((s.judged_against for s in trace.comparisons)))",
        "'float32'",
        killers=(
            "tests/test_harness.py::test_an_autocast_loop_is_judged_against_its_dtypes_replay_and_says_so",
        ),
    ),
    Mutant(
        "several tags taken alphabetically, not by priority (a ragged tail before token counts)",
        "replace",
        "(k for k in KINDS if k in tags)",
        "(k for k in sorted(tags) if k in KINDS)",
        killers=(
            "tests/test_contracts.py::test_several_tags_are_taken_by_priority_each_kind_its_own_verdict",
        ),
    ),
    Mutant(
        "token counts and a ragged tail swapped in priority",
        "replace",
        "('batchnorm', 'token-counts', 'ragged-tail', 'full-windows')",
        "('batchnorm', 'ragged-tail', 'token-counts', 'full-windows')",
        killers=(
            "tests/test_contracts.py::test_several_tags_are_taken_by_priority_each_kind_its_own_verdict",
        ),
    ),
    Mutant(
        "a contract's codes not checked against the codes table",
        "replace",
        "sorted(set(verdict) - set(CODES))",
        "[]",
        killers=("tests/test_contracts.py::test_a_contract_refuses_an_unknown_verdict_or_task_field",),
    ),
    Mutant(
        "amp's default dtypes swapped: float16 on CPU, bfloat16 on CUDA",
        "replace",
        "dtype or (torch.float16 if device.type == 'cuda' else torch.bfloat16)",
        "torch.bfloat16 if device.type == 'cuda' else torch.float16",
        node="torch.float16 if device.type == 'cuda' else torch.bfloat16",
        killers=("tests/test_loops.py::test_amp_autocasts_to_bfloat16_on_cpu_and_float16_on_cuda",),
        tests=("tests/test_loops.py::test_amp_autocasts_to_bfloat16_on_cpu_and_float16_on_cuda",),
    ),
    Mutant(
        "an unknown loop name is not refused up front",
        "replace",
        "name not in CONTRACTS",
        "False",
        killers=("tests/test_compare_memory_oracle.py::test_cli_bad_usage_exits_2",),
    ),
    Mutant(
        "a step's cosine from the norm ratio alone",
        "drop-term",
        "1 + r * r - e * e",
        "e * e",
        killers=("tests/test_harness.py::test_the_step_figures_match_the_tests_own_oracle",),
    ),
]
