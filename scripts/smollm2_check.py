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


@check("greedy continuations equal llama.cpp's up to their first near tie")
def _():
    ref = json.load(open(REFERENCE))
    tokens = 0
    for p in ref["prompts"]:
        r = client.completions.create(model=MODEL, prompt=p["tokens"], temperature=0,
                                      max_tokens=len(p["continuation"]))
        text = r.choices[0].text
        assert text.startswith(p["sure_text"]), (p["name"], text, p["sure_text"])
        tokens += p["sure"]
    return f"{len(ref['prompts'])} prompts, {tokens} tokens"


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
    r = chat([{"role": "user", "content": "Count from one to ten in words, separated by commas."}],
             max_tokens=64, temperature=0, stop=["four"])
    text = r.choices[0].message.content
    assert "four" not in text and r.choices[0].finish_reason == "stop", text
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
