"""What the prefix cache saves behind `radixkv serve --model gguf:PATH`.

Run by scripts/model-bench.sh with the server's base URL and a text file.
1. A chat of about 1,500 tokens (a system prompt from the text and two
   earlier turns) with a new user turn of under 64 tokens, cold (a system
   prompt the server has never seen), then the same history with another
   new turn (cached): the server's TTFT of each (`radixkv.ttft_ms`) and the
   client's time to the first streamed token; ROUNDS rounds, medians.
2. A multi-turn chat: prompt tokens, cached tokens and TTFT turn by turn.
"""

from __future__ import annotations

import statistics
import sys
import time

import httpx
import openai

BASE, TEXT = sys.argv[1], open(sys.argv[2]).read()
ROUNDS = 3
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)
MODEL = client.models.list().data[0].id


def ask(messages: list[dict], max_tokens: int = 1) -> dict:
    """One chat completion: the server's usage and TTFT, and the client's
    time to the first streamed content."""
    whole = httpx.post(BASE + "/v1/chat/completions", timeout=600, json={
        "model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}).json()
    return {
        "prompt": whole["usage"]["prompt_tokens"],
        "cached": whole["usage"]["prompt_tokens_details"]["cached_tokens"],
        "ttft_ms": whole["radixkv"]["ttft_ms"],
        "text": whole["choices"][0]["message"]["content"],
    }


def streamed_ttft_ms(messages: list[dict]) -> float:
    t0 = time.perf_counter()
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1,
                                                temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            break
    return (time.perf_counter() - t0) * 1e3


def history(session: int) -> list[dict]:
    words = TEXT.split()
    return [
        {"role": "system", "content": f"Session {session}. You answer questions about the library. "
                                      + " ".join(words[:1230])},
        {"role": "user", "content": "When does the library open?"},
        {"role": "assistant", "content": "It opens at nine in the morning and closes at six in the evening."},
        {"role": "user", "content": "Is it open on Sundays?"},
        {"role": "assistant", "content": "No, it is closed all day on Sundays."},
    ]


cold, warm, cold_client, warm_client, sizes = [], [], [], [], []
for r in range(ROUNDS):
    h = history(1000 + r)
    a = ask(h + [{"role": "user", "content": "How many books may I borrow at once?"}])
    b = ask(h + [{"role": "user", "content": "How much is the fine for a late book?"}])
    assert a["cached"] == 0 or a["cached"] < 64, a
    assert b["cached"] > 1000, b
    cold.append(a["ttft_ms"])
    warm.append(b["ttft_ms"])
    sizes.append((a["prompt"], b["prompt"], b["cached"]))
    h2 = history(2000 + r)
    cold_client.append(streamed_ttft_ms(h2 + [{"role": "user", "content": "Who may read in the hall?"}]))
    warm_client.append(streamed_ttft_ms(h2 + [{"role": "user", "content": "What does a guest need?"}]))
c, w = statistics.median(cold), statistics.median(warm)
print(f"chat of {sizes[0][0]} tokens cold, {sizes[0][1]} with {sizes[0][2]} cached ({ROUNDS} rounds, medians):")
print(f"  server TTFT: cold {c:.0f} ms, cached {w:.0f} ms, ratio {w / c:.3f}")
cc, wc = statistics.median(cold_client), statistics.median(warm_client)
print(f"  client time to first streamed token: cold {cc:.0f} ms, cached {wc:.0f} ms, ratio {wc / cc:.3f}")

print("multi-turn chat (8 turns of up to 32 generated tokens, greedy):")
msgs = [{"role": "system", "content": "You are a helpful assistant who knows a lot about libraries."}]
questions = ["What is a library?", "Who works there?", "What do they do all day?", "How do I join?",
             "Can I borrow films?", "What about e-books?", "Are there reading groups?", "Thanks!"]
for i, q in enumerate(questions):
    msgs.append({"role": "user", "content": q})
    v = ask(msgs, max_tokens=32)
    msgs.append({"role": "assistant", "content": v["text"]})
    print(f"  turn {i + 1}: {v['prompt']} prompt tokens, {v['cached']} cached, TTFT {v['ttft_ms']:.0f} ms")
