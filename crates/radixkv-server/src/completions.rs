//! `POST /v1/completions` and `/v1/chat/completions`: a validated request
//! submitted to the engine, then streamed as server-sent events or answered
//! whole, cut at its first stop sequence (which also ends its generation
//! in the engine).

use super::api::{self, CompletionRequest, Limits};
use super::error::ApiError;
use super::wire::{Choice, CompletionResponse, RunInfo, Usage};
use crate::chat;
use crate::handlers::{body_or_error, unix_now};
use crate::response::json_response;
use crate::state::AppState;
use crate::stream;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use radixkv_engine::{EngineError, EngineRequest, StreamEvent};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

fn limits(s: &AppState) -> Limits {
    Limits {
        max_tokens_limit: s.cfg.max_tokens_limit,
        default_max_tokens: s.cfg.default_max_tokens,
    }
}

pub(crate) async fn completions(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(&s, body)?;
    let req = CompletionRequest::parse(&body, limits(&s), s.codec())?;
    run(s, req, stream::Kind::Text).await
}

pub(crate) async fn chat_completions(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(&s, body)?;
    let req = CompletionRequest::parse_chat(&body, limits(&s), s.codec())?;
    run(s, req, stream::Kind::Chat).await
}

/// Runs a validated completion (text or chat): streamed, or answered whole.
async fn run(
    s: Arc<AppState>,
    req: CompletionRequest,
    kind: stream::Kind,
) -> Result<Response, ApiError> {
    if let Some(m) = req.model.as_ref().filter(|m| **m != s.cfg.model_name) {
        return Err(ApiError::ModelNotFound(m.clone(), s.cfg.model_name.clone()));
    }
    // Whole pages: the prompt, the output and one page of slack must fit
    // one device's pool (the engine's own rule).
    let (pool, page) = {
        let e = s.engine();
        (e.max_request_tokens(), e.config().page_size)
    };
    if req.tokens.len() + req.max_tokens + page > pool {
        return Err(ApiError::BadRequest(format!(
            "prompt too long: {} prompt tokens + {} max_tokens do not fit a device's KV pool \
             of {pool} tokens (at most {} prompt tokens with this max_tokens)",
            req.tokens.len(),
            req.max_tokens,
            pool.saturating_sub(req.max_tokens + page)
        )));
    }
    if let Some(context) = s.codec().context() {
        if req.tokens.len() + req.max_tokens > context {
            return Err(ApiError::BadRequest(format!(
                "prompt too long: {} prompt tokens + {} max_tokens exceed the model's \
                 context of {context} tokens",
                req.tokens.len(),
                req.max_tokens
            )));
        }
    }
    if s.draining.load(Ordering::Relaxed) {
        return Err(ApiError::Unavailable("the server is shutting down".into()));
    }
    let permit = Arc::clone(&s.admission).try_acquire_owned().map_err(|_| {
        // Relaxed: a statistic.
        s.stats.rejected_busy.fetch_add(1, Ordering::Relaxed);
        ApiError::Busy {
            in_flight: s.in_flight(),
            limit: s.cfg.max_queue,
            retry_after_s: s.cfg.retry_after_s,
        }
    })?;
    let mut er = EngineRequest::new(Arc::clone(&req.tokens), req.max_tokens);
    er.sampling = req.sampling;
    // The namespace the KV events and /query name: salt and LoRA together.
    er.namespace =
        radixkv::TokenKey::namespace_for(req.lora_name.as_deref(), req.cache_salt.as_deref())
            .map(Arc::from);
    let (sink, mut events) = stream::sink();
    let submitted = s.engine().submit_to(er, sink);
    let id = submitted.map_err(|e| match e {
        EngineError::Rejected(m) => ApiError::BadRequest(m),
        EngineError::Stopped => ApiError::Unavailable("the engine is stopped".into()),
        EngineError::Failed(why) => ApiError::Unavailable(format!("the engine failed: {why}")),
        other => ApiError::Internal(other.to_string()),
    })?;
    let mut guard = stream::CancelGuard::new(Arc::clone(&s), id);
    let model = req
        .model
        .clone()
        .unwrap_or_else(|| s.cfg.model_name.clone());
    let meta = stream::ChunkMeta {
        id: match kind {
            stream::Kind::Text => format!("cmpl-{id}"),
            stream::Kind::Chat => format!("chatcmpl-{id}"),
        },
        kind,
        created: unix_now(),
        model,
    };
    if req.stream {
        let out = stream::TextOut {
            max_tokens: req.max_tokens,
            include_usage: req.include_usage,
            stop: req.stop.clone(),
            decoder: s.codec().decoder(),
            eos: s.codec().eos(),
        };
        let st = stream::CompletionStream::new(events, guard, permit, meta, out);
        return Ok(Sse::new(st)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
            .into_response());
    }
    let mut tokens = Vec::with_capacity(req.max_tokens);
    let mut watch = api::StopWatch::default();
    let codec = s.codec();
    let (mut decoder, eos) = (codec.decoder(), codec.eos());
    let c = loop {
        match events.recv().await {
            Some(StreamEvent::Token(t)) => {
                tokens.push(t);
                let piece = match decoder.push(t) {
                    Ok(piece) => piece,
                    Err(e) => {
                        // An undecodable token ends the request.
                        guard.cancel();
                        return Err(e);
                    }
                };
                let end = if eos == Some(t) {
                    watch.push_eos()
                } else {
                    watch.push(&piece, &req.stop)
                };
                if end {
                    guard.end_generation();
                }
            }
            Some(StreamEvent::Done(c)) => break c,
            None => {
                guard.disarm();
                return Err(ApiError::Unavailable("the engine stopped".into()));
            }
        }
    };
    guard.disarm();
    drop(permit);
    if let Some(e) = ApiError::of_completion(&c) {
        return Err(e);
    }
    // Tokens the engine made after the end are not part of the answer.
    let upto = watch.hit_at().unwrap_or(tokens.len()).min(tokens.len());
    let text = codec.decode(&tokens[..upto])?;
    let (text, _) = api::cut_at_stop(&text, &req.stop);
    let finish = if watch.hit_at().is_some() {
        "stop"
    } else {
        "length"
    };
    let usage = match watch.hit_at() {
        Some(n) => Usage::of_stopped(&c, n),
        None => Usage::of(&c),
    };
    let info = RunInfo {
        device: c.device.0,
        device_hit_tokens: c.tokens.cached_tokens as usize,
        host_loaded_tokens: c.tokens.copied.host_loaded_tokens as usize,
        peer_copied_tokens: c.tokens.copied.peer_copied_tokens as usize,
        ttft_ms: c.ttft.as_secs_f64() * 1e3,
        e2e_ms: c.e2e.as_secs_f64() * 1e3,
        retractions: c.retractions,
    };
    Ok(match kind {
        stream::Kind::Text => json_response(
            StatusCode::OK,
            &CompletionResponse {
                id: meta.id,
                object: "text_completion",
                created: meta.created,
                model: meta.model,
                choices: vec![Choice {
                    text: text.to_owned(),
                    index: 0,
                    logprobs: None,
                    finish_reason: Some(finish),
                }],
                usage: Some(usage),
                radixkv: Some(info),
            },
        ),
        stream::Kind::Chat => json_response(
            StatusCode::OK,
            &chat::ChatResponse {
                id: meta.id,
                object: "chat.completion",
                created: meta.created,
                model: meta.model,
                choices: vec![chat::ChatChoice {
                    index: 0,
                    message: chat::ChatMessage {
                        role: "assistant",
                        content: text.to_owned(),
                    },
                    logprobs: None,
                    finish_reason: finish,
                }],
                usage,
                radixkv: info,
            },
        ),
    })
}
