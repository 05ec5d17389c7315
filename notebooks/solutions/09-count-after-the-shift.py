"""Solution of lesson 9's exercise: sum the token losses over num_items_in_batch, counted after the shift.

With compute_loss_func set, the Trainer leaves the division to it: the window's summed token losses
over num_items_in_batch, the window's token count. The Trainer counts labels after the shift only for
a model whose loss_type it knows shifts; GPT-2's is None, so it is set before the Trainer is built.
"""

import torch.nn.functional as F
import transformers


def token_loss(outputs, labels, num_items_in_batch=None):
    """Cross-entropy of every predicted token: position t predicts token t + 1."""
    logits = outputs.logits[:, :-1].float()
    targets = labels[:, 1:]
    summed = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100, reduction="sum"
    )
    return summed / num_items_in_batch


def train_fn(model, train_dataset, data_collator, output_dir):
    """Build (not train) the Trainer: the grader runs its loop under verify_trainer."""
    model.loss_type = "ForCausalLM"
    args = transformers.TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        num_train_epochs=1,
        max_grad_norm=0.0,
        seed=0,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    return transformers.Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        data_collator=data_collator,
        compute_loss_func=token_loss,
    )
