//! Options shared by several commands: the engine's (`replay`, `serve`),
//! the workload's (`replay`, `hitrate`), and writing JSON.

use crate::ranges;
use radixkv_engine::EngineConfig;
use radixkv_tools::trace::{self, ChatShape, Trace, TreeShape};
use std::path::{Path, PathBuf};

/// Tlru's budget, shared by `serve`, `replay` and `hitrate`.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct TlruArgs {
    /// Tlru's prefill budget in tokens (`threshold` in SGLang's
    /// --radix-eviction-policy-config; the default is SGLang's example);
    /// above --tlru-next-prompt-estimate when tlru is used.
    #[arg(long, default_value_t = 4096)]
    pub tlru_threshold: u64,
    /// Tlru's estimate of the tokens a conversation's next prompt adds
    /// (`next_prompt_estimate` there).
    #[arg(long, default_value_t = 512)]
    pub tlru_next_prompt_estimate: u64,
}

impl TlruArgs {
    /// (threshold, next prompt estimate); with `used` (a tlru cache will be
    /// built), refused when the threshold is not above the estimate, as
    /// SGLang refuses it at start: no token would ever be past its budget.
    pub fn checked(&self, used: bool) -> Result<(u64, u64), String> {
        let (t, q) = (self.tlru_threshold, self.tlru_next_prompt_estimate);
        if used && t <= q {
            return Err(format!(
                "--tlru-threshold ({t}) must be above --tlru-next-prompt-estimate ({q}): \
                 otherwise no token is ever past its budget and tlru is lru"
            ));
        }
        Ok((t, q))
    }
}

/// The engine's options, shared by `serve` and `replay`.
#[derive(clap::Args, Debug)]
pub struct EngineArgs {
    /// Devices (simulated GPUs), one scheduler thread each (1 to 1,024;
    /// default 4, or 2 with a model that computes on the CPU: --model tiny
    /// or gguf:PATH).
    #[arg(long, value_parser = ranges::count(ranges::DEVICES))]
    pub devices: Option<usize>,
    /// Tokens per KV page (1 to 65,536).
    #[arg(long, default_value_t = 16, value_parser = ranges::count(ranges::PAGE_SIZE))]
    pub page_size: usize,
    /// KV pages per device, page 0 reserved (2 to 2³²−1; default: replay, enough for
    /// the whole workload's prompt and output tokens, at most 4,194,304,
    /// or 512 tokens' worth with --model tiny and 768 with gguf:PATH on
    /// their default workloads; serve, 16,384, or 4,096 tokens' worth with
    /// --model tiny and 8,192 with gguf:PATH). A GGUF model's K/V is f32:
    /// SmolLM2-135M takes 46 KB a token, so 2 devices of 8,192 tokens and
    /// the default host tier (4 × a device) take 2.3 GB.
    #[arg(long, value_parser = ranges::count(ranges::POOL_PAGES))]
    pub pages_per_device: Option<usize>,
    /// Router: cache-aware, round-robin, least-loaded or private.
    #[arg(long, default_value = "cache-aware")]
    pub router: String,
    /// Waiting-queue policy: fcfs, lof, random, lpm or dfs-weight.
    #[arg(long, default_value = "lpm")]
    pub schedule_policy: String,
    /// Eviction policy of the tree: lru, lfu, fifo, mru, filo, priority,
    /// slru, sieve or tlru.
    #[arg(long, default_value = "lru")]
    pub eviction: String,
    /// Tlru's budget (with --eviction tlru).
    #[command(flatten)]
    pub tlru: TlruArgs,
    /// Pages of the host tier shared by all devices (default: 4 × a
    /// device's pool, host memory being typically 4–10× a GPU's KV pool;
    /// 0: no host tier; otherwise 2 to 2³²−1). With --router private each
    /// device's tree gets an equal share (none with --model tiny).
    #[arg(long, value_parser = ranges::host_pages)]
    pub host_pages: Option<usize>,
    /// Copies made instead of recomputing: none, host (loads from the host
    /// tier), peer (copies from another device) or all.
    #[arg(long, default_value = "all")]
    pub copy: String,
    /// When prompts go to the host tier: write-through (once cached),
    /// write-through-selective (once hit twice) or write-back (before an
    /// eviction).
    #[arg(long, default_value = "write-back")]
    pub write_policy: String,
    /// The model's KV shape for copy costs: llama3-8b, llama3-70b,
    /// qwen2.5-7b, or layers=…,kv-heads=…,head-dim=…,dtype=….
    #[arg(long, default_value = "llama3-8b")]
    pub model_shape: String,
    /// Host ↔ device bandwidth, GB/s per direction (0.001 to 10⁶; default:
    /// PCIe 5).
    #[arg(long, default_value_t = radixkv_engine::tiers::Link::PCIE5.gb_per_s, value_parser = ranges::gb_per_s)]
    pub host_gbps: f64,
    /// Device ↔ device bandwidth, GB/s per direction (0.001 to 10⁶;
    /// default: NVLink 4).
    #[arg(long, default_value_t = radixkv_engine::tiers::Link::NVLINK4.gb_per_s, value_parser = ranges::gb_per_s)]
    pub peer_gbps: f64,
    /// Below this many extra tokens a prefix is recomputed, never copied
    /// (0 to 2³²−1).
    #[arg(long, default_value_t = 16, value_parser = ranges::count(0..=u32::MAX as u64))]
    pub load_back_threshold: usize,
}

/// The host tier's default size in device pools.
pub const HOST_POOL_MULTIPLE: usize = 4;

impl EngineArgs {
    /// Sets everything but the pool size, validating the names; `real`:
    /// the model computes on the CPU (2 devices by default, not 4).
    pub fn apply(
        &self,
        cfg: &mut EngineConfig,
        real: bool,
    ) -> Result<(), Box<dyn std::error::Error>> {
        cfg.devices = self.devices.unwrap_or(if real { 2 } else { 4 });
        cfg.page_size = self.page_size;
        cfg.eviction_policy = self.eviction.parse()?;
        cfg.tlru = self
            .tlru
            .checked(cfg.eviction_policy == radixkv::EvictionPolicy::Tlru)?;
        cfg.router.kind = self.router.parse()?;
        cfg.scheduler.policy.policy = self.schedule_policy.parse()?;
        Ok(())
    }

    /// Sets the tier options, once `cfg.pages_per_device` is final (the
    /// host tier's default size follows it).
    pub fn apply_tiers(&self, cfg: &mut EngineConfig) -> Result<(), Box<dyn std::error::Error>> {
        let t = &mut cfg.tiers;
        t.host_pages = match self.host_pages {
            Some(0) => None,
            Some(n) => Some(n),
            None => Some(cfg.pages_per_device.saturating_mul(HOST_POOL_MULTIPLE)),
        };
        t.copy = self.copy.parse()?;
        t.write = self.write_policy.parse()?;
        t.shape = self.model_shape.parse()?;
        t.host_link.gb_per_s = self.host_gbps;
        t.peer_link.gb_per_s = self.peer_gbps;
        t.load_back_threshold = self.load_back_threshold;
        t.validate()?;
        Ok(())
    }
}

/// Which requests to run, shared by `replay` and `hitrate`: a built-in
/// generator or a trace file, all from `radixkv_tools::trace`.
#[derive(clap::Args, Debug)]
pub struct WorkloadArgs {
    /// The workload: `gsp`, `chat` or `tot` (built-in generators), or a
    /// trace file (Mooncake requests or agentic conversations, JSONL, plain
    /// or zstd-compressed; the first line tells which). Alias: --trace.
    #[arg(long, alias = "trace", default_value = "gsp")]
    pub workload: String,
    /// GSP: groups (system prompts).
    #[arg(long, default_value_t = 64)]
    pub gsp_groups: usize,
    /// GSP: prompts per group.
    #[arg(long, default_value_t = 16)]
    pub gsp_prompts: usize,
    /// GSP: system prompt tokens.
    #[arg(long, default_value_t = 2048)]
    pub gsp_system: usize,
    /// GSP: question tokens.
    #[arg(long, default_value_t = 128)]
    pub gsp_question: usize,
    /// Chat: conversations.
    #[arg(long, default_value_t = 64, value_parser = ranges::count(ranges::CHAT_SIZE))]
    pub chat_conversations: usize,
    /// Chat: turns per conversation.
    #[arg(long, default_value_t = 8, value_parser = ranges::count(ranges::CHAT_SIZE))]
    pub chat_turns: usize,
    /// Chat: system prompt tokens.
    #[arg(long, default_value_t = 1024, value_parser = ranges::count(ranges::CHAT_SIZE))]
    pub chat_system: usize,
    /// Chat: tokens of each user message.
    #[arg(long, default_value_t = 128, value_parser = ranges::count(ranges::CHAT_SIZE))]
    pub chat_user: usize,
    /// Chat: seconds between a conversation's turns (0 to a day).
    #[arg(long, default_value_t = 20.0, value_parser = ranges::seconds)]
    pub chat_think_s: f64,
    /// Output tokens per request (generators; traces bring their own and
    /// use this only where they record none). Chat replies have this many
    /// tokens.
    #[arg(long, default_value_t = 256)]
    pub output_len: usize,
    /// Trace files: only the first N requests.
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Seed of the generators, of Poisson arrivals and of the agentic
    /// conversations' start times.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Agentic traces: mean gap in seconds between the starts of the
    /// merged conversations (a Poisson process).
    #[arg(long, default_value_t = trace::AGENTIC_MEAN_GAP_S)]
    pub gap_s: f64,
}

impl WorkloadArgs {
    /// Whether the gsp sizes and output length are all their defaults.
    pub fn is_default_gsp(&self) -> bool {
        self.workload == "gsp"
            && (
                self.gsp_groups,
                self.gsp_prompts,
                self.gsp_system,
                self.gsp_question,
                self.output_len,
            ) == (64, 16, 2048, 128, 256)
    }

    /// The workload's requests.
    pub fn load(&self) -> Result<Trace, Box<dyn std::error::Error>> {
        if !(self.gap_s.is_finite() && self.gap_s >= 0.0) {
            return Err(
                format!("--gap-s must be a non-negative number, not {}", self.gap_s).into(),
            );
        }
        let t = match self.workload.as_str() {
            "gsp" => trace::gsp(
                self.gsp_groups,
                self.gsp_prompts,
                self.gsp_system,
                self.gsp_question,
                self.output_len,
                self.seed,
            ),
            "chat" => trace::chat(
                &ChatShape {
                    conversations: self.chat_conversations,
                    turns: self.chat_turns,
                    system: self.chat_system,
                    user: self.chat_user,
                    assistant: self.output_len,
                    think_ms: self.chat_think_s * 1e3,
                    ..Default::default()
                },
                self.seed,
            ),
            "tot" => trace::tree_of_thought(
                &TreeShape {
                    output: self.output_len,
                    ..Default::default()
                },
                self.seed,
            ),
            path => trace::read_trace(Path::new(path), self.seed, self.gap_s)?,
        };
        Ok(t)
    }
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json<T: serde::Serialize + ?Sized>(
    path: &PathBuf,
    value: &T,
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::write(path, serde_json::to_string_pretty(value)?)
        .map_err(|e| format!("cannot write {}: {e}", path.display()).into())
}
