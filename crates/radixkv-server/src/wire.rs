//! The response shapes the completion and chat handlers share (OpenAI's
//! `usage`, a completion's `choices`, radixkv's own `radixkv` part).

use serde::Serialize;

/// `usage.prompt_tokens_details`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens not computed: served from the device's prefix cache,
    /// loaded from the host tier or copied from another device (the
    /// `radixkv` part of the response breaks it down).
    pub cached_tokens: usize,
}

/// A response's `usage`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
    /// Prompt tokens not computed (device hits, host loads, peer copies;
    /// also under `prompt_tokens_details`, OpenAI's place for it).
    pub cached_tokens: usize,
    /// OpenAI's details.
    pub prompt_tokens_details: PromptTokensDetails,
}

impl Usage {
    /// Usage of a finished request: every prompt token it did not compute
    /// counts as cached.
    pub fn of(c: &radixkv_engine::sched::scheduler::Completion) -> Usage {
        let t = &c.tokens;
        Usage::new(
            t.prompt_tokens as usize,
            c.output_tokens,
            (t.cached_tokens + t.copied.tokens()) as usize,
        )
    }

    /// Usage of a request whose client met a stop sequence after
    /// `generated` tokens: the tokens the engine made after it (before it
    /// heard of the stop) are not counted.
    pub fn of_stopped(c: &radixkv_engine::sched::scheduler::Completion, generated: usize) -> Usage {
        let mut u = Usage::of(c);
        u.completion_tokens = u.completion_tokens.min(generated);
        u.total_tokens = u.prompt_tokens + u.completion_tokens;
        u
    }

    /// Usage of a finished request.
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            cached_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// One choice of a completion (always index 0 here).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Choice {
    /// Generated text (the whole of it, or a stream chunk's part).
    pub text: String,
    /// Always 0.
    pub index: u32,
    /// Always null.
    pub logprobs: Option<()>,
    /// `"length"` once `max_tokens` tokens are generated; null in stream
    /// chunks before the last.
    pub finish_reason: Option<&'static str>,
}

/// Where and how fast the request ran (radixkv's addition).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunInfo {
    /// The device that served it.
    pub device: u32,
    /// Prompt tokens served from that device's prefix cache.
    pub device_hit_tokens: usize,
    /// Prompt tokens loaded from the host tier.
    pub host_loaded_tokens: usize,
    /// Prompt tokens copied from another device.
    pub peer_copied_tokens: usize,
    /// Arrival to first token, milliseconds.
    pub ttft_ms: f64,
    /// Arrival to last token, milliseconds.
    pub e2e_ms: f64,
    /// Times it was retracted and re-queued.
    pub retractions: u32,
}

/// A completion, or one chunk of a streamed one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionResponse {
    /// `cmpl-<engine request id>`.
    pub id: String,
    /// Always `text_completion`.
    pub object: &'static str,
    /// Unix time in seconds.
    pub created: u64,
    /// The model name.
    pub model: String,
    /// One choice (none in a stream's usage chunk).
    pub choices: Vec<Choice>,
    /// Token counts (absent from token chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Device and timings (absent from token chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub radixkv: Option<RunInfo>,
}
