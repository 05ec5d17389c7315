"""Mutants of accumlib/survey/: which classes it surveys, how each is built and judged, how rows render.

accumlib/survey/__init__.py only re-exports names (a missing one fails at import); no mutant there.
"""

from mutate import Mutant

# the one- and two-class tests first (seconds each): with -x a killed mutant stops there; then the
# committed tables and the CI subset re-run (a minute)
TESTS = ["tests/test_survey_rows.py", "tests/test_survey.py"]

MUTANTS = [
    # --- run.py: names, the task, each class's row
    Mutant(
        "a class name means the first model type listed for it (GPT2LMHeadModel -> gpt-sw3): the fix reverted",
        "drop-clause",
        "cls.lower() not in by_class or t == _own_type(cls)",
        "t == _own_type(cls)",
        killers=("tests/test_survey_rows.py::test_names_are_trimmed_and_each_class_surveyed_once",),
    ),
    Mutant(
        "an unknown name dropped silently, not refused",
        "replace",
        "if unknown:\n"
        '    raise ValueError(f"models must name {TASKS[task].title} model types or classes of '
        "transformers {installed_version('transformers')} (e.g. gpt2, llama, GPT2LMHeadModel) (got "
        "unknown {', '.join(unknown)})\")",
        "False",
        node="unknown",
        killers=("tests/test_survey_rows.py::test_unknown_names_are_refused_each_by_name",),
    ),
    Mutant(
        "class names matched case-sensitively",
        "replace",
        "key.lower()",
        "key",
        killers=("tests/test_survey_rows.py::test_names_are_trimmed_and_each_class_surveyed_once",),
    ),
    Mutant(
        "names not trimmed ('gpt2, llama')",
        "replace",
        "m.strip()",
        "m",
        killers=("tests/test_survey_rows.py::test_names_are_trimmed_and_each_class_surveyed_once",),
    ),
    Mutant(
        "a class named twice surveyed twice",
        "replace",
        "list(dict.fromkeys(out))",
        "out",
        killers=("tests/test_survey_rows.py::test_names_are_trimmed_and_each_class_surveyed_once",),
    ),
    Mutant(
        "no names means no classes, not all",
        "replace",
        "list(names)",
        "[]",
        killers=("tests/test_survey_rows.py::test_no_names_mean_every_class_of_the_task",),
    ),
    Mutant(
        "the task not forwarded when resolving names",
        "replace",
        "resolve(models, task)",
        "resolve(models)",
        killers=("tests/test_survey_rows.py::test_the_task_picks_the_classes_built_and_the_setup_stated",),
    ),
    Mutant(
        "the task not forwarded to each class",
        "replace",
        "survey_one(t, task)",
        "survey_one(t)",
        killers=("tests/test_survey_rows.py::test_the_task_picks_the_classes_built_and_the_setup_stated",),
    ),
    Mutant(
        "the setup never mentions the sequence labels",
        "replace",
        "', one of 3 labels each' if task == 'sequence-classification' else ''",
        "''",
        killers=("tests/test_survey_rows.py::test_the_task_picks_the_classes_built_and_the_setup_stated",),
    ),
    Mutant(
        "c kept for misscaled steps only, not for an unscaled sum",
        "replace",
        "report.codes & {'misscaled', 'unscaled-sum'}",
        "'misscaled' in report.codes",
        killers=("tests/test_survey.py::test_a_subset_rerun_matches_the_committed_survey",),
    ),
    Mutant(
        "c rounded to 2 places",
        "constant",
        "round(s.factor, 6)",
        "2",
        node="6",
        killers=("tests/test_survey.py::test_a_subset_rerun_matches_the_committed_survey",),
    ),
    Mutant(
        "the cause of a misscale dropped",
        "constant",
        "'labels counted before the shift (c = N/(N+S))'",
        "''",
        killers=("tests/test_survey.py::test_a_subset_rerun_matches_the_committed_survey",),
    ),
    Mutant(
        "a row's error is its best step's",
        "replace",
        "max(errors)",
        "min",
        node="max",
        killers=("tests/test_survey.py::test_a_subset_rerun_matches_the_committed_survey",),
    ),
    Mutant(
        "a Trainer failure reported as skipped",
        "delete",
        "row.status = 'error'",
        killers=("tests/test_survey_rows.py::test_a_class_the_trainer_cannot_train_is_an_error_row",),
    ),
    Mutant(
        "a class that is not tiny loses the 'not tiny' reason",
        "replace",
        "try:\n"
        "    model = tiny_model(model_type, task)\n"
        "    row.params = sum((p.numel() for p in model.parameters()))\n"
        "    row.loss_type = getattr(model, 'loss_type', None)\n"
        "    row.item_losses = own_item_losses(model, task)\n"
        "except NotTiny as err:\n"
        "    row.reason = f'not tiny: {err}'\n"
        "    return row\n"
        "except Exception as err:\n"
        "    row.reason = f'{type(err).__name__}: {_one_line(err)}'\n"
        "    return row",
        "try:\n"
        "    model = tiny_model(model_type, task)\n"
        "    row.params = sum((p.numel() for p in model.parameters()))\n"
        "    row.loss_type = getattr(model, 'loss_type', None)\n"
        "    row.item_losses = own_item_losses(model, task)\n"
        "except Exception as err:\n"
        "    row.reason = f'{type(err).__name__}: {_one_line(err)}'\n"
        "    return row",
        killers=("tests/test_survey_rows.py::test_the_task_picks_the_classes_built_and_the_setup_stated",),
    ),
    Mutant(
        "a multi-line error kept multi-line in its row",
        "replace",
        "' '.join(str(err).split())",
        "str(err)",
        killers=("tests/test_survey_rows.py::test_a_class_the_trainer_cannot_train_is_an_error_row",),
    ),
    Mutant(
        "the time limit never armed",
        "replace",
        "signal.alarm(seconds)",
        "0",
        node="seconds",
        killers=("tests/test_survey_rows.py::test_a_class_over_its_time_limit_is_a_row_with_the_reason",),
    ),
    # --- models.py: the tiny build, the item loss, the Trainer
    Mutant(
        "layers shrunk to 2, not 1",
        "constant",
        "min(value, 1)",
        "2",
        node="1",
        killers=("tests/test_survey_rows.py::test_classes_whose_configs_tie_sizes_together_are_built_tiny",),
    ),
    Mutant(
        "dropout fields left as they are",
        "replace",
        "return 0.0",
        "value",
        node="0.0",
        killers=("tests/test_survey_rows.py::test_the_item_loss_is_the_one_the_models_loss_averages",),
    ),
    Mutant(
        "the per-class size fixes not applied",
        "drop-factor",
        "changes | TINY_FOR.get(model_type, {})",
        "TINY_FOR.get(model_type, {})",
        killers=("tests/test_survey_rows.py::test_classes_whose_configs_tie_sizes_together_are_built_tiny",),
    ),
    Mutant(
        "the task's config (num_labels) not applied",
        "drop-factor",
        "changes | TINY_FOR.get(model_type, {}) | TASKS[task].config",
        "TASKS[task].config",
        killers=("tests/test_survey.py::test_a_subset_rerun_matches_the_committed_survey",),
    ),
    Mutant(
        "the tiny model not seeded",
        "delete",
        "torch.manual_seed(seed)\nreturn cls(config)",
        node="torch.manual_seed(seed)",
        killers=("tests/test_survey_rows.py::test_a_tiny_model_is_built_from_its_seed",),
    ),
    Mutant(
        "the item loss found in eval mode (dropout cannot show)",
        "replace",
        "was = model.training\nmodel.train()",
        "model.eval",
        node="model.train",
        killers=(
            "tests/test_survey_rows.py::test_a_random_training_forward_is_refused_and_the_mode_restored",
        ),
    ),
    Mutant(
        "the caller's train/eval mode not restored",
        "replace",
        "model.train(was)",
        "pass",
        killers=(
            "tests/test_survey_rows.py::test_a_random_training_forward_is_refused_and_the_mode_restored",
        ),
    ),
    Mutant(
        "a random training-mode loss not refused",
        "replace",
        "own[0] != own[1]",
        "False",
        killers=(
            "tests/test_survey_rows.py::test_a_random_training_forward_is_refused_and_the_mode_restored",
        ),
    ),
    Mutant(
        "the loss match tolerance loosened 10x",
        "replace",
        "LOSS_RTOL * abs(own[0])",
        "10 * LOSS_RTOL",
        node="LOSS_RTOL",
        killers=("tests/test_survey_rows.py::test_the_item_loss_is_the_one_the_models_loss_averages",),
    ),
    Mutant(
        "an unknown task not refused by name (a KeyError)",
        "replace",
        "check_choice('task', task, tuple(TASKS))",
        "task",
        killers=("tests/test_survey_rows.py::test_an_unknown_task_is_refused_by_name",),
    ),
    Mutant(
        "the unshifted loss counts padding positions as items (zero losses)",
        "replace",
        "ce[targets != IGNORE_INDEX]",
        "ce",
        within="unshifted_losses",
        killers=("tests/test_survey_rows.py::test_the_item_loss_is_the_one_the_models_loss_averages",),
    ),
    Mutant(
        "the Trainer steps every micro-batch (k = 1)",
        "replace",
        "K",
        "1",
        within="trainer_for",
        killers=("tests/test_survey.py::test_a_subset_rerun_matches_the_committed_survey",),
    ),
    Mutant(
        "the Trainer clips (max_grad_norm 1.0)",
        "constant",
        "0.0",
        "1.0",
        within="trainer_for",
        killers=("tests/test_survey.py::test_a_subset_rerun_matches_the_committed_survey",),
    ),
    # --- results.py: the tables and files
    Mutant(
        "the summary's error is a group's best",
        "replace",
        "max((r.max_rel_error for r in rows if r.max_rel_error is not None), default=math.nan)",
        "min",
        node="max",
        killers=("tests/test_survey_rows.py::test_the_summary_groups_classes_by_outcome_worst_first",),
    ),
    Mutant(
        "the summary lists exact classes first",
        "compare",
        "kv[0] == ()",
        "!=",
        killers=("tests/test_survey_rows.py::test_the_summary_groups_classes_by_outcome_worst_first",),
    ),
    Mutant(
        "c shown as one value when it varies by 5%",
        "constant",
        "hi - lo < 5e-05",
        "0.05",
        node="5e-05",
        killers=("tests/test_survey_rows.py::test_the_markdown_shows_every_row_in_its_table",),
    ),
    Mutant(
        "a judged class without codes shown blank, not ok",
        "replace",
        "', '.join(r.codes) if r.codes else 'ok'",
        "', '.join(r.codes)",
        killers=("tests/test_survey_rows.py::test_the_markdown_shows_every_row_in_its_table",),
    ),
    Mutant(
        "a | in a reason not escaped (splits the table cell)",
        "replace",
        "r.reason.replace('|', '/')",
        "r.reason",
        killers=("tests/test_survey_rows.py::test_the_markdown_shows_every_row_in_its_table",),
    ),
    Mutant(
        "the task lost when reading the JSON",
        "replace",
        "data.get('task', 'causal-lm')",
        "'causal-lm'",
        killers=("tests/test_survey_rows.py::test_the_json_holds_every_field_and_reads_back",),
    ),
    Mutant(
        "the file name without the task",
        "replace",
        "'' if s.task == 'causal-lm' else f'-{s.task}'",
        "''",
        killers=("tests/test_survey_rows.py::test_the_json_holds_every_field_and_reads_back",),
    ),
    Mutant(
        "every code counted as a bug, passing ones too",
        "replace",
        "[c for c in self.codes if not CODES[c].passing]",
        "list(self.codes)",
        killers=("tests/test_survey_rows.py::test_the_summary_groups_classes_by_outcome_worst_first",),
    ),
    Mutant(
        "judged classes sorted by class, not model type",
        "replace",
        "sorted(s.judged, key=lambda r: r.model_type)",
        "r.model_class",
        node="r.model_type",
        killers=("tests/test_survey.py::test_the_committed_markdown_is_the_committed_json_rendered",),
    ),
    Mutant(
        "distinct classes counted as model types",
        "replace",
        "{r.model_class for r in judged}",
        "judged",
        killers=("tests/test_survey.py::test_the_committed_markdown_is_the_committed_json_rendered",),
    ),
    Mutant(
        "per-token wording for every task",
        "replace",
        "'per-token' if s.task == 'causal-lm' else 'per-sequence'",
        "'per-token'",
        killers=("tests/test_survey_rows.py::test_the_json_holds_every_field_and_reads_back",),
    ),
    Mutant(
        "a judged row counted only when it has codes",
        "replace",
        "r.status == 'judged'",
        "r.status == 'judged' and r.codes",
        killers=("tests/test_survey_rows.py::test_the_markdown_shows_every_row_in_its_table",),
    ),
    # --- results.py: the packaged tables (lesson 9 loads them by version)
    Mutant(
        "load ignores the version asked for (any table of the task)",
        "replace",
        "_tables().get((version, task))",
        "next((f for (v, t), f in _tables().items() if t == task), None)",
        killers=(
            "tests/test_survey.py::test_load_reads_the_installed_version_and_names_the_versions_it_has",
        ),
    ),
    Mutant(
        "NoTable does not list the versions accumlib holds",
        "replace",
        "', '.join(have) or '(none)'",
        "'(none)'",
        killers=(
            "tests/test_survey.py::test_load_reads_the_installed_version_and_names_the_versions_it_has",
        ),
    ),
    Mutant(
        "a table without a task suffix read as sequence classification",
        "constant",
        "m.group(2) or 'causal-lm'",
        "'sequence-classification'",
        node="'causal-lm'",
        killers=("tests/test_survey.py::test_load_refuses_an_installed_version_without_a_table",),
    ),
]
