"""The survey's own logic on one or two tiny classes (about a second each): which names it takes,
which task's classes it builds, how a class's item loss is found, how a class that cannot be
surveyed becomes a row, and how rows are rendered (markdown, JSON, the files written).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402

pytest.importorskip("transformers", reason="transformers is in the hf and test extras")

import torch  # noqa: E402
from transformers.modeling_outputs import CausalLMOutput  # noqa: E402
from transformers.models.auto import modeling_auto  # noqa: E402

from accumlib_course import survey  # noqa: E402
from accumlib_course.survey.models import LOSS_RTOL  # noqa: E402

run_module = importlib.import_module("accumlib_course.survey.run")  # survey.run is the function of that name


# --- names ----------------------------------------------------------------------------------------


def test_no_names_mean_every_class_of_the_task():
    for task, mapping in (
        ("causal-lm", modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
        ("sequence-classification", modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES),
    ):
        assert survey.resolve(None, task) == survey.resolve([], task) == list(mapping)
    # a task's own classes only
    assert "bart" in survey.resolve(None) and "distilbert" not in survey.resolve(None)
    assert "distilbert" in survey.resolve(None, "sequence-classification")


def test_names_are_trimmed_and_each_class_surveyed_once():
    # "--models gpt2, llama" splits into " llama"; a type and its class name are one class
    assert survey.resolve([" gpt2", "llama ", "GPT2LMHeadModel", "gpt2", "llamaforcausallm"]) == [
        "gpt2",
        "llama",
    ]


def test_unknown_names_are_refused_each_by_name():
    with pytest.raises(
        ValueError,
        match=r"models must name causal-LM model types or classes .*\(got unknown nope, BertForNothing\)",
    ):
        survey.resolve(["gpt2", "nope", "BertForNothing"])
    # a sequence classifier's class is not a causal LM, and the reverse
    with pytest.raises(ValueError, match=r"\(got unknown BertForSequenceClassification\)"):
        survey.resolve(["BertForSequenceClassification"])
    with pytest.raises(
        ValueError,
        match=r"models must name sequence-classification model types .*\(got unknown GPT2LMHeadModel\)",
    ):
        survey.resolve(["GPT2LMHeadModel"], "sequence-classification")


def test_an_unknown_task_is_refused_by_name():
    with pytest.raises(
        ValueError, match=r"task must be one of 'causal-lm', 'sequence-classification' \(got 'masked-lm'\)"
    ):
        survey.resolve(None, "masked-lm")
    with pytest.raises(
        ValueError, match=r"task must be one of 'causal-lm', 'sequence-classification' \(got 'masked-lm'\)"
    ):
        survey.tiny_model("gpt2", "masked-lm")


# --- one class: its item loss, and the rows of classes that cannot be surveyed ----------------------


def test_a_tiny_model_is_built_from_its_seed():
    a, b, c = survey.tiny_model("llama"), survey.tiny_model("llama"), survey.tiny_model("llama", seed=1)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert not all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values(), strict=True)
    )
    assert sum(p.numel() for p in a.parameters()) <= survey.models.MAX_PARAMS


@pytest.mark.parametrize(
    "model_type, task",
    [("rwkv", "causal-lm"), ("gpt_neo", "causal-lm"), ("distilbert", "sequence-classification")],
)
def test_classes_whose_configs_tie_sizes_together_are_built_tiny(model_type, task):
    """rwkv divides by num_hidden_layers - 1, gpt_neo lists one attention type per layer, distilbert
    names its sizes dim and hidden_dim: the generic shrink alone fails on each, or leaves it large."""
    model = survey.tiny_model(model_type, task)
    assert sum(p.numel() for p in model.parameters()) <= survey.models.MAX_PARAMS


class ScaledLoss(torch.nn.Module):
    """A causal LM whose own loss is ``factor`` times the model's (its logits unchanged)."""

    def __init__(self, model: torch.nn.Module, factor: float):
        super().__init__()
        self.model, self.factor = model, factor

    def forward(self, **batch):
        out = self.model(**batch)
        return CausalLMOutput(loss=None if out.loss is None else out.loss * self.factor, logits=out.logits)


def test_the_item_loss_is_the_one_the_models_loss_averages():
    gpt2, bart = survey.tiny_model("gpt2"), survey.tiny_model("bart")
    assert survey.own_item_losses(gpt2) == "shifted"
    assert survey.own_item_losses(bart) == "unshifted"  # BartForCausalLM does not shift its labels
    # float32 rounding: still the mean
    assert survey.own_item_losses(ScaledLoss(gpt2, 1 + LOSS_RTOL / 10)) == "shifted"
    # a loss 3x the tolerance off is neither mean: refused with both means named
    with pytest.raises(
        ValueError, match=r"is the mean of neither the shifted \(.*\) nor the unshifted \(.*\) cross-entropy"
    ):
        survey.own_item_losses(ScaledLoss(gpt2, 1 + 3 * LOSS_RTOL))


def test_a_random_training_forward_is_refused_and_the_mode_restored():
    model = survey.tiny_model("gpt2")
    model.eval()
    assert survey.own_item_losses(model) == "shifted" and not model.training  # eval mode kept
    model.train()
    assert survey.own_item_losses(model) == "shifted" and model.training
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.5
    # the loss is judged in training mode, where dropout draws: an eval-mode caller must not hide it
    model.eval()
    with pytest.raises(ValueError, match="its training-mode loss is random"):
        survey.own_item_losses(model)
    assert not model.training


def test_a_class_the_trainer_cannot_train_is_an_error_row(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("the Trainer failed\nat step 1")

    monkeypatch.setattr(run_module, "trainer_for", failing)
    row = survey.survey_one("llama")
    assert (row.status, row.reason, row.model_class, row.item_losses) == (
        "error",
        "RuntimeError: the Trainer failed at step 1",
        "LlamaForCausalLM",
        "shifted",
    )
    assert row.params > 0 and row.steps == 0 and row.codes == []


@pytest.mark.skipif(
    not hasattr(signal, "SIGALRM"), reason="the survey's time limit is a SIGALRM (none on Windows)"
)
def test_a_class_over_its_time_limit_is_a_row_with_the_reason(monkeypatch):
    def hangs(*args, **kwargs):
        time.sleep(30)  # interrupted by the 1 s limit; without one the row would wait 30 s and fail otherwise

    monkeypatch.setattr(run_module, "SECONDS_PER_MODEL", 1)
    monkeypatch.setattr(run_module, "tiny_model", hangs)
    before = signal.getsignal(signal.SIGALRM)
    row = survey.survey_one("llama")
    assert (row.status, row.reason) == ("skipped", "TimeoutError: ran for more than 1 s")
    assert signal.getsignal(signal.SIGALRM) is before  # the caller's handler is back
    assert signal.alarm(0) == 0  # and no alarm is left pending for whatever runs next


def test_the_task_picks_the_classes_built_and_the_setup_stated(monkeypatch):
    """Every class refused as not tiny (a limit of 1,000 parameters): the rows are still the task's own
    classes."""
    monkeypatch.setattr(survey.models, "MAX_PARAMS", 1000)
    s = survey.run(["bert", "GPT2ForSequenceClassification"], "sequence-classification")
    assert s.task == "sequence-classification" and "one of 3 labels each" in s.setup
    assert [(r.model_type, r.model_class, r.status) for r in s.rows] == [
        ("bert", "BertForSequenceClassification", "skipped"),
        ("gpt2", "GPT2ForSequenceClassification", "skipped"),
    ]
    for r in s.rows:
        assert (
            r.reason.startswith("not tiny: ")
            and "parameters from its config shrunk (more than 1,000)" in r.reason
        )
    lm = survey.run(["bert"])
    assert lm.task == "causal-lm" and "labels" not in lm.setup and lm.rows[0].model_class == "BertLMHeadModel"


# --- rendering ----------------------------------------------------------------------------------------


def _survey(task: str = "causal-lm") -> survey.Survey:
    rows = [
        survey.Row(
            "llama",
            "LlamaForCausalLM",
            "judged",
            params=14432,
            loss_type="ForCausalLM",
            item_losses="shifted",
            steps=3,
            max_rel_error=2e-7,
        ),
        survey.Row(
            "gpt2",
            "GPT2LMHeadModel",
            "judged",
            params=12704,
            item_losses="shifted",
            steps=3,
            max_rel_error=0.123,
            codes=["misscaled"],
            factors=[0.911111, 0.876923, 0.901639],
            cause="labels counted before the shift (c = N/(N+S))",
        ),
        survey.Row(
            "opt",
            "OPTForCausalLM",
            "judged",
            params=13000,
            item_losses="shifted",
            steps=3,
            max_rel_error=0.25,
            codes=["unscaled-sum"],
            factors=[4.0, 4.0, 4.0],
        ),
        survey.Row(
            "phi",
            "PhiForCausalLM",
            "judged",
            params=13500,
            item_losses="shifted",
            steps=3,
            max_rel_error=3e-7,
            codes=["dropout"],
        ),  # a note, not a bug: phi is exact
        survey.Row("xlnet", "XLNetLMHeadModel", "skipped", reason="ValueError: a | b"),
        survey.Row("ctrl", "CTRLLMHeadModel", "error", reason="RuntimeError: boom"),
    ]
    versions = {"transformers": "9.9.9", "torch": "2.0", "accelerate": "1.0", "python": "3.11"}
    return survey.Survey(versions, "a setup", rows, 12.0, task)


def _table(md: str, header: str) -> list[list[str]]:
    lines = md.split(header, 1)[1].strip().splitlines()[1:]  # below the |---| line
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def test_the_markdown_shows_every_row_in_its_table():
    md = survey.to_markdown(_survey())
    judged = _table(
        md, "| model type | class | parameters | loss_type | item loss | steps | max rel. error | codes | c |"
    )
    assert judged == [
        [
            "gpt2",
            "GPT2LMHeadModel",
            "12,704",
            "None",
            "shifted",
            "3",
            "1.2e-01",
            "misscaled",
            "0.8769 to 0.9111",
        ],
        ["llama", "LlamaForCausalLM", "14,432", "ForCausalLM", "shifted", "3", "2.0e-07", "ok", ""],
        ["opt", "OPTForCausalLM", "13,000", "None", "shifted", "3", "2.5e-01", "unscaled-sum", "4.0000"],
        ["phi", "PhiForCausalLM", "13,500", "None", "shifted", "3", "3.0e-07", "dropout", ""],
    ]
    others = _table(md, "| model type | class | status | reason |")
    assert others == [
        ["ctrl", "CTRLLMHeadModel", "error", "RuntimeError: boom"],
        # a | in a reason would split the cell
        ["xlnet", "XLNetLMHeadModel", "skipped", "ValueError: a / b"],
    ]
    assert "2 model types could not be built tiny" in md and "per-token loss" in md and "--task" not in md


def test_the_summary_groups_classes_by_outcome_worst_first():
    text = survey.summary(_survey())
    assert text.startswith(
        "transformers 9.9.9: 4 of 6 causal-LM model types (4 distinct classes) built tiny and judged"
    )
    assert text.splitlines()[4:] == [
        "| misscaled | 1: GPT2LMHeadModel | 0.8769 to 0.9111 | 1.2e-01 |",
        "| unscaled-sum | 1: OPTForCausalLM | 4.0000 to 4.0000 | 2.5e-01 |",
        "| exact | 2: LlamaForCausalLM, PhiForCausalLM |  | 3.0e-07 |",  # a note (dropout) is no bug
    ]


def test_the_json_holds_every_field_and_reads_back(tmp_path):
    s = _survey("sequence-classification")
    back = survey.Survey.from_json(s.to_json())
    assert back == s and back.task == "sequence-classification"
    md, js = survey.write(s, str(tmp_path / "out"))
    assert (os.path.basename(md), os.path.basename(js)) == (
        "transformers-9.9.9-sequence-classification.md",
        "transformers-9.9.9-sequence-classification.json",
    )
    assert open(md).read() == survey.to_markdown(s) and json.loads(open(js).read()) == json.loads(s.to_json())
    assert "--task sequence-classification" in open(md).read() and "per-sequence loss" in open(md).read()
    assert [os.path.basename(p) for p in survey.write(_survey(), str(tmp_path / "out"))] == [
        "transformers-9.9.9.md",
        "transformers-9.9.9.json",
    ]
