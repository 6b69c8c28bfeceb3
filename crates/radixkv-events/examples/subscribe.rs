//! Prints one device's KV events as they arrive, one line per batch:
//! the sequence number, then each event's type.
//!
//! ```text
//! cargo run -p radixkv-events --example subscribe -- tcp://127.0.0.1:5557 [SECONDS]
//! 1764790000123456 AllBlocksCleared
//! 1764790000123457 BlockStored BlockStored
//! ```
//!
//! It stays subscribed across the server's restarts (ZeroMQ reconnects it)
//! and exits after SECONDS (default 60), or when its output is closed.

use radixkv_events::subscriber::KvEventSubscriber;
use std::io::Write;
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().ok_or("usage: subscribe ENDPOINT [SECONDS]")?;
    let seconds: f64 = args.next().map_or(Ok(60.0), |s| s.parse())?;
    let mut sub = KvEventSubscriber::connect(&endpoint, "").await?;
    let deadline =
        tokio::time::Instant::now() + Duration::from_secs_f64(seconds.clamp(0.0, 86_400.0));
    let mut out = std::io::stdout().lock();
    while let Ok(batch) = tokio::time::timeout_at(deadline, sub.recv()).await {
        let b = batch?;
        if writeln!(out, "{} {}", b.seq, b.event_types().join(" "))
            .and_then(|_| out.flush())
            .is_err()
        {
            break;
        }
    }
    Ok(())
}
