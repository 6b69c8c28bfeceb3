"""SmolLM2-135M-Instruct behind radixkv serve, through the openai client.

Run by scripts/smollm2-check.sh with the server's base URL and llama.cpp's
reference data. Every check prints its name and what it measured; the
first failure exits non-zero.
"""

from __future__ import annotations

import json
import sys
import time

import httpx
import openai

BASE, REFERENCE = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)
MODEL = client.models.list().data[0].id
failures = 0


def check(name):
    def wrap(f):
        global failures
        t0 = time.perf_counter()
        try:
            detail = f()
            print(f"ok   {name} ({time.perf_counter() - t0:.1f} s){': ' + detail if detail else ''}")
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failures += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
        return f

    return wrap


def chat(messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


@check("a question answered in real text, ending at the model's end of turn")
def _():
    r = chat([{"role": "user", "content": "What is the capital of France? Answer in one word."}],
             max_tokens=32, temperature=0)
    text = r.choices[0].message.content
    assert "Paris" in text, text
    assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason
    assert 0 < r.usage.completion_tokens < 32, r.usage
    return repr(text)


@check("greedy continuations follow llama.cpp's wherever it is sure (margin >= 0.5)")
def _():
    # As crates/radixkv-models/tests/llama_cpp.rs: the served text may part
    # from llama.cpp's only at a step whose top-2 margin is below 0.5 (two
    # implementations' logits differ by 0.15 on average); how much is equal
    # before each first near tie (margin < 0.05) is reported.
    ref = json.load(open(REFERENCE))
    steps = equal = 0
    parted = []
    for p in ref["prompts"]:
        r = client.completions.create(model=MODEL, prompt=p["tokens"], temperature=0,
                                      max_tokens=len(p["continuation"]))
        ours, theirs = r.choices[0].text.encode(), bytes.fromhex(p["continuation_hex"])
        common = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        ends = p["continuation_ends"]
        # The first step whose bytes are not all in the common prefix.
        step = next((i for i, e in enumerate(ends) if e > common), len(ends))
        if step < len(ends) and len(ours) < ends[step] and r.choices[0].finish_reason == "length":
            step = len(ends)  # cut by max_tokens inside a multi-byte character
        if step < len(ends):
            margin = p["continuation_margin"][step]
            parted.append(f"{p['name']} at step {step} (margin {margin})")
            assert margin < 0.5, (p["name"], step, margin, r.choices[0].text)
        steps += p["sure"]
        equal += min(p["sure"], step)
    return (f"{len(ref['prompts'])} prompts; equal before the first near tie: {equal} of {steps} steps; "
            f"parted: {', '.join(parted) or 'none'}")


@check("a streamed chat gives the same text as the whole answer")
def _():
    msgs = [{"role": "user", "content": "Write a haiku about the sea."}]
    whole = chat(msgs, max_tokens=40, temperature=0).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in chat(msgs, max_tokens=40, temperature=0, stream=True)
             if c.choices]
    assert "".join(parts) == whole, ("".join(parts), whole)
    return f"{len(parts)} chunks"


@check("stop strings cut the text and end generation")
def _():
    # Greedy, this prompt goes on " twelve, thirteen, fourteen, ..." in
    # llama.cpp and in radixkv alike (tests/data/smollm2-llama-cpp.json,
    # prompt "counting").
    r = client.completions.create(model=MODEL, temperature=0, max_tokens=64, stop=["fourteen"],
                                  prompt="One, two, three, four, five, six, seven, eight, nine, ten, eleven,")
    text = r.choices[0].text
    assert text == " twelve, thirteen, ", text
    assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason
    assert r.usage.completion_tokens < 10, r.usage
    return repr(text)


@check("seeded sampling is reproducible and the seed matters")
def _():
    msgs = [{"role": "user", "content": "Tell me a short story about a cat."}]
    a, b, c = (chat(msgs, max_tokens=24, temperature=0.9, top_p=0.95, seed=s).choices[0].message.content
               for s in (1, 1, 2))
    assert a == b, (a, b)
    assert a != c, (a, c)
    return None


@check("a multi-turn chat reuses every earlier turn (cached tokens and TTFT turn by turn)")
def _():
    msgs = [{"role": "system", "content": "You are a helpful assistant who knows a lot about libraries."}]
    report = []
    for q in ["What is a library?", "Who works there?", "What do they do all day?", "Thanks!"]:
        msgs.append({"role": "user", "content": q})
        r = httpx.post(BASE + "/v1/chat/completions", timeout=300, json={
            "model": MODEL, "messages": msgs, "max_tokens": 24, "temperature": 0})
        v = r.json()
        msgs.append({"role": "assistant", "content": v["choices"][0]["message"]["content"]})
        report.append((v["usage"]["prompt_tokens"], v["usage"]["prompt_tokens_details"]["cached_tokens"],
                       round(v["radixkv"]["ttft_ms"])))
    cached = [c for _, c, _ in report]
    assert all(later > 0 for later in cached[1:]), report
    assert cached == sorted(cached), report
    return "; ".join(f"turn {i + 1}: {p} prompt, {c} cached, TTFT {t} ms" for i, (p, c, t) in enumerate(report))


@check("bad input is a 400, not a crash: too long, a token outside the vocabulary")
def _():
    for prompt, why in [([1] * 9000, "too long"), ([60000], "token id")]:
        try:
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=4)
        except openai.BadRequestError as e:
            assert why in str(e), str(e)
        else:
            raise AssertionError(f"accepted a prompt that should fail on {why}")
    health = httpx.get(BASE + "/health").json()
    assert health["status"] == "ok", health
    return None


sys.exit(1 if failures else 0)
