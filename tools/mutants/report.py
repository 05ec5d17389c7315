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

MUTANTS = [
    # --- compute.py: the cells, the findings, the tables, the amp verdict
    Mutant(
        "a loop's finding names its best k, not its worst",
        "replace",
        "max(errors.values())",
        "min",
        node="max",
        killers=("tests/test_report_findings_and_figures.py::test_the_findings_name_each_loops_worst_k",),
    ),
    Mutant(
        "the norm finding quotes the best k's error, not the maximum",
        "replace",
        "max(self.norm_errors.values())",
        "min",
        node="max",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_norm_section_reports_each_ks_worst_step_and_the_worst_k",
        ),
    ),
    Mutant(
        "the norm section keeps each k's best step, not its worst",
        "replace",
        "max((c.rel_error for c in trace_loop(ragged, cnn, accum_steps=k, batch_size=p.batch_size, "
        "seed=p.seed, device=dev).comparisons))",
        "min",
        node="max",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_norm_section_reports_each_ks_worst_step_and_the_worst_k",
        ),
    ),
    Mutant(
        "a cell's verdict is 'ok' whatever verify's report says",
        "replace",
        "verdict_text(trace.verdict)",
        "'ok'",
        killers=("tests/test_report_findings_and_figures.py::test_the_findings_name_each_loops_worst_k",),
    ),
    Mutant(
        "the amp loop's replay errors dropped (its ok read as exact)",
        "replace",
        "'dtype' in kwargs",
        "False",
        killers=(
            "tests/test_report_findings_and_figures.py::test_a_wrong_low_precision_loop_is_not_exact_in_the_report",
        ),
    ),
    Mutant(
        "a cell's cosine is its best step's",
        "replace",
        "min",
        "max",
        within="run",
        killers=("tests/test_report_findings_and_figures.py::test_cells_keep_each_loops_worst_step",),
    ),
    Mutant(
        "a cell's norm ratio is its best step's",
        "replace",
        "max((c.norm_ratio for c in trace.comparisons))",
        "min",
        node="max",
        within="run",
        killers=("tests/test_report_findings_and_figures.py::test_cells_keep_each_loops_worst_step",),
    ),
    Mutant(
        "a cell's error is its last step's, not its worst",
        "replace",
        "max(self.rel_errors)",
        "self.rel_errors[-1]",
        killers=("tests/test_report_findings_and_figures.py::test_cells_keep_each_loops_worst_step",),
    ),
    Mutant(
        "steps expected taken from the steps seen (a missing step cannot show)",
        "replace",
        "expected_steps(trace.n_batches, k)",
        "len(trace.comparisons)",
        killers=(
            "tests/test_report_findings_and_figures.py::test_a_loop_that_drops_a_micro_batch_shows_the_missing_step_and_items",
        ),
    ),
    Mutant(
        "items stepped counted as micro-batches",
        "replace",
        "trace.window_items",
        "trace.window_batches",
        within="run",
        killers=("tests/test_report_findings_and_figures.py::test_cells_keep_each_loops_worst_step",),
    ),
    Mutant(
        "the seed not forwarded to the loops' runs",
        "replace",
        "trace_loop(loop, t, accum_steps=k, batch_size=p.batch_size, lr=LR, seed=p.seed, device=dev, "
        "**kwargs)",
        "trace_loop(loop, t, accum_steps=k, batch_size=p.batch_size, lr=LR, device=dev, **kwargs)",
        killers=("tests/test_report_findings_and_figures.py::test_the_seed_reaches_the_model",),
    ),
    Mutant(
        "the large batch's activation memory measured on one micro-batch",
        "replace",
        "t.merge(window)",
        "first",
        killers=(
            "tests/test_report_findings_and_figures.py::test_memory_finding_and_table_compare_one_micro_batch_with_the_large_batch",
        ),
    ),
    Mutant(
        "the memory finding at the smallest k",
        "replace",
        "max(self.ks)",
        "min",
        node="max",
        killers=(
            "tests/test_report_findings_and_figures.py::test_memory_finding_and_table_compare_one_micro_batch_with_the_large_batch",
        ),
    ),
    Mutant(
        "a dropped-items finding even when every item was stepped",
        "compare",
        "c.items_used < c.items",
        "<=",
        killers=(
            "tests/test_report_findings_and_figures.py::test_no_finding_of_dropped_items_when_every_loop_steps_its_tail",
        ),
    ),
    Mutant(
        "the settings count steps per epoch without the tail step",
        "replace",
        "expected_steps(self.n_batches, k)",
        "self.n_batches // k",
        killers=("tests/test_report_findings_and_figures.py::test_the_settings_count_the_tail_step",),
    ),
    Mutant(
        "the memory table's saving inverted",
        "swap-args",
        "f'{big / m:.2f}x'",
        node="big / m",
        killers=(
            "tests/test_report_findings_and_figures.py::test_memory_finding_and_table_compare_one_micro_batch_with_the_large_batch",
        ),
    ),
    Mutant(
        "results_path given but no JSON written",
        "replace",
        "if p.results_path:\n"
        "    with open(p.results_path, 'w') as f:\n"
        "        json.dump(result.summary(), f, indent=1)",
        "False",
        node="p.results_path",
        killers=(
            "tests/test_report_findings_and_figures.py::test_a_bare_results_path_is_written_in_the_working_folder",
        ),
    ),
    # --- params.py: defaults and the checks before any work
    Mutant(
        "a bare results_path (no folder part) refused: its folder '' does not exist",
        "replace",
        "os.path.isdir(os.path.dirname(os.path.abspath(path)))",
        "path",
        node="os.path.abspath(path)",
        killers=(
            "tests/test_report_findings_and_figures.py::test_a_bare_results_path_is_written_in_the_working_folder",
        ),
    ),
    Mutant(
        "results_path not required to end in .json",
        "replace",
        "path and (not path.endswith('.json'))",
        "False",
        killers=("tests/test_report.py::test_run_refuses_bad_parameters_before_any_work",),
    ),
    Mutant(
        "the seed not kept in the checked parameters",
        "replace",
        "Parameters(t, ks, batch_size, norm, precision, dev, seed, path)",
        "0",
        node="seed",
        killers=("tests/test_report_findings_and_figures.py::test_the_seed_reaches_the_model",),
    ),
    Mutant(
        "the three-step rule off by one (two steps allowed)",
        "replace",
        "expected_steps(n_batches, k) < MIN_STEPS",
        "MIN_STEPS - 1",
        node="MIN_STEPS",
        killers=("tests/test_report.py::test_refuses_k_with_fewer_than_three_steps_and_says_what_works",),
    ),
    Mutant(
        "the largest k suggested is one too many",
        "drop-term",
        "n_batches - 1",
        "1",
        killers=("tests/test_report.py::test_refuses_k_with_fewer_than_three_steps_and_says_what_works",),
    ),
    Mutant(
        "the norm section's data not held to the step rule",
        "replace",
        "((f'task {t.name!r}', t), (f\"the norm section's {cnn.name!r}\", cnn))",
        "((f'task {t.name!r}', t),)",
        killers=("tests/test_report.py::test_the_norm_section_is_held_to_the_same_rule",),
    ),
    Mutant(
        "the CNN built with its default norm, not the report's",
        "replace",
        "SmallCNN(norm=norm)",
        "SmallCNN()",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_norm_section_reports_each_ks_worst_step_and_the_worst_k",
        ),
    ),
    Mutant(
        "a default changed: micro-batches of 4",
        "constant",
        "dict(task='mlp-digits', accum_steps=(1, 2, 4, 8), batch_size=3, norm='group', "
        "precision='float32', device='auto', seed=0, results_path='')",
        "4",
        node="3",
        killers=("tests/test_report.py::test_defaults_agree_in_run_the_notebook_and_the_makefile",),
    ),
    Mutant(
        "comma-separated k not accepted",
        "replace",
        "accum_steps.replace(',', ' ')",
        "accum_steps",
        killers=("tests/test_report.py::test_parse_accum",),
    ),
    # --- figures.py: what each figure plots and its alt text says
    Mutant(
        "the step figure's default k is the smallest",
        "replace",
        "max",
        "min",
        within="plot_steps",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_step_figure_defaults_to_the_largest_k",
        ),
    ),
    Mutant(
        "the step figure's alt text defaults to the smallest k",
        "replace",
        "'Alt text of ``plot_steps``.'\nk = k or max(result.ks)",
        "min",
        node="max",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_step_figure_defaults_to_the_largest_k",
        ),
    ),
    Mutant(
        "the error figure plots each k's last step, not its worst",
        "replace",
        "[result.cells[name, k].max_rel_error for k in result.ks]",
        "result.cells[name, k].rel_errors[-1]",
        node="result.cells[name, k].max_rel_error",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_error_figure_plots_each_loops_worst_step_by_k",
        ),
    ),
    Mutant(
        "the error alt text quotes each k's last step",
        "replace",
        "_alt_number(result.cells[name, k].max_rel_error)",
        "result.cells[name, k].rel_errors[-1]",
        node="result.cells[name, k].max_rel_error",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_error_figure_plots_each_loops_worst_step_by_k",
        ),
    ),
    Mutant(
        "the tolerance band drawn 10x above the float32 bound",
        "replace",
        "ax.axhspan(ZERO / 3, FLOAT32_RTOL, color='0.88', zorder=0, label=f'exact: within float32 "
        "rounding (<= {FLOAT32_RTOL:g})')",
        "10 * FLOAT32_RTOL",
        node="FLOAT32_RTOL",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_error_figure_plots_each_loops_worst_step_by_k",
        ),
    ),
    Mutant(
        "the loss panel plots raw logged losses, not the gap to the large batch",
        "replace",
        "[a - b for a, b in zip(cell.logged, ref.logged)]",
        "list(cell.logged)",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_step_figure_defaults_to_the_largest_k",
        ),
    ),
    Mutant(
        "every last step labelled a tail, a full window too",
        "drop-clause",
        "cell.window_batches and cell.window_batches[-1] < cell.k",
        "cell.window_batches[-1] < cell.k",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_step_figure_at_a_k_with_full_windows_marks_no_tail",
        ),
    ),
    Mutant(
        "the step alt text's tail is the first window",
        "replace",
        "ref.window_batches[-1]",
        "0",
        node="-1",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_step_figure_defaults_to_the_largest_k",
        ),
    ),
    Mutant(
        "the memory figure's two lines swapped",
        "replace",
        "[big / 1024 for _, big in result.memory.values()]",
        "[m / 1024 for m, _ in result.memory.values()]",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_memory_and_norm_figure_plots_both_sides",
        ),
    ),
    Mutant(
        "an exact 0 left at 0 on a log axis",
        "replace",
        "max(value, ZERO)",
        "value",
        killers=(
            "tests/test_report_findings_and_figures.py::test_the_error_figure_plots_each_loops_worst_step_by_k",
        ),
    ),
    # a loop's style role is read from its contract's verdicts (figures.role_of -> Contract.role)
    Mutant(
        "naive drawn in the correct loop's style",
        "constant",
        "'buggy' if any((CODES[c].kind == 'bug' for c in self.full_windows)) else 'other'",
        "'correct'",
        node="'buggy'",
        killers=(
            "tests/test_report.py::test_each_loops_style_comes_from_its_contract_and_keeps_todays_looks",
        ),
    ),
    Mutant(
        "amp, passed against its own dtype's replay, drawn as a correct loop",
        "replace",
        "self.low_precision",
        "False",
        killers=(
            "tests/test_report.py::test_each_loops_style_comes_from_its_contract_and_keeps_todays_looks",
        ),
    ),
]
