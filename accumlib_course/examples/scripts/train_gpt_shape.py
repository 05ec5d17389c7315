"""A GPT-style training script in nanoGPT's shape: random windows of a token stream, a model that
returns its own loss, the learning rate set by hand, clipping, 4 micro-batches per optimizer step."""
import torch
import torch.nn.functional as F

torch.manual_seed(0)
data = torch.randint(0, 64, (4096,))  # the token stream (nanoGPT: a np.memmap of train.bin)
block, batch, accum, iters = 16, 4, 4, 5


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64)

    def forward(self, idx, targets=None):
        logits = self.head(torch.tanh(self.emb(idx)))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def get_batch():
    ix = torch.randint(len(data) - block - 1, (batch,))
    x = torch.stack([data[i : i + block] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block] for i in ix])
    return x, y


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for it in range(iters):
    for group in optimizer.param_groups:
        group["lr"] = 1e-3 * min(1.0, (it + 1) / 2)  # warm-up, set by hand
    for micro_step in range(accum):
        X, Y = get_batch()
        logits, loss = model(X, Y)
        loss = loss / accum  # scale the loss for accumulation
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"iter {it}: loss {loss.item() * accum:.4f}")
