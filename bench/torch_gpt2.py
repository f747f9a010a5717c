"""GPT-2 training steps in PyTorch on the CPU: the peer that
bench/train_cpu.sh compares `dsworker train` with.

The same model as worker/model.h (llm.c's GPT-2): token + position
embedding, pre-LayerNorm blocks with a fused qkv projection, causal
self-attention, tanh GELU MLP, final LayerNorm and a head tied to the token
embedding; mean cross-entropy; AdamW with weight decay on the 2-D weights
only and gradient clipping by global norm (dsworker computes the norm every
step too). Batches are read in order from an llm.c token shard, as dsworker
does with data.shuffle false.

Prints one line per step ("step N ms X tok/s Y loss Z") and a final
"median_tok_s X" over the steps after --warmup.

Run with Debian's PyTorch (/usr/bin/python3); tested with 1.13.
"""
import argparse
import math
import statistics
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHARD_MAGIC = 20240520


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
        # (B, NH, T, hs); PyTorch 1.13 has no F.scaled_dot_product_attention.
        q, k, v = (y.view(B, T, self.heads, hs).transpose(1, 2)
                   for y in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.attproj(y)

    def forward(self, x, mask):
        x = x + self.attention(self.ln1(x), mask)
        h = F.gelu(self.fc(self.ln2(x)), approximate="tanh")
        return x + self.fcproj(h)


class Gpt2(nn.Module):
    def __init__(self, layers, heads, channels, vocab, seq_len):
        super().__init__()
        self.wte = nn.Embedding(vocab, channels)
        self.wpe = nn.Embedding(seq_len, channels)
        self.blocks = nn.ModuleList(Block(channels, heads)
                                    for _ in range(layers))
        self.lnf = nn.LayerNorm(channels)
        # True above the diagonal: the future a query may not see.
        self.register_buffer("mask", torch.triu(
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
        logits = self.lnf(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)),
                               targets.reshape(-1))


def read_shard(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != SHARD_MAGIC:
            raise SystemExit("%s: not an llm.c token shard" % path)
        n = header[2]
        data = f.read(2 * n)
    return torch.frombuffer(bytearray(data), dtype=torch.int16).to(
        torch.int64) & 0xFFFF


def batches(tokens, B, T):
    """Consecutive (B, T) windows with targets shifted by one, wrapping."""
    pos = 0
    while True:
        if pos + B * T + 1 > tokens.numel():
            pos = 0
        chunk = tokens[pos:pos + B * T + 1]
        yield chunk[:-1].view(B, T), chunk[1:].view(B, T)
        pos += B * T


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--channels", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", required=True, help="llm.c token shard")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    model = Gpt2(args.layers, args.heads, args.channels, args.vocab, args.seq)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    data = batches(read_shard(args.data), args.batch, args.seq)
    rates = []
    for step in range(1, args.steps + 1):
        x, y = next(data)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        rate = args.batch * args.seq / dt
        if step > args.warmup:
            rates.append(rate)
        print("step %d ms %.1f tok/s %.0f loss %.4f"
              % (step, dt * 1e3, rate, loss.item()), flush=True)
    print("median_tok_s %.1f" % statistics.median(rates))


if __name__ == "__main__":
    main()
