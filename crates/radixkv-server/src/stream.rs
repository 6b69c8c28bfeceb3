//! The bridge from the engine to async handlers, and the server-sent-event
//! stream of a streamed completion (text or chat).
//!
//! A request's events reach its handler through a tokio channel that the
//! engine's scheduler feeds from its own thread ([`sink`]: a callback, no
//! thread of the server's per request, nothing blocking). A
//! [`CancelGuard`] lives as long as the handler or the event stream:
//! dropped before `Done` (the client disconnected, the connection was
//! aborted), it cancels the request in the engine, which releases its
//! pages and pins.

use super::codec::TokenDecoder;
use super::wire::{Choice, CompletionResponse, Usage};
use crate::state::AppState;
use axum::response::sse::Event;
use radixkv_engine::sched::scheduler::StreamSink;
use radixkv_engine::StreamEvent;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::OwnedSemaphorePermit;

/// Cancels an engine request when dropped before [`disarm`](Self::disarm).
#[derive(Debug)]
pub struct CancelGuard {
    state: Arc<AppState>,
    id: u64,
    armed: bool,
}

impl CancelGuard {
    /// Guards request `id`.
    pub(crate) fn new(state: Arc<AppState>, id: u64) -> Self {
        CancelGuard {
            state,
            id,
            armed: true,
        }
    }

    /// The request is done: nothing to cancel.
    pub fn disarm(&mut self) {
        self.armed = false;
    }

    /// The server gives up on the request (not its client): it is
    /// cancelled in the engine now, and not counted as a disconnect.
    pub fn cancel(&mut self) {
        if std::mem::take(&mut self.armed) {
            self.state.engine().cancel(self.id);
        }
    }

    /// Its client met a stop sequence: the engine ends its generation
    /// now (it completes without error).
    pub fn end_generation(&self) {
        self.state.engine().end_generation(self.id);
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.armed {
            // Counted before the cancel: whoever sees the request gone
            // (through the engine's own synchronization, which orders the
            // cancel after this increment) sees it counted. Relaxed
            // suffices for that: the engine's release-acquire carries it.
            self.state.stats.disconnects.fetch_add(1, Ordering::Relaxed);
            self.state.engine().cancel(self.id);
        }
    }
}

/// A sink for the engine and the async receiver it feeds.
pub fn sink() -> (StreamSink, UnboundedReceiver<StreamEvent>) {
    let (tx, rx) = unbounded_channel();
    (StreamSink::callback(move |e| tx.send(e).is_ok()), rx)
}

/// Which API a stream answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/completions`: `text_completion` chunks.
    Text,
    /// `/v1/chat/completions`: `chat.completion.chunk` chunks with deltas.
    Chat,
}

/// The identity shared by every chunk of one streamed completion.
#[derive(Clone, Debug)]
pub struct ChunkMeta {
    /// `cmpl-<id>` or `chatcmpl-<id>`.
    pub id: String,
    /// Text or chat.
    pub kind: Kind,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
}

impl ChunkMeta {
    /// A chunk carrying `text` (and `finish`, on the last one).
    fn text(&self, text: String, finish: Option<&'static str>, first: bool) -> Event {
        self.chunk(Some((text, finish, first)), None)
    }

    /// The usage chunk (no choices).
    fn usage(&self, usage: Usage) -> Event {
        self.chunk(None, Some(usage))
    }

    /// A chunk of this stream's kind: one choice with `text` (its finish
    /// reason; whether it is the stream's first chunk), or none, and
    /// `usage` if given.
    fn chunk(
        &self,
        text: Option<(String, Option<&'static str>, bool)>,
        usage: Option<Usage>,
    ) -> Event {
        match self.kind {
            Kind::Text => json_event(&CompletionResponse {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                choices: text
                    .map(|(text, finish, _)| Choice {
                        text,
                        index: 0,
                        logprobs: None,
                        finish_reason: finish,
                    })
                    .into_iter()
                    .collect(),
                usage,
                radixkv: None,
            }),
            Kind::Chat => {
                let choices: Vec<serde_json::Value> = text
                    .map(|(text, finish, first)| {
                        let mut delta = serde_json::Map::new();
                        if first {
                            delta.insert("role".into(), "assistant".into());
                        }
                        if !text.is_empty() || finish.is_none() {
                            delta.insert("content".into(), text.into());
                        }
                        serde_json::json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
                    })
                    .into_iter()
                    .collect();
                let mut v = serde_json::json!({
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": choices,
                });
                if let Some(u) = usage {
                    v["usage"] = serde_json::json!(u);
                }
                json_event(&v)
            }
        }
    }
}

fn json_event<T: serde::Serialize>(v: &T) -> Event {
    Event::default().data(serde_json::to_string(v).unwrap_or_else(|e| {
        format!(r#"{{"error":{{"message":"cannot serialize a chunk: {e}"}}}}"#)
    }))
}

/// How a streamed completion's tokens become text.
pub struct TextOut {
    /// Tokens the request asked for.
    pub max_tokens: usize,
    /// A last chunk with `usage`.
    pub include_usage: bool,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// The model's decoder.
    pub decoder: Box<dyn TokenDecoder>,
    /// The model's end-of-sequence token.
    pub eos: Option<u32>,
}

/// A streamed completion: one event per generated token (a
/// `text_completion` or `chat.completion.chunk` chunk; a chat stream's
/// first delta carries the role), an optional usage chunk, then `[DONE]`;
/// on failure an `{"error": …}` event before `[DONE]`. With stop
/// sequences, text that could begin one is held back until it cannot, and
/// the stream's text ends before the first stop sequence (finish reason
/// `stop`; later tokens are not sent).
pub struct CompletionStream {
    rx: UnboundedReceiver<StreamEvent>,
    guard: CancelGuard,
    _permit: OwnedSemaphorePermit,
    decoder: Box<dyn TokenDecoder>,
    /// The model's end-of-sequence token: the stream ends there.
    eos: Option<u32>,
    meta: ChunkMeta,
    max_tokens: usize,
    sent: usize,
    include_usage: bool,
    queued: VecDeque<Event>,
    ended: bool,
    stop: Vec<String>,
    /// Text decoded and not yet sent (a possible start of a stop sequence).
    held: String,
    /// A stop sequence was met: the text is complete.
    stopped: bool,
    /// Tokens received when the stop sequence was met.
    stopped_at: Option<usize>,
    /// Chunks sent so far (a chat stream's first carries the role).
    chunks: usize,
}

impl std::fmt::Debug for CompletionStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionStream")
            .field("id", &self.meta.id)
            .field("sent", &self.sent)
            .finish()
    }
}

impl CompletionStream {
    /// A stream of `rx`'s events, its text made as `out` says; `guard` and
    /// `permit` are held until it ends or is dropped.
    pub fn new(
        rx: UnboundedReceiver<StreamEvent>,
        guard: CancelGuard,
        permit: OwnedSemaphorePermit,
        meta: ChunkMeta,
        out: TextOut,
    ) -> Self {
        CompletionStream {
            rx,
            guard,
            _permit: permit,
            decoder: out.decoder,
            eos: out.eos,
            meta,
            max_tokens: out.max_tokens,
            sent: 0,
            include_usage: out.include_usage,
            queued: VecDeque::new(),
            ended: false,
            stop: out.stop,
            held: String::new(),
            stopped: false,
            stopped_at: None,
            chunks: 0,
        }
    }

    /// Queues a text chunk.
    fn send_text(&mut self, text: String, finish: Option<&'static str>) {
        let first = self.chunks == 0;
        self.chunks += 1;
        self.queued.push_back(self.meta.text(text, finish, first));
    }

    /// Takes `text` (newly decoded); queues what can be sent.
    fn take_text(&mut self, text: &str, last: bool) {
        if self.stopped {
            return;
        }
        self.held.push_str(text);
        let (kept, hit) = super::api::cut_at_stop(&self.held, &self.stop);
        if hit {
            let out = kept.to_owned();
            self.held.clear();
            self.stopped = true;
            self.stopped_at = Some(self.sent);
            self.guard.end_generation();
            self.send_text(out, Some("stop"));
            return;
        }
        if last {
            let out = std::mem::take(&mut self.held);
            self.send_text(out, Some("length"));
            return;
        }
        // Hold back the longest tail that could begin a stop sequence.
        let keep = self
            .stop
            .iter()
            .flat_map(|s| {
                let held = &self.held;
                (1..s.len().min(held.len() + 1)).rev().find(|&n| {
                    held.is_char_boundary(held.len() - n) && s.starts_with(&held[held.len() - n..])
                })
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        if cut > 0 || self.stop.is_empty() {
            let out: String = self.held.drain(..cut).collect();
            self.send_text(out, None);
        }
    }

    /// A token the model's tokenizer cannot decode: the request is cancelled
    /// (its pages released) and the stream ends with the error.
    fn undecodable(&mut self, e: super::error::ApiError) {
        self.guard.cancel();
        self.fail(e);
    }

    fn fail(&mut self, e: super::error::ApiError) {
        self.queued.push_back(json_event(&e.body()));
        self.queued.push_back(Event::default().data("[DONE]"));
        self.ended = true;
    }
}

impl futures_core::Stream for CompletionStream {
    type Item = Result<Event, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(e) = this.queued.pop_front() {
                return Poll::Ready(Some(Ok(e)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match this.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(StreamEvent::Token(t))) => {
                    this.sent += 1;
                    if this.eos == Some(t) && !this.stopped {
                        // The model ended its turn: what is held goes out
                        // (no stop sequence can complete now).
                        let rest = match this.decoder.finish() {
                            Ok(rest) => rest,
                            Err(e) => {
                                this.undecodable(e);
                                continue;
                            }
                        };
                        let mut out = std::mem::take(&mut this.held);
                        out.push_str(&rest);
                        let (kept, _) = super::api::cut_at_stop(&out, &this.stop);
                        let kept = kept.to_owned();
                        this.stopped = true;
                        this.stopped_at = Some(this.sent);
                        this.guard.end_generation();
                        this.send_text(kept, Some("stop"));
                        continue;
                    }
                    let last = this.sent >= this.max_tokens;
                    let text = this.decoder.push(t).and_then(|mut text| {
                        if last {
                            text.push_str(&this.decoder.finish()?);
                        }
                        Ok(text)
                    });
                    match text {
                        // Queues a chunk, or holds the text back (a possible
                        // stop sequence), or drops it (after a stop).
                        Ok(text) => this.take_text(&text, last),
                        Err(e) => this.undecodable(e),
                    }
                }
                Poll::Ready(Some(StreamEvent::Done(c))) => {
                    this.guard.disarm();
                    match super::error::ApiError::of_completion(&c) {
                        Some(e) => this.fail(e),
                        None => {
                            if !this.stopped && !this.held.is_empty() {
                                let out = std::mem::take(&mut this.held);
                                this.send_text(out, Some("length"));
                            }
                            if this.include_usage {
                                let usage = match this.stopped_at {
                                    Some(n) => Usage::of_stopped(&c, n),
                                    None => Usage::of(&c),
                                };
                                let e = this.meta.usage(usage);
                                this.queued.push_back(e);
                            }
                            this.queued.push_back(Event::default().data("[DONE]"));
                            this.ended = true;
                        }
                    }
                }
                Poll::Ready(None) => {
                    // The sink was dropped without `Done`: the engine is gone.
                    this.guard.disarm();
                    this.fail(super::error::ApiError::Unavailable(
                        "the engine stopped".into(),
                    ));
                }
            }
        }
    }
}
