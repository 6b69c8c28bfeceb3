//! Tiers in the engine: the host tier's size, which copies a scheduler may
//! make (`--copy`), when prompts are written to the host (`--write-policy`),
//! and the cost model that decides, per request, whether loading a prefix
//! from the host or copying it from another device beats recomputing it.
//!
//! The cost of moving `n` tokens' KV over a link is `latency + n ·
//! bytes_per_token / bandwidth`, with `bytes_per_token = layers · 2 (K and
//! V) · kv_heads · head_dim · dtype bytes` from a [`ModelShape`]
//! (Llama-3-8B: 32 · 2 · 8 · 128 · 2 = 128 KiB). A copy is made when the
//! source holds at least `load_back_threshold` tokens more than the device
//! and moving them costs less than computing them (the backend's estimate,
//! [`ModelBackend::prefill_estimate`](crate::sched::batch::ModelBackend::prefill_estimate);
//! a backend without one copies whenever the threshold is met).
//!
//! In the simulator a pass that waits for copies overlaps them with its
//! compute layer by layer (as SGLang's HiCache loads layer `i + 1` while
//! layer `i` runs): the pass takes `max(compute, copy) + min(compute,
//! copy) / layers` (`SimulatedBackend`). Writes to the host (write-through
//! after a prompt is cached, write-back before an eviction) run on the
//! copy engine beside the passes and are counted, not charged to a pass.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A model's KV shape: what one token's KV costs to store and move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// Transformer layers.
    pub layers: u32,
    /// KV heads per layer (grouped-query attention: fewer than query heads).
    pub kv_heads: u32,
    /// Dimension of one head.
    pub head_dim: u32,
    /// Bytes per element (2 for bf16/fp16, 1 for fp8).
    pub dtype_bytes: u32,
}

impl ModelShape {
    /// Llama-3-8B (and 3.1-8B): 32 layers, 8 KV heads of 128, bf16.
    pub const LLAMA3_8B: ModelShape = ModelShape {
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        dtype_bytes: 2,
    };
    /// Llama-3-70B: 80 layers, 8 KV heads of 128, bf16.
    pub const LLAMA3_70B: ModelShape = ModelShape {
        layers: 80,
        kv_heads: 8,
        head_dim: 128,
        dtype_bytes: 2,
    };
    /// Qwen2.5-7B: 28 layers, 4 KV heads of 128, bf16.
    pub const QWEN25_7B: ModelShape = ModelShape {
        layers: 28,
        kv_heads: 4,
        head_dim: 128,
        dtype_bytes: 2,
    };
    /// The named shapes [`FromStr`] knows.
    pub const PRESETS: [(&'static str, ModelShape); 3] = [
        ("llama3-8b", ModelShape::LLAMA3_8B),
        ("llama3-70b", ModelShape::LLAMA3_70B),
        ("qwen2.5-7b", ModelShape::QWEN25_7B),
    ];

    /// Bytes of one token's KV (K and V of every layer).
    ///
    /// ```
    /// use radixkv_engine::tiers::ModelShape;
    /// assert_eq!(ModelShape::LLAMA3_8B.bytes_per_token(), 128 * 1024);
    /// assert_eq!(ModelShape::LLAMA3_70B.bytes_per_token(), 320 * 1024);
    /// ```
    pub fn bytes_per_token(&self) -> u64 {
        u64::from(self.layers)
            * 2
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }

    fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("layers", self.layers),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("dtype bytes", self.dtype_bytes),
        ] {
            if v == 0 {
                return Err(format!("a model shape with zero {name}"));
            }
        }
        Ok(())
    }
}

impl Default for ModelShape {
    fn default() -> Self {
        ModelShape::LLAMA3_8B
    }
}

impl FromStr for ModelShape {
    type Err = String;

    /// A preset (`llama3-8b`, `llama3-70b`, `qwen2.5-7b`) or an explicit
    /// `layers=32,kv-heads=8,head-dim=128,dtype=bf16` (dtype `bf16`,
    /// `fp16`, `fp8`, `fp32` or a byte count).
    ///
    /// ```
    /// use radixkv_engine::tiers::ModelShape;
    /// let s: ModelShape = "layers=4,kv-heads=2,head-dim=64,dtype=fp8".parse().unwrap();
    /// assert_eq!(s.bytes_per_token(), 4 * 2 * 2 * 64);
    /// assert!("layers=0,kv-heads=2,head-dim=64,dtype=fp8".parse::<ModelShape>().is_err());
    /// assert_eq!("llama3-70b".parse::<ModelShape>().unwrap(), ModelShape::LLAMA3_70B);
    /// ```
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some((_, shape)) = ModelShape::PRESETS.iter().find(|(n, _)| *n == s) {
            return Ok(*shape);
        }
        if !s.contains('=') {
            let names: Vec<&str> = ModelShape::PRESETS.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "unknown model shape {s:?}: one of {} or layers=…,kv-heads=…,head-dim=…,dtype=…",
                names.join(", ")
            ));
        }
        let mut shape = ModelShape {
            layers: 0,
            kv_heads: 0,
            head_dim: 0,
            dtype_bytes: 2,
        };
        for part in s.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("model shape: {part:?} is not key=value"))?;
            let num = || {
                v.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("model shape: {k} must be a whole number, not {v:?}"))
            };
            match k.trim().replace('_', "-").as_str() {
                "layers" => shape.layers = num()?,
                "kv-heads" => shape.kv_heads = num()?,
                "head-dim" => shape.head_dim = num()?,
                "dtype" => {
                    shape.dtype_bytes = match v.trim() {
                        "bf16" | "fp16" | "f16" => 2,
                        "fp8" | "f8" => 1,
                        "fp32" | "f32" => 4,
                        _ => num()?,
                    }
                }
                other => return Err(format!("model shape: unknown key {other:?}")),
            }
        }
        shape.validate()?;
        Ok(shape)
    }
}

/// One direction of a link between tiers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Bandwidth in GB/s (10⁹ bytes per second).
    pub gb_per_s: f64,
    /// Fixed latency of one copy (setup, synchronisation).
    pub latency: Duration,
}

impl Link {
    /// Host ↔ GPU over PCIe 5 x16: about 50 GB/s per direction in practice.
    pub const PCIE5: Link = Link {
        gb_per_s: 50.0,
        latency: Duration::from_micros(10),
    };
    /// GPU ↔ GPU over NVLink 4 (H100/H200): about 450 GB/s per direction.
    pub const NVLINK4: Link = Link {
        gb_per_s: 450.0,
        latency: Duration::from_micros(5),
    };

    /// Time to move `bytes` in one copy.
    ///
    /// ```
    /// use radixkv_engine::tiers::Link;
    /// // 1,000 tokens of Llama-3-8B (131 MB) over PCIe 5: about 2.6 ms.
    /// let t = Link::PCIE5.time(1000 * 128 * 1024);
    /// assert!(t.as_micros() > 2_500 && t.as_micros() < 2_800);
    /// ```
    pub fn time(&self, bytes: u64) -> Duration {
        let secs = bytes as f64 / (self.gb_per_s * 1e9);
        self.latency
            .saturating_add(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
    }

    fn validate(&self, name: &str) -> Result<(), String> {
        if !(self.gb_per_s.is_finite() && (1e-3..=1e6).contains(&self.gb_per_s)) {
            return Err(format!(
                "{name} bandwidth must be between 0.001 and 1e6 GB/s, not {}",
                self.gb_per_s
            ));
        }
        Ok(())
    }
}

/// Which copies a scheduler may make instead of recomputing (`--copy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CopyPolicy {
    /// None: a prefix is only reused on the device that holds it.
    None,
    /// Loads from the host tier only.
    Host,
    /// Copies from another device only.
    Peer,
    /// Both (the default).
    #[default]
    All,
}

impl CopyPolicy {
    /// Whether loads from the host tier are allowed.
    pub fn host(self) -> bool {
        matches!(self, CopyPolicy::Host | CopyPolicy::All)
    }

    /// Whether copies from another device are allowed.
    pub fn peer(self) -> bool {
        matches!(self, CopyPolicy::Peer | CopyPolicy::All)
    }

    /// Every policy, in the order the flag's help lists them.
    pub const ALL: [CopyPolicy; 4] = [
        CopyPolicy::None,
        CopyPolicy::Host,
        CopyPolicy::Peer,
        CopyPolicy::All,
    ];

    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            CopyPolicy::None => "none",
            CopyPolicy::Host => "host",
            CopyPolicy::Peer => "peer",
            CopyPolicy::All => "all",
        }
    }
}

impl FromStr for CopyPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        CopyPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown copy policy {s:?} ({})",
                    CopyPolicy::ALL.map(CopyPolicy::name).join(", ")
                )
            })
    }
}

impl fmt::Display for CopyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// When prompts are written to the host tier (SGLang HiCache's three).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WritePolicy {
    /// Every prompt, once it is cached on its device.
    WriteThrough,
    /// A prompt whose cached prefix has been hit at least
    /// [`TierConfig::selective_hits`] times (SGLang: 2), as the cache
    /// counts hits ([`MatchResult::hits`](radixkv::MatchResult::hits)):
    /// every match that ends on or passes the prefix's node, the `lpm`
    /// queue policy's own matches included. The reused prefix is written.
    WriteThroughSelective,
    /// Nothing until an eviction: a device's victims are written to the
    /// host before they are evicted (the default: it writes only what a
    /// device is about to lose, see BENCHMARKS.md).
    #[default]
    WriteBack,
}

impl WritePolicy {
    /// Every policy, in the order the flag's help lists them.
    pub const ALL: [WritePolicy; 3] = [
        WritePolicy::WriteThrough,
        WritePolicy::WriteThroughSelective,
        WritePolicy::WriteBack,
    ];

    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            WritePolicy::WriteThrough => "write-through",
            WritePolicy::WriteThroughSelective => "write-through-selective",
            WritePolicy::WriteBack => "write-back",
        }
    }
}

impl FromStr for WritePolicy {
    type Err = String;
    /// A name as [`name`](Self::name) spells it, `_` for `-` accepted.
    fn from_str(s: &str) -> Result<Self, String> {
        let dashed = s.replace('_', "-");
        WritePolicy::ALL
            .into_iter()
            .find(|p| p.name() == dashed)
            .ok_or_else(|| {
                format!(
                    "unknown write policy {s:?} ({})",
                    WritePolicy::ALL.map(WritePolicy::name).join(", ")
                )
            })
    }
}

impl fmt::Display for WritePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The engine's tier settings ([`EngineConfig::tiers`](crate::EngineConfig::tiers)).
#[derive(Clone, Debug, PartialEq)]
pub struct TierConfig {
    /// Pages of the host tier shared by all devices (`None`: no host tier;
    /// with private trees each device's tree gets an equal share).
    pub host_pages: Option<usize>,
    /// Which copies are made (default all).
    pub copy: CopyPolicy,
    /// When prompts go to the host (default write-back).
    pub write: WritePolicy,
    /// The hit count at which write-through-selective writes (default 2).
    pub selective_hits: u64,
    /// The model's KV shape (default Llama-3-8B).
    pub shape: ModelShape,
    /// Host ↔ device link (default PCIe 5).
    pub host_link: Link,
    /// Device ↔ device link (default NVLink 4).
    pub peer_link: Link,
    /// Fewer extra tokens than this are recomputed, never copied (default
    /// 16, one page at the default page size; SGLang's load-back threshold
    /// is 10 tokens).
    pub load_back_threshold: usize,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            host_pages: None,
            copy: CopyPolicy::All,
            write: WritePolicy::WriteBack,
            selective_hits: 2,
            shape: ModelShape::LLAMA3_8B,
            host_link: Link::PCIE5,
            peer_link: Link::NVLINK4,
            load_back_threshold: 16,
        }
    }
}

/// Where a copy comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopySource {
    /// The host tier.
    Host,
    /// Another device.
    Peer(radixkv::device::DeviceId),
}

impl CopySource {
    /// The tier the copy reads.
    pub fn tier(self) -> radixkv::Tier {
        match self {
            CopySource::Host => radixkv::Tier::Host,
            CopySource::Peer(d) => radixkv::Tier::Device(d),
        }
    }
}

impl TierConfig {
    /// Checks the settings: a host tier of at least one page (plus the
    /// reserved page 0), a model shape without zeros, positive bandwidths.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(h) = self.host_pages {
            if h < 2 {
                return Err(format!(
                    "a host tier of {h} pages holds no page (page 0 is reserved): give it at least 2"
                ));
            }
        }
        if self.copy == CopyPolicy::Host && self.host_pages.is_none() {
            return Err("--copy host needs a host tier (--host-pages)".into());
        }
        self.shape.validate()?;
        self.host_link.validate("host link")?;
        self.peer_link.validate("peer link")?;
        Ok(())
    }

    /// Bytes of `tokens` tokens' KV.
    pub fn bytes(&self, tokens: usize) -> u64 {
        tokens as u64 * self.shape.bytes_per_token()
    }

    /// Time to copy `tokens` tokens' KV from `source`.
    pub fn copy_time(&self, source: CopySource, tokens: usize) -> Duration {
        let link = match source {
            CopySource::Host => &self.host_link,
            CopySource::Peer(_) => &self.peer_link,
        };
        link.time(self.bytes(tokens))
    }

    /// Whether to copy `tokens` more tokens from `source` rather than
    /// compute them, given the time computing them would take (`None`:
    /// unknown, copy whenever the threshold is met).
    ///
    /// ```
    /// use radixkv_engine::tiers::{CopySource, TierConfig};
    /// use std::time::Duration;
    /// let t = TierConfig::default();
    /// // 2,048 tokens: 268 MB, 5.4 ms over PCIe 5, against 100 ms of prefill.
    /// assert!(t.worth_copying(CopySource::Host, 2048, Some(Duration::from_millis(100))));
    /// // Below the threshold, or slower than computing: recompute.
    /// assert!(!t.worth_copying(CopySource::Host, 8, None));
    /// assert!(!t.worth_copying(CopySource::Host, 2048, Some(Duration::from_millis(1))));
    /// ```
    pub fn worth_copying(
        &self,
        source: CopySource,
        tokens: usize,
        recompute: Option<Duration>,
    ) -> bool {
        if tokens == 0 || tokens < self.load_back_threshold {
            return false;
        }
        match recompute {
            Some(r) => self.copy_time(source, tokens) < r,
            None => true,
        }
    }
}
