"""llama.cpp's view of SmolLM2-135M-Instruct on a fixed prompt set.

Run by scripts/llama-reference.sh (which builds llama-cpp-python). For
each prompt, plain text or rendered with the GGUF's own chat template
(jinja2, as llama-cpp-python renders it): the tokens (special=True, no
BOS: the model's add_bos_token is false), the argmax, top-5 and top-2
margin of the next-token logits at every position, and 32 greedy tokens
(stopping at the end-of-sequence token). Also llama.cpp's prefill and
decode speed at the given thread count.

With --against-flash-attn REF.json it instead measures llama.cpp against
its own stored reference with one change of summation order (flash
attention on, everything else equal), by the measures
crates/radixkv-models/tests/llama_cpp.rs applies to radixkv: how far a
second computation of the same model moves the logits and the greedy
tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import jinja2
import llama_cpp
import numpy as np

LIBRARY = (
    "The city library opens at nine in the morning and closes at six in the "
    "evening, except on Sundays, when it is closed all day. Members may "
    "borrow up to five books at once, for three weeks each; a book may be "
    "renewed twice unless someone else has reserved it. Fines are ten cents "
    "a day, capped at the price of the book. Guests may read in the hall "
    "but need a pass, which the front desk issues against an identity card. "
)

PLAIN = [
    ("counting", "One, two, three, four, five, six, seven, eight, nine, ten, eleven,"),
    ("capital", "The capital of France is"),
    ("recipe", "To make a simple tomato sauce, first heat some olive oil in a pan, then"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("numbers", "In 2026 the population of the town grew from 12,345 to 13,579 people, an increase of"),
    ("library", LIBRARY * 8 + "Question: on which day is the library closed? Answer:"),
    ("unicode", "Café, naïve, 東京 and the rocket emoji 🚀 are all written in UTF-8, which"),
    ("story", "Once upon a time, in a small village by the sea, there lived an old fisherman who"),
]

CHATS = [
    ("chat-capital", [{"role": "user", "content": "What is the capital of France? Answer in one word."}]),
    ("chat-haiku", [{"role": "user", "content": "Write a haiku about the sea."}]),
    (
        "chat-library",
        [
            {"role": "system", "content": "You answer questions about the library. " + LIBRARY * 10},
            {"role": "user", "content": "How many books may I borrow, and for how long?"},
        ],
    ),
    (
        "chat-turns",
        [
            {"role": "user", "content": "Give me three colours."},
            {"role": "assistant", "content": "Red, green and blue."},
            {"role": "user", "content": "Now three animals."},
        ],
    ),
]

CONTINUATION = 32


def load(
    model: str, threads: int, n_ctx: int, logits_all: bool = False, flash_attn: bool = False
) -> llama_cpp.Llama:
    """llama.cpp on `model` with f32 K/V, as radixkv keeps it (llama.cpp's
    default is f16, which alone moves logits by up to about 0.1)."""
    return llama_cpp.Llama(
        flash_attn=flash_attn,
        model_path=model,
        n_ctx=n_ctx,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=logits_all,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        verbose=False,
    )


def render(template: str, messages: list[dict]) -> str:
    env = jinja2.Environment(loader=jinja2.BaseLoader())
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


def positions(llm: llama_cpp.Llama, tokens: list[int]) -> dict:
    """Every position's next-token argmax, top-5 and top-2 margin."""
    llm.reset()
    llm.eval(tokens)
    scores = np.asarray(llm.scores[: len(tokens)], dtype=np.float32)
    top = np.argsort(-scores, axis=1)[:, :5]
    rows = np.arange(len(tokens))
    margin = scores[rows, top[:, 0]] - scores[rows, top[:, 1]]
    return {
        "argmax": top[:, 0].tolist(),
        "top5": top.tolist(),
        "top5_logits": [[round(float(v), 4) for v in scores[r, top[r]]] for r in rows],
        "margin": [round(float(m), 4) for m in margin],
    }


def greedy(llm: llama_cpp.Llama, tokens: list[int], eos: int) -> dict:
    """32 greedy tokens after `tokens` and each step's top-2 margin."""
    llm.reset()
    llm.eval(tokens)
    out, margins = [], []
    for _ in range(CONTINUATION):
        row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        a, b = np.argsort(-row)[:2]
        out.append(int(a))
        margins.append(round(float(row[a] - row[b]), 4))
        if a == eos:
            break
        llm.eval([int(a)])
    return {"continuation": out, "continuation_margin": margins}


def last_logits(llm: llama_cpp.Llama) -> np.ndarray:
    """The last evaluated position's logits (without logits_all, llama.cpp
    keeps only those)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def speed(llm: llama_cpp.Llama, tokens: list[int]) -> dict:
    """Prefill of `tokens` at once, then 64 greedy decode steps, in
    tokens/s, on a model made without logits_all."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(tokens)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    nxt = int(np.argmax(last_logits(llm)))
    for _ in range(64):
        llm.eval([nxt])
        nxt = int(np.argmax(last_logits(llm)))
    decode = time.perf_counter() - t0
    return {
        "prefill_tokens": len(tokens),
        "prefill_tokens_per_s": round(len(tokens) / prefill, 1),
        "decode_tokens_per_s": round(64 / decode, 1),
    }


def against_flash_attn(model: str, threads: int, ref_path: str) -> None:
    """Prints llama.cpp with flash attention against the stored reference
    (made without it): the mean and largest |Δ| over the reference's top-5
    logits at every position, argmax agreement, where each greedy
    continuation first parts from the reference's (and the reference's
    top-2 margin there), and the steps equal before each continuation's
    first near tie (margin < 0.05)."""
    ref = json.loads(Path(ref_path).read_text())
    llm = load(model, threads, n_ctx=4096, logits_all=True, flash_attn=True)
    deltas: list[float] = []
    agree = total = before = equal = 0
    for p in ref["prompts"]:
        tokens = p["tokens"]
        here = positions(llm, tokens)
        scores = np.asarray(llm.scores[: len(tokens)], dtype=np.float32)
        for i, (ids, logits) in enumerate(zip(p["top5"], p["top5_logits"])):
            deltas += [abs(float(scores[i, t]) - v) for t, v in zip(ids, logits)]
        agree += sum(a == b for a, b in zip(here["argmax"], p["argmax"]))
        total += len(tokens)
        ours = greedy(llm, tokens, ref["eos"])["continuation"]
        theirs, margins = p["continuation"], p["continuation_margin"]
        parts = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        if parts is not None:
            print(f"{p['name']}: step {parts} differs at the reference's margin {margins[parts]}")
        sure = next((i for i, m in enumerate(margins) if m < 0.05), len(theirs))
        before += sure
        equal += min(sure, len(theirs) if parts is None else parts)
    print(
        f"flash attention against the reference: |Δ| over its top-5 mean {np.mean(deltas):.4f}, "
        f"max {np.max(deltas):.3f}; argmax {agree}/{total} = {100 * agree / total:.2f} %; "
        f"greedy tokens equal before the first near tie: {equal} of {before}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speed-only", metavar="TEXT_FILE",
                    help="only time prefill and decode on the first --tokens tokens of this text; print JSON")
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--against-flash-attn", metavar="REF_JSON",
                    help="compare llama.cpp with flash attention to this stored reference; print the measures")
    a = ap.parse_args()
    if a.against_flash_attn:
        against_flash_attn(a.model, a.threads, a.against_flash_attn)
        return
    if a.speed_only:
        fast = load(a.model, a.threads, n_ctx=a.tokens + 128)
        tokens = fast.tokenize(Path(a.speed_only).read_text().encode(), add_bos=False, special=True)
        if len(tokens) < a.tokens:
            raise SystemExit(f"{a.speed_only} has {len(tokens)} tokens, fewer than {a.tokens}")
        print(json.dumps(speed(fast, tokens[: a.tokens])))
        return
    if not a.out:
        ap.error("--out is required")
    digest = hashlib.sha256(Path(a.model).read_bytes()).hexdigest()
    llm = load(a.model, a.threads, n_ctx=4096, logits_all=True)
    template = llm.metadata["tokenizer.chat_template"]
    eos = llm.token_eos()
    prompts = [(n, t, None) for n, t in PLAIN]
    prompts += [(n, render(template, m), m) for n, m in CHATS]
    result = []
    for name, text, messages in prompts:
        tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
        entry = {"name": name, "text": text, "messages": messages, "tokens": tokens}
        entry.update(positions(llm, tokens))
        entry.update(greedy(llm, tokens, eos))
        # Steps before the first near tie (top-2 margin < 0.05).
        entry["sure"] = next(
            (i for i, m in enumerate(entry["continuation_margin"]) if m < 0.05),
            len(entry["continuation"]),
        )
        # The whole continuation as UTF-8 bytes (hex) and where each step's
        # bytes end: where another implementation's text parts from it
        # tells at which step its tokens did.
        whole = llm.detokenize(entry["continuation"])
        entry["continuation_hex"] = whole.hex()
        entry["continuation_ends"] = [
            len(llm.detokenize(entry["continuation"][: i + 1])) for i in range(len(entry["continuation"]))
        ]
        result.append(entry)
    long_prompt = llm.tokenize((LIBRARY * 24).encode(), add_bos=False, special=True)[:1500]
    # Speed without logits_all (which copies every position's logits).
    fast = load(a.model, a.threads, n_ctx=2048)
    doc = {
        "note": (
            "Written by scripts/llama-reference.sh: llama.cpp (llama-cpp-python "
            f"{llama_cpp.__version__}, built from source with GGML_NATIVE) on the GGUF "
            "below; tokens from Llama.tokenize(special=True, add_bos=False); argmax, "
            "top5 (ids and logits) and margin of each position's logits (logits_all=True, f32 K/V cache); greedy "
            "continuations of up to 32 tokens, stopping at eos."
        ),
        "model_sha256": digest,
        "llama_cpp_python": llama_cpp.__version__,
        "threads": a.threads,
        "eos": eos,
        "positions": sum(len(e["tokens"]) for e in result),
        "speed": speed(fast, long_prompt),
        "prompts": result,
    }
    Path(a.out).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"llama-reference: {doc['positions']} positions, {len(result)} prompts -> {a.out}")
    print(f"llama-reference: speed {doc['speed']}")


if __name__ == "__main__":
    main()
