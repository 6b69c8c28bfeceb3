//! # radixkv-events
//!
//! radixkv's cache as cross-host KV routers see it: every page that becomes
//! resident on a device or the host tier, or leaves it, published as a KV
//! event in vLLM's wire format over ZeroMQ, which NVIDIA Dynamo's KV router
//! (and its standalone indexer), llm-d's KV-cache indexer and Mooncake's
//! conductor subscribe to.
//!
//! * [`wire`]: the msgpack payload (map or array events), chained 63-bit
//!   block ids, namespaces as `cache_salt` / `lora_name`;
//! * [`publisher`]: [`KvEventPublisher`], a
//!   [`CacheListener`](radixkv::events::CacheListener) plus one PUB socket
//!   per device (device 0 on the given port, device `d` on port + `d`),
//!   three frames per batch (topic, 8-byte big-endian sequence number,
//!   payload), and an optional ROUTER socket per device for replays;
//! * [`subscriber`]: the consumer's side (SUB, replay request, merging a
//!   late join with a replay), for tools and tests;
//! * `testing` (cargo feature `testing`): a publisher a test drives frame
//!   by frame.
//!
//! ZeroMQ is the `zeromq` crate (pure Rust, ZMTP 3), which speaks to libzmq
//! peers (pyzmq, the `zmq` crate): `scripts/python-check.sh` subscribes to a
//! running `radixkv serve` with pyzmq.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use radixkv::RadixCache;
//! use radixkv_events::{KvEventPublisher, KvEventsConfig};
//! let publisher =
//!     KvEventPublisher::start(KvEventsConfig::new("tcp://127.0.0.1:5557"), 2, 16).await?;
//! let cache = RadixCache::builder()
//!     .devices(2)
//!     .page_size(16)
//!     .listener(publisher.listener())
//!     .build()?;
//! // ... inserts and evictions are published on ports 5557 and 5558.
//! # drop(cache); Ok(()) }
//! ```

pub mod publisher;
pub mod subscriber;
#[cfg(feature = "testing")]
pub mod testing;
pub mod wire;

pub use publisher::{EventSink, EventsError, KvEventPublisher, KvEventsConfig, SocketStats};
pub use wire::{Encoding, KvEvent, Medium};
