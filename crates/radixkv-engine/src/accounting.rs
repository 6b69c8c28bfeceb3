//! Token accounting: where prompt tokens came from (the device's own
//! cache, the host tier, another device, or computed) and what moving KV
//! cost. One request's figures ([`Completion::tokens`](crate::Completion::tokens)),
//! a scheduler's copies ([`SchedulerStats::copied`](crate::sched::scheduler::SchedulerStats::copied))
//! and a device's running sums ([`DeviceMetrics::tokens`](crate::DeviceMetrics::tokens))
//! are these two types, added with `+=`.

use serde::ser::{Serialize, SerializeStruct, Serializer};
use std::ops::AddAssign;
use std::time::Duration;

/// KV copied into a device instead of computed: tokens loaded from the
/// host tier, tokens copied from other devices, and the copies' cost.
///
/// ```
/// use radixkv_engine::CopiedIn;
/// use std::time::Duration;
///
/// let mut sum = CopiedIn::default();
/// sum += CopiedIn { host_loaded_tokens: 32, bytes: 4096, time: Duration::from_micros(5), ..CopiedIn::default() };
/// sum += CopiedIn { peer_copied_tokens: 16, bytes: 2048, time: Duration::from_micros(2), ..CopiedIn::default() };
/// assert_eq!((sum.tokens(), sum.bytes), (48, 6144));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopiedIn {
    /// Tokens loaded from the host tier.
    pub host_loaded_tokens: u64,
    /// Tokens copied from other devices.
    pub peer_copied_tokens: u64,
    /// Bytes of KV moved for them.
    pub bytes: u64,
    /// Model time of those copies (per the tier cost model).
    pub time: Duration,
}

impl CopiedIn {
    /// Tokens copied in from either source.
    pub fn tokens(&self) -> u64 {
        self.host_loaded_tokens + self.peer_copied_tokens
    }
}

impl AddAssign for CopiedIn {
    fn add_assign(&mut self, o: CopiedIn) {
        self.host_loaded_tokens += o.host_loaded_tokens;
        self.peer_copied_tokens += o.peer_copied_tokens;
        self.bytes += o.bytes;
        self.time += o.time;
    }
}

/// Where prompt tokens came from: every prompt token is served from the
/// device's own cache, copied in ([`CopiedIn`]) or computed.
///
/// It serializes flat, as `prompt_tokens`, `cached_tokens`,
/// `host_loaded_tokens`, `peer_copied_tokens`, `recomputed_tokens`,
/// `copy_bytes`, `copy_time_s` and `hit_rate`.
///
/// ```
/// use radixkv_engine::{CopiedIn, PromptTokens};
///
/// let t = PromptTokens {
///     prompt_tokens: 100,
///     cached_tokens: 60,
///     copied: CopiedIn { peer_copied_tokens: 30, ..CopiedIn::default() },
/// };
/// assert_eq!(t.recomputed_tokens(), 10);
/// assert_eq!(t.hit_rate(), 0.6);
/// assert_eq!(t.reuse_rate(), 0.9);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptTokens {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Of which served from the device's own cache.
    pub cached_tokens: u64,
    /// Of which copied in from the host tier or other devices.
    pub copied: CopiedIn,
}

impl PromptTokens {
    /// Prompt tokens computed: neither cached nor copied in.
    pub fn recomputed_tokens(&self) -> u64 {
        self.prompt_tokens
            .saturating_sub(self.cached_tokens + self.copied.tokens())
    }

    /// `cached_tokens / prompt_tokens` (0 without prompt tokens).
    pub fn hit_rate(&self) -> f64 {
        ratio(self.cached_tokens, self.prompt_tokens)
    }

    /// The share of prompt tokens not computed: 1 − recomputed / prompt
    /// (0 without prompt tokens).
    pub fn reuse_rate(&self) -> f64 {
        ratio(
            self.prompt_tokens - self.recomputed_tokens(),
            self.prompt_tokens,
        )
    }
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

impl AddAssign for PromptTokens {
    fn add_assign(&mut self, o: PromptTokens) {
        self.prompt_tokens += o.prompt_tokens;
        self.cached_tokens += o.cached_tokens;
        self.copied += o.copied;
    }
}

impl Serialize for PromptTokens {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("PromptTokens", 8)?;
        st.serialize_field("prompt_tokens", &self.prompt_tokens)?;
        st.serialize_field("cached_tokens", &self.cached_tokens)?;
        st.serialize_field("host_loaded_tokens", &self.copied.host_loaded_tokens)?;
        st.serialize_field("peer_copied_tokens", &self.copied.peer_copied_tokens)?;
        st.serialize_field("recomputed_tokens", &self.recomputed_tokens())?;
        st.serialize_field("copy_bytes", &self.copied.bytes)?;
        st.serialize_field("copy_time_s", &self.copied.time.as_secs_f64())?;
        st.serialize_field("hit_rate", &self.hit_rate())?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_rates() {
        let one = PromptTokens {
            prompt_tokens: 64,
            cached_tokens: 16,
            copied: CopiedIn {
                host_loaded_tokens: 16,
                peer_copied_tokens: 16,
                bytes: 100,
                time: Duration::from_millis(1),
            },
        };
        let mut sum = PromptTokens::default();
        assert_eq!((sum.hit_rate(), sum.reuse_rate()), (0.0, 0.0));
        sum += one;
        sum += one;
        assert_eq!(sum.prompt_tokens, 128);
        assert_eq!(sum.copied.tokens(), 64);
        assert_eq!(sum.copied.time, Duration::from_millis(2));
        assert_eq!(sum.recomputed_tokens(), 32);
        assert_eq!(sum.hit_rate(), 0.25);
        assert_eq!(sum.reuse_rate(), 0.75);
    }

    #[test]
    fn serializes_flat_with_the_derived_figures() {
        let t = PromptTokens {
            prompt_tokens: 10,
            cached_tokens: 5,
            copied: CopiedIn {
                host_loaded_tokens: 2,
                peer_copied_tokens: 1,
                bytes: 7,
                time: Duration::from_millis(1500),
            },
        };
        let v = serde_json::to_value(t).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "prompt_tokens": 10, "cached_tokens": 5, "host_loaded_tokens": 2,
                "peer_copied_tokens": 1, "recomputed_tokens": 2, "copy_bytes": 7,
                "copy_time_s": 1.5, "hit_rate": 0.5,
            })
        );
    }
}
