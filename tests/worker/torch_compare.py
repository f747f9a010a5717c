"""GPT-2 in PyTorch (float64) from an llm.c model file: the reference for
tests/worker/model_torch_test.cc.

usage: torch_compare.py MODEL.bin BATCH.bin GRADS_OUT.bin

MODEL.bin is llm.c's model_*.bin (int32 header[256], magic 20240326,
version 3, then fp32 parameters). BATCH.bin is int32 B, T, then B*T tokens
and B*T targets. Prints "loss=<mean cross-entropy> grad_norm=<L2 norm of all
gradients>" and writes every gradient, in llm.c's parameter order, as fp32
to GRADS_OUT.bin. Run it with Debian's /usr/bin/python3 (PyTorch 1.13 CPU).
"""
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


def read_model(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header[0] != 20240326 or header[1] != 3:
        sys.exit(f"{path}: not an fp32 llm.c model file")
    maxT, V, L, NH, C, Vp = (int(x) for x in header[2:8])
    shapes = [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C),
              (L, C, C), (L, C), (L, C), (L, C), (L, 4 * C, C), (L, 4 * C),
              (L, C, 4 * C), (L, C), (C,), (C,)]
    flat = np.fromfile(path, dtype=np.float32, offset=1024)
    params, at = {}, 0
    for name, shape in zip(NAMES, shapes):
        n = math.prod(shape)
        t = torch.from_numpy(flat[at:at + n].reshape(shape).astype(np.float64))
        params[name] = t.requires_grad_(True)
        at += n
    if at != flat.size:
        sys.exit(f"{path}: {flat.size} parameters, expected {at}")
    return dict(maxT=maxT, V=V, L=L, NH=NH, C=C), params


def read_batch(path):
    raw = np.fromfile(path, dtype=np.int32)
    B, T = int(raw[0]), int(raw[1])
    tokens = torch.from_numpy(raw[2:2 + B * T].astype(np.int64)).view(B, T)
    targets = torch.from_numpy(raw[2 + B * T:2 + 2 * B * T].astype(np.int64))
    return tokens, targets.view(B, T)


def attention(qkv, NH):
    B, T, C3 = qkv.shape
    C = C3 // 3
    q, k, v = (x.view(B, T, NH, C // NH).transpose(1, 2)
               for x in qkv.split(C, dim=2))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (att @ v).transpose(1, 2).reshape(B, T, C)


def forward(cfg, p, tokens, targets):
    C, V = cfg["C"], cfg["V"]
    T = tokens.shape[1]
    x = p["wte"][tokens] + p["wpe"][:T]
    for l in range(cfg["L"]):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
        y = attention(h @ p["qkvw"][l].T + p["qkvb"][l], cfg["NH"])
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
        h = F.gelu(h @ p["fcw"][l].T + p["fcb"][l], approximate="tanh")
        x = x + h @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    logits = x @ p["wte"][:V].T  # the padded rows of wte are not used
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def main():
    model_path, batch_path, out_path = sys.argv[1:4]
    cfg, params = read_model(model_path)
    tokens, targets = read_batch(batch_path)
    loss = forward(cfg, params, tokens, targets)
    loss.backward()
    grads = [params[n].grad.reshape(-1) for n in NAMES]
    flat = torch.cat(grads)
    flat.numpy().astype(np.float32).tofile(out_path)
    print(f"loss={loss.item():.17g} grad_norm={flat.norm().item():.17g}")


if __name__ == "__main__":
    main()
