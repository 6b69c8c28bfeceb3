//! What the publisher is told: [`KvEventsConfig`] (vLLM's defaults), why it
//! could not start ([`EventsError`]), and the per-device endpoints derived
//! from device 0's (`tcp://HOST:PORT`, device `d` on `PORT + d`).

use crate::wire::Encoding;
use std::time::Duration;

/// What the publisher is told to do; [`KvEventsConfig::new`] fills in
/// vLLM's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventsConfig {
    /// Device 0's PUB endpoint, `tcp://HOST:PORT`; device `d` binds
    /// `PORT + d` (vLLM's convention for data-parallel ranks).
    pub endpoint: String,
    /// Device 0's replay (ROUTER) endpoint, likewise `PORT + d`; none by
    /// default.
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message (default empty, as vLLM's).
    pub topic: String,
    /// How events are encoded (default [`Encoding::Map`]).
    pub encoding: Encoding,
    /// Batches kept per device for replays (default 10,000, as vLLM); kept
    /// only with a replay endpoint.
    pub replay_buffer: usize,
    /// Bytes of payload kept per device for replays, at most (default
    /// 64 MiB): the oldest batches go first when either bound is reached,
    /// so a burst of large batches cannot hold gigabytes.
    pub replay_bytes: usize,
    /// Events queued per device before new ones are dropped and counted
    /// (default 100,000; the PUB socket's own high-water mark is 100,000
    /// messages per subscriber, beyond which it drops as libzmq does).
    pub max_pending: usize,
    /// How long a batch waits for more events after its first (default
    /// 1 ms): the bound on batching's share of an event's latency.
    pub max_delay: Duration,
    /// Keep an index from every published block id to its page (parent id,
    /// tokens, namespace) while some tier holds it, for
    /// [`KvEventPublisher::resolve`] (`/query_by_hash`); about 60 bytes
    /// plus 4 per token per block (default off).
    ///
    /// [`KvEventPublisher::resolve`]: super::handle::KvEventPublisher::resolve
    pub index_blocks: bool,
    /// How long after the start the first changes wait (default 1 s) while
    /// the socket repeats `AllBlocksCleared` every 100 ms: a subscriber
    /// that stayed connected across a restart reconnects only after its
    /// reconnect interval (libzmq's default: 100 ms) and would otherwise
    /// miss the clearing and see the new run's first stores with the old
    /// run's state. Changes are queued meanwhile, none lost; zero sends
    /// the first change at once.
    pub startup_hold: Duration,
}

impl KvEventsConfig {
    /// A configuration publishing on `endpoint` with every other setting
    /// at its default.
    pub fn new(endpoint: impl Into<String>) -> Self {
        KvEventsConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            encoding: Encoding::Map,
            replay_buffer: 10_000,
            replay_bytes: 64 << 20,
            max_pending: 100_000,
            max_delay: Duration::from_millis(1),
            index_blocks: false,
            startup_hold: Duration::from_secs(1),
        }
    }
}

/// Why the publisher could not start.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// The endpoint is not `tcp://HOST:PORT`, or a device's port is past 65,535.
    #[error("bad KV-events endpoint {endpoint:?}: {why}")]
    Endpoint {
        /// What was given.
        endpoint: String,
        /// What is wrong with it.
        why: String,
    },
    /// A socket could not bind (the port is in use, the host is not local…).
    #[error("cannot bind the KV-events socket {endpoint}: {source}")]
    Bind {
        /// The endpoint of the device's socket.
        endpoint: String,
        /// ZeroMQ's error.
        source: zeromq::ZmqError,
    },
    /// Publishing for no device.
    #[error("the KV-event publisher needs at least one device")]
    NoDevices,
}

/// `tcp://HOST:PORT` → (HOST, PORT).
fn parse_endpoint(endpoint: &str) -> Result<(String, u16), EventsError> {
    let bad = |why: &str| EventsError::Endpoint {
        endpoint: endpoint.to_owned(),
        why: why.to_owned(),
    };
    let rest = endpoint
        .strip_prefix("tcp://")
        .ok_or_else(|| bad("only tcp://HOST:PORT is supported"))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| bad("no :PORT after the host"))?;
    if host.is_empty() {
        return Err(bad("no host (use tcp://0.0.0.0:PORT to listen everywhere)"));
    }
    let host = if host == "*" { "0.0.0.0" } else { host };
    let port: u16 = port
        .parse()
        .map_err(|_| bad("the port is not a number in 1..=65535"))?;
    if port == 0 {
        return Err(bad("port 0: give a fixed port, subscribers must know it"));
    }
    Ok((host.to_owned(), port))
}

/// The endpoints of `devices` devices from device 0's.
pub fn device_endpoints(endpoint: &str, devices: usize) -> Result<Vec<String>, EventsError> {
    let (host, port) = parse_endpoint(endpoint)?;
    (0..devices)
        .map(|d| {
            let p = u32::from(port) + d as u32;
            if p > 65_535 {
                return Err(EventsError::Endpoint {
                    endpoint: endpoint.to_owned(),
                    why: format!("device {d} would need port {p}"),
                });
            }
            Ok(format!("tcp://{host}:{p}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_step_by_device() {
        assert_eq!(
            device_endpoints("tcp://127.0.0.1:5557", 2).unwrap(),
            ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"]
        );
        assert_eq!(
            device_endpoints("tcp://*:5557", 1).unwrap(),
            ["tcp://0.0.0.0:5557"]
        );
        for bad in [
            "127.0.0.1:5557",
            "tcp://127.0.0.1",
            "tcp://:5557",
            "tcp://h:port",
            "tcp://h:0",
            "ipc:///tmp/x",
        ] {
            assert!(
                matches!(device_endpoints(bad, 1), Err(EventsError::Endpoint { .. })),
                "{bad}"
            );
        }
        let e = device_endpoints("tcp://h:65535", 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("device 1 would need port 65536"), "{e}");
    }
}
