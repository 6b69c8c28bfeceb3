//! The bridge from the engine's blocking per-request channel to async
//! handlers, and the server-sent-event stream of a streamed completion.
//!
//! Each admitted request gets a small forwarding thread that blocks on the
//! engine's `std::sync::mpsc` receiver and passes events into a tokio
//! channel; it ends after the request's `Done`, or as soon as the async
//! side is gone. A [`CancelGuard`] lives as long as the handler or the
//! event stream: dropped before `Done` (the client disconnected, the
//! connection was aborted), it cancels the request in the engine, which
//! releases its pages and pins.

use super::api::{token_byte, Choice, CompletionResponse, Usage, Utf8Decoder};
use super::AppState;
use axum::response::sse::Event;
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
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.armed {
            self.state.engine().cancel(self.id);
            // Relaxed: a statistic.
            self.state.stats.disconnects.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Forwards `rx`'s events into a tokio channel from a dedicated thread.
pub fn forward(
    rx: std::sync::mpsc::Receiver<StreamEvent>,
) -> std::io::Result<UnboundedReceiver<StreamEvent>> {
    let (tx, out) = unbounded_channel();
    std::thread::Builder::new()
        .name("radixkv-http-fwd".into())
        .spawn(move || {
            while let Ok(ev) = rx.recv() {
                let done = matches!(ev, StreamEvent::Done(_));
                if tx.send(ev).is_err() || done {
                    break;
                }
            }
        })?;
    Ok(out)
}

/// The identity shared by every chunk of one streamed completion.
#[derive(Clone, Debug)]
pub struct ChunkMeta {
    /// `cmpl-<id>`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
}

impl ChunkMeta {
    fn chunk(&self, choices: Vec<Choice>, usage: Option<Usage>) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            radixkv: None,
        }
    }
}

fn json_event<T: serde::Serialize>(v: &T) -> Event {
    Event::default().data(serde_json::to_string(v).unwrap_or_else(|e| {
        format!(r#"{{"error":{{"message":"cannot serialize a chunk: {e}"}}}}"#)
    }))
}

/// A streamed completion: one event per generated token (a
/// `text_completion` chunk), an optional usage chunk, then `[DONE]`; on
/// failure an `{"error": …}` event before `[DONE]`.
pub struct CompletionStream {
    rx: UnboundedReceiver<StreamEvent>,
    guard: CancelGuard,
    _permit: OwnedSemaphorePermit,
    decoder: Utf8Decoder,
    meta: ChunkMeta,
    max_tokens: usize,
    sent: usize,
    include_usage: bool,
    queued: VecDeque<Event>,
    ended: bool,
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
    /// A stream of `rx`'s events; `guard` and `permit` are held until it
    /// ends or is dropped.
    pub fn new(
        rx: UnboundedReceiver<StreamEvent>,
        guard: CancelGuard,
        permit: OwnedSemaphorePermit,
        meta: ChunkMeta,
        max_tokens: usize,
        include_usage: bool,
    ) -> Self {
        CompletionStream {
            rx,
            guard,
            _permit: permit,
            decoder: Utf8Decoder::default(),
            meta,
            max_tokens,
            sent: 0,
            include_usage,
            queued: VecDeque::new(),
            ended: false,
        }
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
        if let Some(e) = this.queued.pop_front() {
            return Poll::Ready(Some(Ok(e)));
        }
        if this.ended {
            return Poll::Ready(None);
        }
        match this.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(StreamEvent::Token(t))) => {
                this.sent += 1;
                let last = this.sent >= this.max_tokens;
                let mut text = this.decoder.push(token_byte(t));
                if last {
                    text.push_str(&this.decoder.finish());
                }
                let chunk = this.meta.chunk(
                    vec![Choice {
                        text,
                        index: 0,
                        logprobs: None,
                        finish_reason: last.then_some("length"),
                    }],
                    None,
                );
                Poll::Ready(Some(Ok(json_event(&chunk))))
            }
            Poll::Ready(Some(StreamEvent::Done(c))) => {
                this.guard.disarm();
                match super::completion_error(&c) {
                    Some(e) => this.fail(e),
                    None => {
                        if this.include_usage {
                            let usage = Usage::of(&c);
                            let chunk = this.meta.chunk(Vec::new(), Some(usage));
                            this.queued.push_back(json_event(&chunk));
                        }
                        this.queued.push_back(Event::default().data("[DONE]"));
                        this.ended = true;
                    }
                }
                Poll::Ready(this.queued.pop_front().map(Ok))
            }
            Poll::Ready(None) => {
                // The forwarder ended without `Done`: the engine is gone.
                this.guard.disarm();
                this.fail(super::error::ApiError::Unavailable(
                    "the engine stopped".into(),
                ));
                Poll::Ready(this.queued.pop_front().map(Ok))
            }
        }
    }
}
