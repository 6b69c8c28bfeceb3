//! The conformance runner: replays an op trace on one device with
//! caller-given values and prints one JSON line per op, in the format of
//! SGLang's conformance vectors (`radixkv ops`).
//!
//! Input lines (blank and `#` lines are skipped and not counted):
//!
//! ```text
//! {"op":"insert","key":[..],"extra":null|"s","value":[..],"priority":0}
//! {"op":"match","key":[..],"extra":null|"s"}
//! {"op":"lock","match":K}     pin the end node of the match at op index K
//! {"op":"unlock","match":K}   release one pin taken by a lock naming K
//! {"op":"evict","tokens":N}
//! {"op":"reset"}
//! ```
//!
//! ```
//! use radixkv_tools::conformance::Runner;
//! use radixkv::EvictionPolicy;
//! let mut r = Runner::new(1, EvictionPolicy::Lru).unwrap();
//! let out = r.apply(r#"{"op":"insert","key":[1,2],"value":[5,6]}"#);
//! assert_eq!(out["prefix_len"], 0);
//! let out = r.apply(r#"{"op":"match","key":[1,2,3]}"#);
//! assert_eq!(out["value"], serde_json::json!([5, 6]));
//! let out = r.apply(r#"{"op":"lock","match":7}"#);
//! assert!(out["error"].as_str().unwrap().contains("op 7"));
//! ```

use radixkv::{CacheError, DeviceId, EvictionPolicy, Lease, NodeHandle, RadixCache, TokenKey};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::io::{BufRead, Write};

const DEVICE: DeviceId = DeviceId(0);

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum Op {
    Insert {
        key: Vec<u32>,
        #[serde(default)]
        extra: Option<String>,
        value: Vec<u32>,
        #[serde(default)]
        priority: i64,
    },
    Match {
        key: Vec<u32>,
        #[serde(default)]
        extra: Option<String>,
    },
    Lock {
        #[serde(rename = "match")]
        of: usize,
    },
    Unlock {
        #[serde(rename = "match")]
        of: usize,
    },
    Evict {
        tokens: usize,
    },
    Reset,
}

/// Errors of the runner itself (not of a trace line, which become JSON
/// error lines).
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The cache could not be built with these settings.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// Reading the trace or writing the results failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Replays ops on a single-device [`RadixCache`] with a logical clock.
pub struct Runner {
    page_size: usize,
    policy: EvictionPolicy,
    cache: RadixCache,
    next: usize,
    matches: HashMap<usize, NodeHandle>,
    locks: HashMap<usize, Vec<Lease>>,
}

impl Runner {
    /// A runner over an empty cache.
    pub fn new(page_size: usize, policy: EvictionPolicy) -> Result<Self, CacheError> {
        Ok(Runner {
            page_size,
            policy,
            cache: Self::new_cache(page_size, policy)?,
            next: 0,
            matches: HashMap::new(),
            locks: HashMap::new(),
        })
    }

    fn new_cache(page_size: usize, policy: EvictionPolicy) -> Result<RadixCache, CacheError> {
        RadixCache::builder()
            .page_size(page_size)
            .devices(1)
            .eviction_policy(policy)
            .build()
    }

    /// The cache being driven.
    pub fn cache(&self) -> &RadixCache {
        &self.cache
    }

    /// Applies one op line (which must not be blank or a comment) and
    /// returns its output object.
    pub fn apply(&mut self, line: &str) -> Value {
        let i = self.next;
        self.next += 1;
        let raw: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => return json!({"i": i, "error": format!("invalid JSON: {e}")}),
        };
        let op_name = raw.get("op").and_then(Value::as_str).map(str::to_string);
        let mut out = Map::new();
        out.insert("i".into(), json!(i));
        if let Some(op) = &op_name {
            out.insert("op".into(), json!(op));
        }
        let op: Op = match serde_json::from_value(raw) {
            Ok(op) => op,
            Err(e) => {
                out.insert("error".into(), json!(format!("bad op: {e}")));
                return Value::Object(out);
            }
        };
        match self.run_op(i, op, &mut out) {
            Ok(()) => {
                let s = self.cache.sizes(DEVICE).unwrap_or_default();
                out.insert("evictable".into(), json!(s.evictable));
                out.insert("protected".into(), json!(s.protected));
                out.insert("total".into(), json!(s.total));
                out.insert("nodes".into(), json!(s.nodes));
            }
            Err(e) => {
                out.insert("error".into(), json!(e));
            }
        }
        Value::Object(out)
    }

    fn run_op(&mut self, i: usize, op: Op, out: &mut Map<String, Value>) -> Result<(), String> {
        match op {
            Op::Insert {
                key,
                extra,
                value,
                priority,
            } => {
                let k = TokenKey::new(&key).in_namespace(extra.as_deref());
                let r = self
                    .cache
                    .insert(k, DEVICE, &value, priority)
                    .map_err(|e| e.to_string())?;
                out.insert("prefix_len".into(), json!(r.prefix_len));
            }
            Op::Match { key, extra } => {
                let k = TokenKey::new(&key).in_namespace(extra.as_deref());
                // Pinned only for the moment of reading the values.
                let m = self
                    .cache
                    .match_and_pin(k, DEVICE)
                    .map_err(|e| e.to_string())?;
                out.insert("len".into(), json!(m.len));
                out.insert("value".into(), json!(m.values));
                self.matches.insert(i, m.handle);
            }
            Op::Lock { of } => {
                let h = self
                    .matches
                    .get(&of)
                    .ok_or_else(|| format!("op {of} is not a successful match"))?;
                let lease = self.cache.pin(h).map_err(|e| match e {
                    CacheError::StaleHandle(_) | CacheError::ForeignHandle => {
                        format!("the end node of match {of} has left the tree")
                    }
                    e => e.to_string(),
                })?;
                self.locks.entry(of).or_default().push(lease);
            }
            Op::Unlock { of } => {
                let lease = self
                    .locks
                    .get_mut(&of)
                    .and_then(Vec::pop)
                    .ok_or_else(|| format!("no outstanding lock of match {of}"))?;
                drop(lease);
            }
            Op::Evict { tokens } => {
                let mut ev = self
                    .cache
                    .evict(DEVICE, tokens)
                    .map_err(|e| e.to_string())?;
                ev.values.sort_unstable();
                out.insert("evicted".into(), json!(ev.tokens));
                out.insert("values".into(), json!(ev.values));
            }
            Op::Reset => {
                self.locks.clear();
                self.cache =
                    Self::new_cache(self.page_size, self.policy).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Replays every line of `input`, writing one JSON line per op to `output`.
    pub fn run(&mut self, input: impl BufRead, mut output: impl Write) -> Result<(), RunnerError> {
        for line in input.lines() {
            let line = line?;
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            let v = self.apply(t);
            serde_json::to_writer(&mut output, &v).map_err(std::io::Error::from)?;
            output.write_all(b"\n")?;
        }
        output.flush()?;
        Ok(())
    }
}
