"""Mutants of accumlib/survey/: which classes it surveys, how each is built and judged, how rows render.

accumlib/survey/__init__.py only re-exports names (a missing one fails at import); no mutant there.
"""

from mutate import Mutant

# the one- and two-class tests first (seconds each): with -x a killed mutant stops there; then the
# committed tables and the CI subset re-run (a minute)
TESTS = ["tests/test_survey_rows.py", "tests/test_survey.py"]

R, M, S = "accumlib/survey/run.py", "accumlib/survey/models.py", "accumlib/survey/results.py"
MUTANTS = [
    # --- run.py: names, the task, each class's row
    Mutant(
        "a class name means the first model type listed for it (GPT2LMHeadModel -> gpt-sw3): the fix reverted",
        R,
        "if cls.lower() not in by_class or t == _own_type(cls):",
        "if cls.lower() not in by_class:",
    ),
    Mutant(
        "an unknown name dropped silently, not refused",
        R,
        "    if unknown:\n        raise",
        "    if False:\n        raise",
    ),
    Mutant("class names matched case-sensitively", R, "by_class.get(key.lower())", "by_class.get(key)"),
    Mutant("names not trimmed ('gpt2, llama')", R, "key = m.strip()", "key = m"),
    Mutant("a class named twice surveyed twice", R, "return list(dict.fromkeys(out))", "return out"),
    Mutant(
        "no names means no classes, not all",
        R,
        "    if not models:\n        return list(names)",
        "    if not models:\n        return []",
    ),
    Mutant(
        "the task not forwarded when resolving names",
        R,
        "types = resolve(models, task)",
        "types = resolve(models)",
    ),
    Mutant(
        "the task not forwarded to each class",
        R,
        "rows.append(survey_one(t, task))",
        "rows.append(survey_one(t))",
    ),
    Mutant(
        "the setup never mentions the sequence labels",
        R,
        'labels=", one of 3 labels each" if task == "sequence-classification" else ""',
        'labels=""',
    ),
    Mutant(
        "c kept for misscaled steps only, not for an unscaled sum",
        R,
        'if report.codes & {"misscaled", "unscaled-sum"}:',
        'if "misscaled" in report.codes:',
    ),
    Mutant("c rounded to 2 places", R, "round(s.factor, 6)", "round(s.factor, 2)"),
    Mutant(
        "the cause of a misscale dropped",
        R,
        'row.cause = "labels counted before the shift (c = N/(N+S))" if "shift" in message else ""',
        'row.cause = ""',
    ),
    Mutant(
        "a row's error is its best step's",
        R,
        "row.max_rel_error = max(errors)",
        "row.max_rel_error = min(errors)",
    ),
    Mutant("a Trainer failure reported as skipped", R, '            row.status = "error"\n', ""),
    Mutant(
        "a class that is not tiny loses the 'not tiny' reason",
        R,
        '            except NotTiny as err:\n                row.reason = f"not tiny: {err}"\n                return row\n',
        "",
    ),
    Mutant(
        "a multi-line error kept multi-line in its row",
        R,
        'text = " ".join(str(err).split())',
        "text = str(err)",
    ),
    Mutant("the time limit never armed", R, "    signal.alarm(seconds)\n", "    signal.alarm(0)\n"),
    # --- models.py: the tiny build, the item loss, the Trainer
    Mutant("layers shrunk to 2, not 1", M, "return min(value, 1)", "return min(value, 2)"),
    Mutant(
        "dropout fields left as they are",
        M,
        "if isinstance(value, float) and any(w in name for w in RANDOM):\n        return 0.0",
        "if isinstance(value, float) and any(w in name for w in RANDOM):\n        return value",
    ),
    Mutant(
        "the per-class size fixes not applied",
        M,
        "changes | TINY_FOR.get(model_type, {}) | TASKS[task].config",
        "changes | TASKS[task].config",
    ),
    Mutant(
        "the task's config (num_labels) not applied",
        M,
        "changes | TINY_FOR.get(model_type, {}) | TASKS[task].config",
        "changes | TINY_FOR.get(model_type, {})",
    ),
    Mutant(
        "the tiny model not seeded",
        M,
        "    torch.manual_seed(seed)\n    return cls(config)",
        "    return cls(config)",
    ),
    Mutant(
        "the item loss found in eval mode (dropout cannot show)",
        M,
        "    model.train()\n    try:",
        "    model.eval()\n    try:",
    ),
    Mutant("the caller's train/eval mode not restored", M, "        model.train(was)\n", "        pass\n"),
    Mutant("a random training-mode loss not refused", M, "if own[0] != own[1]:", "if False:"),
    Mutant(
        "the loss match tolerance loosened 10x",
        M,
        "<= LOSS_RTOL * abs(own[0]):",
        "<= 10 * LOSS_RTOL * abs(own[0]):",
    ),
    Mutant(
        "an unknown task not refused by name (a KeyError)",
        M,
        'return TASKS[check_choice("task", task, tuple(TASKS))]',
        "return TASKS[task]",
    ),
    Mutant(
        "the unshifted loss counts padding positions as items (zero losses)",
        M,
        "return ce[targets != IGNORE_INDEX]",
        "return ce",
    ),
    Mutant(
        "the Trainer steps every micro-batch (k = 1)",
        M,
        "gradient_accumulation_steps=K,",
        "gradient_accumulation_steps=1,",
    ),
    Mutant("the Trainer clips (max_grad_norm 1.0)", M, "max_grad_norm=0.0,", "max_grad_norm=1.0,"),
    # --- results.py: the tables and files
    Mutant(
        "the summary's error is a group's best",
        S,
        "worst = max((r.max_rel_error",
        "worst = min((r.max_rel_error",
    ),
    Mutant(
        "the summary lists exact classes first",
        S,
        "key=lambda kv: (kv[0] == (), -len(kv[1]))",
        "key=lambda kv: (kv[0] != (), -len(kv[1]))",
    ),
    Mutant("c shown as one value when it varies by 5%", S, "if hi - lo < 5e-5", "if hi - lo < 5e-2"),
    Mutant(
        "a judged class without codes shown blank, not ok",
        S,
        'return ", ".join(r.codes) if r.codes else "ok"',
        'return ", ".join(r.codes)',
    ),
    Mutant(
        "a | in a reason not escaped (splits the table cell)", S, "{r.reason.replace('|', '/')}", "{r.reason}"
    ),
    Mutant("the task lost when reading the JSON", S, 'data.get("task", "causal-lm"),', '"causal-lm",'),
    Mutant(
        "the file name without the task",
        S,
        'suffix = "" if s.task == "causal-lm" else f"-{s.task}"',
        'suffix = ""',
    ),
    Mutant(
        "every code counted as a bug, passing ones too",
        S,
        "return [c for c in self.codes if CODES[c].kind not in PASSING]",
        "return list(self.codes)",
    ),
    Mutant(
        "judged classes sorted by class, not model type",
        S,
        "for r in sorted(s.judged, key=lambda r: r.model_type):",
        "for r in sorted(s.judged, key=lambda r: r.model_class):",
    ),
    Mutant(
        "distinct classes counted as model types",
        S,
        "classes = len({r.model_class for r in judged})",
        "classes = len(judged)",
    ),
    Mutant(
        "per-token wording for every task",
        S,
        'what = "per-token" if s.task == "causal-lm" else "per-sequence"',
        'what = "per-token"',
    ),
    Mutant(
        "a judged row counted only when it has codes",
        S,
        'return [r for r in self.rows if r.status == "judged"]',
        'return [r for r in self.rows if r.status == "judged" and r.codes]',
    ),
    # --- results.py: the packaged tables (lesson 9 loads them by version)
    Mutant(
        "load ignores the version asked for (any table of the task)",
        S,
        "table = _tables().get((version, task))",
        "table = next((f for (v, t), f in _tables().items() if t == task), None)",
    ),
    Mutant(
        "NoTable does not list the versions accumlib holds", S, "{', '.join(have) or '(none)'} ", "(none) "
    ),
    Mutant(
        "a table without a task suffix read as sequence classification",
        S,
        'found[(m.group(1), m.group(2) or "causal-lm")] = f',
        'found[(m.group(1), m.group(2) or "sequence-classification")] = f',
    ),
]
