"""Peak memory of a Hugging Face causal LM's forward + backward: its own loss against ours.

Usage::

    python benchmarks/hf_memory.py                     # 4,096 tokens, vocabulary 32,000, CPU
    python benchmarks/hf_memory.py --device cuda       # on a GPU (its allocator's peak)
    python benchmarks/hf_memory.py --tokens 8192 --vocab 128000 --hidden 512

The model is a random-init ``LlamaForCausalLM`` (``--layers`` layers of width ``--hidden``,
untied output layer, float32) and the batch ``--batch`` sequences of ``tokens / batch`` ids.
Candidates, each one forward + backward of the same model on the same batch:

- ``HF model(..., labels=...)``: the model's own loss (``[tokens, vocabulary]`` logits built,
  ``ForCausalLMLoss``' cross-entropy);
- ``ours causal_lm_loss ce`` and ``ours causal_lm_loss TaiLr``:
  :func:`lightning_losses.integrations.huggingface.causal_lm_loss` (the decoder's hidden states
  and the chunked head; no logits tensor).

On the CPU each candidate runs in a fresh process: after one warm-up call on 8 tokens (kernels
and lazy set-up loaded) and with the gradients freed, the resident high-water mark is reset
(``/proc/self/clear_refs``) and the peak of one forward + backward is the high-water mark
(``VmHWM``) less the resident set just before the call (``VmRSS``): what the call itself
touched, activations and gradients included, the model and inputs not. On a GPU:
``torch.cuda.max_memory_allocated()`` less ``memory_allocated()`` before the call. The losses of
the candidates are printed beside their memory (ours ``ce`` equals HF's), and the ratios are
HF's peak over ours.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
from peak_memory import reset_peak, status_bytes

CANDIDATES = {
    "HF model(..., labels=...)": None,
    "ours causal_lm_loss ce": {"loss": "ce"},
    "ours causal_lm_loss TaiLr": {"loss": "gamma_ce", "gamma": 1e-7, "threshold": 0.2},
}


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.Tensor]:
    """The seeded model and batch of ``args``, on its device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        max_position_embeddings=args.tokens // args.batch,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(args.device)
    ids = torch.randint(0, args.vocab, (args.batch, args.tokens // args.batch))
    return model, ids.to(args.device)


def step(name: str, model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """One forward + backward of candidate ``name``; the loss."""
    from lightning_losses.integrations.huggingface import causal_lm_loss

    options = CANDIDATES[name]
    if options is None:
        loss = model(input_ids=ids, labels=ids).loss
    else:
        loss = causal_lm_loss(model, ids, **options)
    loss.backward()
    return loss.detach()


def measure(name: str, args: argparse.Namespace) -> dict[str, float]:
    """Peak bytes of one forward + backward of ``name`` (in this process), its loss and time."""
    model, ids = build(args)
    step(name, model, ids[:1, :8])  # warm-up: lazy set-up and kernels, not counted
    model.zero_grad(set_to_none=True)  # the gradients count, for every candidate alike
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        loss = step(name, model, ids)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() - before
    else:
        reset_peak()
        before = status_bytes("VmRSS")
        start = time.perf_counter()
        loss = step(name, model, ids)
        seconds = time.perf_counter() - start
        peak = status_bytes("VmHWM") - before
    return {"peak": float(peak), "loss": float(loss), "seconds": seconds}


def in_fresh_process(name: str, args: argparse.Namespace) -> dict[str, float]:
    """:func:`measure` of ``name`` in a new Python process (a clean high-water mark)."""
    command = [sys.executable, __file__, "--measure", name, *_shape_args(args)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _shape_args(args: argparse.Namespace) -> list[str]:
    names = ("tokens", "vocab", "hidden", "layers", "batch", "device", "threads")
    return [f"--{name}={getattr(args, name)}" for name in names]


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per batch")
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary size")
    parser.add_argument("--hidden", type=int, default=256, help="model width")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--batch", type=int, default=4, help="sequences per batch")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one candidate, in a child
    args = parser.parse_args()
    if args.tokens % args.batch:
        parser.error(f"--tokens {args.tokens} must be a multiple of --batch {args.batch}")
    return args


def main() -> None:
    """Measure every candidate and print the table and HF's peak over ours."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.measure:
        print(json.dumps(measure(args.measure, args)))
        return
    if args.device == "cuda":
        results = {name: measure(name, args) for name in CANDIDATES}
        where = f"GPU {torch.cuda.get_device_name()} (torch.cuda.max_memory_allocated)"
    else:
        results = {name: in_fresh_process(name, args) for name in CANDIDATES}
        where = f"CPU, {args.threads} thread(s) (resident high-water mark, /proc VmHWM)"
    logits = args.tokens * args.vocab * 4
    print(
        f"LlamaForCausalLM {args.layers} layers, width {args.hidden}, vocabulary {args.vocab}, "
        f"{args.tokens} tokens ({args.batch} x {args.tokens // args.batch}), float32; {where}; "
        f"one [tokens, vocabulary] float32 tensor is {logits / 2**20:.0f} MiB"
    )
    print(f"{'candidate':<30} {'peak MiB':>10} {'seconds':>8} {'loss':>10}")
    for name, result in results.items():
        print(
            f"{name:<30} {result['peak'] / 2**20:>10.0f} {result['seconds']:>8.2f} "
            f"{result['loss']:>10.5f}"
        )
    theirs = results["HF model(..., labels=...)"]["peak"]
    for name, result in results.items():
        if name.startswith("ours"):
            print(f"HF peak / {name} peak: {theirs / result['peak']:.2f}x")


if __name__ == "__main__":
    main()
