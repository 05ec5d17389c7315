"""python -m accumlib_course.survey transformers: the committed tables (surveys/) and a subset re-run in CI.

The committed JSON also ships inside the package (accumlib_course/survey/tables/), where ``survey.load`` reads
it by transformers version. The subset runs the command itself
(`python -m accumlib_course.survey transformers --models ... --out ... --json`) on four causal-LM classes, one
per outcome the full survey found (GPT-2: labels counted before the shift; Llama and Qwen2: exact; BART's
causal LM: a mean loss the Trainer never divides), and on one sequence classifier, and checks each row
against the committed JSON.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import version
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402

from accumlib.tolerances import FLOAT32_RTOL  # noqa: E402
from accumlib_course import survey  # noqa: E402
from accumlib_course.survey.__main__ import main  # noqa: E402

pytest.importorskip("transformers", reason="transformers is in the hf and test extras")

SURVEYS = Path(__file__).resolve().parent.parent / "surveys"
VERSION = version("transformers")


def path(task: str, suffix: str) -> Path:
    return path_in(SURVEYS, task, suffix)


def path_in(folder: Path, task: str, suffix: str) -> Path:
    return folder / (STEMS[task] + suffix)


STEMS = {
    "causal-lm": f"transformers-{VERSION}",
    "sequence-classification": f"transformers-{VERSION}-sequence-classification",
}
SUBSET = {"causal-lm": "gpt2,llama,qwen2,bart", "sequence-classification": "bert"}
S = [8, 8, 6]  # sequences per window: micro-batches of 2 in windows of 4, 4 and 3
# the classes the issue names: each must have been built tiny and judged
NAMED = {
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "PhiForCausalLM",
    "Phi3ForCausalLM",
    "OPTForCausalLM",
    "GPTNeoXForCausalLM",
    "FalconForCausalLM",
    "BloomForCausalLM",
    "StableLmForCausalLM",
}


def committed(task: str) -> survey.Survey:
    file = path(task, ".json")
    if not file.exists():
        pytest.skip(f"no committed survey for transformers {VERSION} ({file.name}); run `make survey`")
    return survey.Survey.from_json(file.read_text())


@pytest.mark.parametrize("task", list(STEMS))
def test_the_committed_markdown_is_the_committed_json_rendered(task):
    assert survey.to_markdown(committed(task)) == path(task, ".md").read_text()


def test_the_committed_causal_lm_survey_covers_the_issue():
    s = committed("causal-lm")
    judged = {r.model_class: r for r in s.judged}
    assert len(judged) >= 20 and NAMED <= set(judged), sorted(NAMED - set(judged))
    assert all(r.steps == 3 for r in s.judged)  # windows of 4, 4, 3: the ragged tail was stepped and judged
    # every class either ran or says why it could not be built
    assert not [r for r in s.rows if r.status == "error"]
    for r in s.judged:
        assert (r.max_rel_error <= FLOAT32_RTOL) == (not r.bugs), r  # exact exactly when no bug was named
        if "misscaled" in r.codes:
            assert r.cause.startswith("labels counted before the shift"), r


@pytest.mark.parametrize("task", list(STEMS))
def test_a_subset_rerun_matches_the_committed_survey(task, tmp_path, capsys):
    """The CI subset: the command run again gives the committed rows (codes and factors exactly,
    errors to float32 rounding), and writes the same two files it was told to."""
    was_survey = committed(task)
    old = {r.model_type: r for r in was_survey.rows}
    argv = ["transformers", "--task", task, "--models", SUBSET[task], "--out", str(tmp_path), "--json"]
    assert main(argv) == 0
    new = survey.Survey.from_json(capsys.readouterr().out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(STEMS[task] + x for x in (".json", ".md"))
    # the file is what was printed
    assert survey.Survey.from_json(path_in(tmp_path, task, ".json").read_text()) == new
    assert path_in(tmp_path, task, ".md").read_text() == survey.to_markdown(new)
    assert (new.task, new.setup) == (task, was_survey.setup)
    assert [r.model_type for r in new.rows] == SUBSET[task].split(",")
    for r in new.rows:
        was = old[r.model_type]
        assert (r.status, r.model_class, r.codes, r.item_losses, r.loss_type, r.steps, r.params, r.cause) == (
            was.status,
            was.model_class,
            was.codes,
            was.item_losses,
            was.loss_type,
            was.steps,
            was.params,
            was.cause,
        ), r
        assert r.factors == pytest.approx(was.factors, abs=1e-5)
        if r.bugs:
            assert r.max_rel_error == pytest.approx(was.max_rel_error, rel=1e-4)
        else:
            assert r.max_rel_error <= FLOAT32_RTOL


def test_gpt2s_factors_are_n_over_n_plus_s():
    """c = N/(N+S) with S the window's sequences (8, 8, 6) means N = c S / (1 - c) is a whole
    number of predicted tokens, at every step: no other factor near 0.9 passes that."""
    (gpt2,) = [r for r in committed("causal-lm").rows if r.model_type == "gpt2"]
    for c, s in zip(gpt2.factors, S, strict=True):
        n = c * s / (1 - c)
        assert abs(n - round(n)) < 1e-3 and 2 * s <= round(n) <= 19 * s, (c, s, n)


def test_sequence_classifiers_step_m_times_the_gradient():
    """The committed sequence-classification survey: every class the Trainer divides wrongly is off by
    exactly m micro-batches (4, 4, 3), as a sum of per-micro-batch means is."""
    s = committed("sequence-classification")
    for r in s.judged:
        if "unscaled-sum" in r.codes:
            assert r.factors == pytest.approx([4.0, 4.0, 3.0], abs=1e-4), r


def test_unknown_models_are_refused_by_name(capsys):
    assert main(["transformers", "--models", "gpt2,no-such-model"]) == 2
    err = capsys.readouterr().err
    assert (
        "--models must name causal-LM model types or classes" in err and "(got unknown no-such-model)" in err
    )


def test_the_json_is_plain_data():
    """Every number is in the JSON, so a README table can be computed from it."""
    committed("causal-lm")  # skips when there is none
    data = json.loads(path("causal-lm", ".json").read_text())
    assert (
        set(data) == {"versions", "setup", "rows", "seconds", "task"}
        and data["versions"]["transformers"] == VERSION
    )


@pytest.mark.parametrize(
    "task, named, expected",
    [
        ("causal-lm", ["GPT2LMHeadModel", "LlamaForCausalLM"], ["gpt2", "llama"]),
        ("causal-lm", ["gpt-sw3", "internlm3"], ["gpt-sw3", "internlm3"]),  # a model type still means itself
        (
            "sequence-classification",
            ["GPT2ForSequenceClassification", "LlamaForSequenceClassification"],
            ["gpt2", "llama"],
        ),
    ],
)
def test_a_class_name_resolves_to_its_own_model_type(task, named, expected):
    """Several model types share a class: GPT2LMHeadModel served gpt-sw3 and LlamaForCausalLM internlm3
    (the first type listed for the class), so `--models GPT2LMHeadModel` surveyed another model's config."""
    assert survey.resolve(named, task) == expected


# --- the survey tables ship in the package ----------------------------------------------------------


def test_the_packaged_tables_are_the_committed_ones():
    packaged = Path(survey.__file__).parent / "tables"
    committed = {p.name: p.read_bytes() for p in SURVEYS.glob("transformers-*.json")}
    shipped = {p.name: p.read_bytes() for p in packaged.glob("transformers-*.json")}
    assert shipped == committed, (
        "copy surveys/transformers-*.json to accumlib_course/survey/tables/ after `make survey`"
    )
    for task in survey.TASKS:
        for v in survey.versions(task):
            assert survey.load(task, version=v).task == task


def test_load_reads_the_installed_version_and_names_the_versions_it_has():
    if VERSION in survey.versions():
        assert survey.load().versions["transformers"] == VERSION
    with pytest.raises(
        survey.NoTable,
        match=r"no sequence-classification survey ships for transformers 4\.0\.0; "
        r"accumlib holds one for transformers 5\.23\.0",
    ):
        survey.load("sequence-classification", version="4.0.0")
    with pytest.raises(
        ValueError, match=r"task must be one of 'causal-lm', 'sequence-classification' \(got 'vision'\)"
    ):
        survey.load("vision")
    with pytest.raises(ValueError, match=r"version must be a transformers version string .* \(got 5\.23\)"):
        survey.load(version=5.23)


def test_load_refuses_an_installed_version_without_a_table(monkeypatch):
    import importlib

    monkeypatch.setattr(
        importlib.import_module("accumlib_course.survey.run"), "installed_version", lambda dist: "9.9.9"
    )
    with pytest.raises(
        survey.NoTable, match=r"transformers 9\.9\.9.*accumlib holds one for transformers 5\.23\.0"
    ):
        survey.load()
