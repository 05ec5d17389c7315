"""Mutants of accumlib/lightning.py: verify_fit, accumlib.verify on a real Lightning Trainer.fit."""

from mutate import Mutant

TESTS = ["tests/test_lightning_fit.py", "tests/test_lightning_trainer_settings.py"]

L = "accumlib/lightning.py"
VERIFY_RECHECKS = (
    "verify() refuses the same max_steps with the same message before anything runs "
    "(accumlib/_verify/api.py check_args), so verify_fit refuses 0 and True either way"
)
MUTANTS = [
    # what the user's Trainer and loader say
    Mutant(
        "the default accumulate_grad_batches taken as 2, not Lightning's 1",
        L,
        'trainer_kwargs.get("accumulate_grad_batches", 1)',
        'trainer_kwargs.get("accumulate_grad_batches", 2)',
    ),
    Mutant(
        "verify judges windows of one whatever accumulate_grad_batches says",
        L,
        "accum_steps=k,",
        "accum_steps=1,",
    ),
    Mutant("a loader's drop_last=True not followed", L, "drop_last=user.drop_last", "drop_last=False"),
    Mutant(
        "the user's sampler not followed (a shuffled loader trained in dataset order)",
        L,
        "batch_size=user.batch_size, sampler=sampler,",
        "batch_size=user.batch_size, sampler=None,",
    ),
    Mutant(
        "the loader's own generator not passed (its seed draw skipped: another shuffle)",
        L,
        "generator=generator, ",
        "",
    ),
    Mutant(
        "the user's sampler used, not a copy (drawing moves the user's generator)",
        L,
        "return copy.deepcopy((loader.sampler, loader.generator), memo={id(loader.dataset): loader.dataset})",
        "return loader.sampler, loader.generator",
    ),
    Mutant(
        "the user's workers kept (batches drawn where verify cannot record them)",
        L,
        "num_workers=0,",
        "num_workers=user.num_workers,",
    ),
    Mutant(
        "max_steps not forwarded to the Trainer",
        L,
        'kwargs |= {"max_steps": max_steps} if max_steps else {"max_epochs": 1}',
        'kwargs |= {"max_epochs": 1}',
    ),
    Mutant(
        "max_steps not forwarded to verify",
        L,
        "collate_fn=user.collate_fn, max_steps=max_steps)",
        "collate_fn=user.collate_fn)",
    ),
    # the user's callbacks
    Mutant(
        "the user's callbacks dropped",
        L,
        "callbacks=own, default_root_dir=root",
        "callbacks=[], default_root_dir=root",
    ),
    Mutant(
        "the user's callbacks run as they are, not copies",
        L,
        "own = [copy.deepcopy(cb) for cb in callbacks",
        "own = [cb for cb in callbacks",
    ),
    Mutant(
        "a checkpointing callback kept (writes files)",
        L,
        " if not isinstance(cb, pl.callbacks.Checkpoint)]",
        "]",
    ),
    Mutant(
        "one callback not in a list is not wrapped",
        L,
        "callbacks = [callbacks] if not isinstance(callbacks, (list, tuple)) else callbacks\n",
        "",
    ),
    # the user's state
    Mutant("the global random generators not put back", L, "        torch.set_rng_state(state[0])\n", ""),
    Mutant(
        "Lightning's logger level not put back", L, "            log.setLevel(level)\n", "            pass\n"
    ),
    Mutant(
        "training_step not routed through the module's __call__ (verify's hook never sees a micro-batch)",
        L,
        "        lm.training_step = lambda *a, **kw: steps(*a, **kw)",
        "        pass",
    ),
    # refusals
    Mutant(
        "devices=[0, 1] accepted (any list of devices)",
        L,
        "(isinstance(devices, (list, tuple)) and len(devices) == 1)",
        "isinstance(devices, (list, tuple))",
    ),
    # killed by timeout: Lightning then waits for a second node's rendezvous (a real hang, not load)
    Mutant("num_nodes not checked", L, """ or trainer_kwargs.get("num_nodes", 1) != 1:""", ":"),
    Mutant("devices='1' refused (only the integer 1 accepted)", L, 'devices in (1, "1")', "devices == 1"),
    Mutant("max_steps=0 accepted", L, "max_steps < 1)", "max_steps < 0)", equivalent=VERIFY_RECHECKS),
    Mutant(
        "max_steps=True accepted as 1",
        L,
        "max_steps is not None and (isinstance(max_steps, bool) or ",
        "max_steps is not None and (",
        equivalent=VERIFY_RECHECKS,
    ),
    Mutant(
        "a module that is not a LightningModule accepted",
        L,
        "        if isinstance(module, pl.LightningModule):\n            return pl",
        "        return pl",
    ),
    Mutant(
        "a loader with its own batch_sampler accepted",
        L,
        "    if train_dataloaders.batch_size is None:\n        raise",
        "    if False:\n        raise",
    ),
    Mutant(
        "item_losses not checked callable",
        L,
        "    if not callable(item_losses):\n        raise",
        "    if False:\n        raise",
    ),
]
