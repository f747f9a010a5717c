"""GPT-2 training steps in PyTorch on one GPU: the peer for dsworker's CUDA
engine (bench/torch_gpt2.py is the CPU peer; this follows it).

The same model as worker/model.h (llm.c's GPT-2): token + position
embedding, pre-LayerNorm blocks with a fused qkv projection, causal
self-attention, tanh GELU MLP, final LayerNorm and a head tied to the token
embedding. As in llm.c the token embedding has Vp rows (the vocabulary
rounded up to a multiple of 64: 50257 -> 50304); the head computes logits
over all Vp rows and the mean cross-entropy takes the first V columns only.
GPT-2 init (normal, std 0.02; attproj and fcproj weights std 0.02/sqrt(2L)),
AdamW with weight decay on the 2-D weights only (fused on CUDA where torch
has it) and gradient clipping to 1.0 by global norm every step.
Attention is F.scaled_dot_product_attention(is_causal=True) where torch has
it (flash on CUDA with bf16), else the explicit masked softmax.

--dtype bf16: torch.autocast(bfloat16) around forward and loss, fp32 master
weights and optimizer; tf32: fp32 with TF32 matmuls; fp32: TF32 off.
(The TF32 switches are the legacy allow_tf32 flags only: torch 2.9+ warns
about them, but mixing them with the new fp32_precision API breaks
torch.compile.)

Batches come in order from an llm.c token shard (--data), as dsworker reads
them with data.shuffle false, or else are random tokens from torch.randint
with a fixed seed, made on the device. Each batch is on the device before
its step's clock starts; a step is zero_grad, forward, backward, clip and
optimizer.step, timed with torch.cuda.synchronize() on both ends.

Prints a header line, one line per step ("step N ms X tok/s Y loss Z", with
" warmup" appended to the first --warmup steps: with --compile 1 they
include the compilation), then "median_tok_s X" over the steps after
--warmup, "mfu X" (a fraction of --peak_tflops; llm.c's flops per token,
6*N + 6*L*C*T, printed as "flops_per_token X"), "peak_mem_bytes X"
(torch.cuda.max_memory_allocated(); 0 on the CPU) and "params X" (N: every
parameter once, the tied token embedding with its Vp rows included).

Written for PyTorch 2.x with CUDA on an H100/H200; runs on the CPU with
Debian's PyTorch 1.13 too (--device cpu --compile 0) as a smoke test.
"""
import argparse
import contextlib
import inspect
import math
import platform
import statistics
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHARD_MAGIC = 20240520
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")
# H100 SXM dense peaks (TFLOP/s), as llm.c's get_flops_promised.
PEAK_TFLOPS = {"bf16": 989.5, "tf32": 494.7, "fp32": 66.9}


class Block(nn.Module):
    def __init__(self, channels, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(channels)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.attproj = nn.Linear(channels, channels)
        self.ln2 = nn.LayerNorm(channels)
        self.fc = nn.Linear(channels, 4 * channels)
        self.fcproj = nn.Linear(4 * channels, channels)

    def attention(self, x, mask):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, NH, T, hs)
        q, k, v = (y.view(B, T, self.heads, hs).transpose(1, 2)
                   for y in (q, k, v))
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.attproj(y)

    def forward(self, x, mask):
        x = x + self.attention(self.ln1(x), mask)
        h = F.gelu(self.fc(self.ln2(x)), approximate="tanh")
        return x + self.fcproj(h)


class Gpt2(nn.Module):
    def __init__(self, layers, heads, channels, vocab, seq_len):
        super().__init__()
        self.vocab = vocab
        padded_vocab = (vocab + 63) // 64 * 64  # as worker/param_layout.cc
        self.wte = nn.Embedding(padded_vocab, channels)
        self.wpe = nn.Embedding(seq_len, channels)
        self.blocks = nn.ModuleList(Block(channels, heads)
                                    for _ in range(layers))
        self.lnf = nn.LayerNorm(channels)
        # True above the diagonal: the future a query may not see. Only the
        # explicit attention (torch without SDPA) uses it.
        self.register_buffer("mask", None if HAVE_SDPA else torch.triu(
            torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1))
        self.init_weights(layers)

    def init_weights(self, layers):  # GPT-2's, as dsworker's InitParams
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("attproj.weight") or \
                        name.endswith("fcproj.weight"):
                    std /= math.sqrt(2 * layers)
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied head, Vp columns
        logits = logits[:, :, :self.vocab].float()
        return F.cross_entropy(logits.reshape(-1, self.vocab),
                               targets.reshape(-1))


def read_shard(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != SHARD_MAGIC:
            raise SystemExit("%s: not an llm.c token shard" % path)
        n = header[2]
        data = f.read(2 * n)
    if len(data) != 2 * n:
        raise SystemExit("%s: %d tokens in the header, %d in the file"
                         % (path, n, len(data) // 2))
    return torch.frombuffer(bytearray(data), dtype=torch.int16).to(
        torch.int64) & 0xFFFF


def shard_batches(tokens, B, T, device):
    """Consecutive (B, T) windows with targets shifted by one, wrapping."""
    if tokens.numel() < B * T + 1:
        raise SystemExit("the shard has %d tokens, a batch needs %d"
                         % (tokens.numel(), B * T + 1))
    pos = 0
    while True:
        if pos + B * T + 1 > tokens.numel():
            pos = 0
        chunk = tokens[pos:pos + B * T + 1].to(device)
        yield chunk[:-1].view(B, T), chunk[1:].view(B, T)
        pos += B * T


def random_batches(vocab, B, T, device, seed):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    while True:
        chunk = torch.randint(0, vocab, (B, T + 1), generator=gen,
                              device=device, dtype=torch.int64)
        yield chunk[:, :-1], chunk[:, 1:]


def make_optimizer(model, args, cuda):
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": 0.1},
              {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=args.lr, betas=(args.beta1, args.beta2), eps=1e-8)
    if cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
        except (RuntimeError, TypeError, ValueError) as e:
            print("note: fused AdamW unavailable (%s)" % e, flush=True)
    return torch.optim.AdamW(groups, **kwargs), "plain"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dtype", choices=("bf16", "tf32", "fp32"),
                    default="bf16")
    ap.add_argument("--compile", type=int, choices=(0, 1), default=1)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--channels", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10,
                    help="first steps left out of the median (compilation)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--data", help="llm.c token shard (default: random)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--peak_tflops", type=float,
                    help="peak for the MFU (default: H100 SXM dense for "
                    "--dtype: bf16 989.5, tf32 494.7, fp32 66.9)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads (0: torch's default)")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error("--steps must be more than --warmup")
    if args.channels % args.heads:
        ap.error("--channels must be a multiple of --heads")

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch %s sees no CUDA device"
                         % torch.__version__)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if cuda:
        torch.cuda.set_device(0)
        device_name = torch.cuda.get_device_name(0)
        if args.dtype == "tf32":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        elif args.dtype == "fp32":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
    else:
        device_name = "cpu " + (platform.processor() or platform.machine())

    torch.manual_seed(args.seed)
    model = Gpt2(args.layers, args.heads, args.channels, args.vocab,
                 args.seq).to(device)
    opt, adam_kind = make_optimizer(model, args, cuda)
    params = sum(p.numel() for p in model.parameters())
    L, C, T, B = args.layers, args.channels, args.seq, args.batch
    flops_per_token = 6 * params + 6 * L * C * T  # llm.c's estimate

    compiled = 0
    step_model = model
    if args.compile:
        if hasattr(torch, "compile"):
            step_model = torch.compile(model)
            compiled = 1
        else:
            print("note: torch %s has no torch.compile; running eager"
                  % torch.__version__, flush=True)
    if args.dtype == "bf16":
        autocast = lambda: torch.autocast(device_type=args.device,
                                          dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext

    if args.data:
        data = shard_batches(read_shard(args.data), B, T, device)
    else:
        data = random_batches(args.vocab, B, T, device, args.seed)

    print("torch %s dtype %s compile %d B %d T %d L %d C %d NH %d "
          "attention %s adamw %s data %s device %s"
          % (torch.__version__, args.dtype, compiled, B, T, L, C, args.heads,
             "sdpa" if HAVE_SDPA else "explicit", adam_kind,
             "shard" if args.data else "random", device_name), flush=True)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rates = []
    for step in range(1, args.steps + 1):
        x, y = next(data)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        dt = time.perf_counter() - t0
        rate = B * T / dt
        warm = step <= args.warmup
        if not warm:
            rates.append(rate)
        print("step %d ms %.1f tok/s %.0f loss %.4f%s"
              % (step, dt * 1e3, rate, loss.item(),
                 " warmup" if warm else ""), flush=True)

    median = statistics.median(rates)
    peak = (args.peak_tflops if args.peak_tflops is not None
            else PEAK_TFLOPS[args.dtype]) * 1e12
    peak_mem = torch.cuda.max_memory_allocated() if cuda else 0
    print("median_tok_s %.1f" % median)
    print("mfu %.4f" % (median * flops_per_token / peak))
    print("flops_per_token %d" % flops_per_token)
    print("peak_tflops %.1f" % (peak / 1e12))
    print("peak_mem_bytes %d" % peak_mem)
    print("params %d" % params, flush=True)


if __name__ == "__main__":
    main()
