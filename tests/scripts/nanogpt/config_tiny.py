# A nanoGPT config file for accumlib's tests (accumlib's own file, not upstream's): nanoGPT's
# configurator.py exec()s it inside train.py, after train.py's defaults and before any --key=value.
# A tiny GPT on the CPU in float32, no compile, no wandb, on data/tiny/ in the current directory
# (tests/_nanogpt.py make_workdir writes it: uint16 token ids and meta.pkl with vocab_size 65).
#
# How the run goes with these values (train.py's loop, unmodified):
# - iterations 0, 1, ..., max_iters run (the loop breaks once iter_num > max_iters): 7 optimizer steps,
#   each of gradient_accumulation_steps micro-batches of batch_size sequences of block_size tokens
#   (under torchrun with 2 ranks: 4 // 2 = 2 micro-batches per rank, the same 256 tokens per step);
# - the loss is estimated only at iteration 0 (eval_interval > max_iters), where no checkpoint is
#   written (train.py saves only when iter_num > 0), so the run writes no ckpt.pt, only makes out_dir;
# - "iter N: loss L, ..." is printed for every iteration (log_interval = 1).

out_dir = 'out-tiny'
eval_interval = 1000
eval_iters = 2
eval_only = False
log_interval = 1
always_save_checkpoint = False
init_from = 'scratch'
wandb_log = False

dataset = 'tiny'
gradient_accumulation_steps = 4
batch_size = 4
block_size = 16

n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.0

max_iters = 6
lr_decay_iters = 6
warmup_iters = 2

device = 'cpu'
dtype = 'float32'
compile = False
