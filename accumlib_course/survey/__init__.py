"""``python -m accumlib_course.survey transformers``: which causal-LM classes (or, with ``--task
sequence-classification``, which sequence classifiers) of the installed transformers accumulate
gradients exactly under its own ``Trainer``.

Every class of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` that can be built tiny from its config
(offline, nothing downloaded) gets one Trainer epoch under ``accumlib.hf.verify_trainer``:
22 sequences of 3 to 20 tokens (``accumlib_course.examples.data``), micro-batches of 2,
``gradient_accumulation_steps=4`` (windows of 4, 4 and 3 micro-batches: a ragged last window),
dropout 0, ``max_grad_norm=0`` (no clipping), the Trainer's own AdamW, sampler and seed. Each row
says how far the worst step was from the true gradient of the mean token loss, verify's codes,
and the fitted factor c where every step is scaled by one.

The item loss is the model's own: before the run, the model's loss on one micro-batch is
matched against the mean of ``causal_lm_losses`` (labels shifted) and of the unshifted
cross-entropy; a class whose loss is neither, or differs between two identical forwards, is
listed as not surveyed, with the reason. Sequence classifiers (``MODEL_FOR_SEQUENCE_CLASSIFICATION_
MAPPING_NAMES``) get the same sequences with one of 3 labels each, and one loss per sequence.

    >>> from accumlib_course import survey                                   # doctest: +SKIP
    >>> result = survey.run(["gpt2", "llama"])                        # doctest: +SKIP
    >>> [(r.model_class, sorted(r.codes)) for r in result.rows]       # doctest: +SKIP
    [('GPT2LMHeadModel', ['dropout', 'misscaled']), ('LlamaForCausalLM', [])]

The committed tables ship inside the package (``accumlib_course/survey/tables/``): ``load(task=...)`` reads
the one of the installed transformers, and names the versions that have one when it has none.

    >>> survey.load("sequence-classification", version="5.23.0").task   # doctest: +SKIP
    'sequence-classification'
"""

from .models import TASKS, Task, own_item_losses, tiny_config, tiny_model, trainer_for
from .results import NoTable, Row, Survey, load, summary, to_markdown, versions, write
from .run import resolve, run, survey_one

__all__ = [
    "TASKS",
    "NoTable",
    "Row",
    "Survey",
    "Task",
    "load",
    "own_item_losses",
    "resolve",
    "run",
    "summary",
    "survey_one",
    "tiny_config",
    "tiny_model",
    "to_markdown",
    "trainer_for",
    "versions",
    "write",
]
