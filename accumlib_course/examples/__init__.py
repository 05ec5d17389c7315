"""Real frameworks' own training loops, small enough to run in a test, each verified there.

- ``data``: variable-length token sequences and their padding collate (labels -100 on padding),
  the data every example below and ``accumlib_course.survey`` train on;
- ``accelerate_digits``: Accelerate's documented ``accumulate`` loop on the digits MLP;
- ``accelerate_clm``: the loop of transformers' ``run_clm_no_trainer.py`` (Accelerate's
  ``accumulate``) on a tiny Llama, and the same loop counting its tokens per window;
- ``lightning_digits``: a LightningModule over the digits MLP, for ``accumlib.lightning.verify_fit``.
- ``trl_peft``: TRL's SFTTrainer on GPT-2, PEFT prompt tuning under the Trainer and TRL's DPOTrainer,
  each with its accumulation factor and cause (``BUGS``), for lesson 9.
- ``plain``: four complete loops in plain PyTorch (fixed-size items, tokens, AMP, DDP) that import
  torch alone, to copy into a project: the README and lesson 10 show them, ``tests/test_plain_loops.py``
  grades each.
"""
