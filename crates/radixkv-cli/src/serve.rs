//! `radixkv serve`: the engine behind the HTTP front end.

use crate::args::EngineArgs;
use crate::ranges;
use crate::CmdResult;
use std::io;
use std::time::Duration;

/// `radixkv serve` options.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port (0: an ephemeral port, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    #[command(flatten)]
    engine: EngineArgs,
    /// Model backend: `sim` or `simulated` (the cost-model simulator),
    /// `tiny` (the tiny candle transformer on the CPU, K/V in host pools)
    /// or `gguf:PATH` (a GGUF llama such as SmolLM2-135M-Instruct, whose
    /// path scripts/fetch-smollm2.sh prints: real text through its own
    /// tokenizer and chat template, computed on the CPU, K/V in f32 host
    /// pools). Pools default to 16,384 pages per device, or 4,096 tokens'
    /// worth with `tiny` and 8,192 with `gguf:PATH` (46 KB a token for
    /// SmolLM2-135M: 2 devices and the host tier take 2.3 GB); the real
    /// models run on 2 devices by default.
    #[arg(long, default_value = "sim")]
    model: crate::model::ModelArg,
    /// Model time per wall time of the simulated GPUs (`--model sim`;
    /// 0.001 to 10⁹).
    #[arg(long, default_value_t = 50.0, value_parser = ranges::speedup)]
    speedup: f64,
    /// Requests admitted at once (queued, running or streaming; 1 to
    /// 1,048,576); more are answered 429 with Retry-After.
    #[arg(long, default_value_t = 256, value_parser = ranges::count(1..=1 << 20))]
    max_queue: usize,
    /// Largest max_tokens (or chat max_completion_tokens) a request may ask
    /// for (1 to 16,777,216; larger requests: 400).
    #[arg(long, default_value_t = 4096, value_parser = ranges::count(1..=1 << 24))]
    max_tokens_limit: usize,
    /// Largest request body in bytes (1 to 1 GiB; larger: 413, at once when
    /// Content-Length says so).
    #[arg(long, default_value_t = 4 << 20, value_parser = ranges::count(1..=1 << 30))]
    max_body_bytes: usize,
    /// Seconds a client may take to send a request head (0.001 to 86,400):
    /// then its connection closes.
    #[arg(long, default_value_t = 10.0, value_parser = ranges::timeout)]
    header_read_timeout_s: f64,
    /// Seconds a client may take to send a request body once its head is
    /// in (0.001 to 86,400): then 408 and the connection closes.
    #[arg(long, default_value_t = 30.0, value_parser = ranges::timeout)]
    body_read_timeout_s: f64,
    /// Seconds a connection may stay open with no request (0.001 to
    /// 86,400; the header-read timeout also bounds that wait, so the
    /// smaller of the two applies).
    #[arg(long, default_value_t = 60.0, value_parser = ranges::timeout)]
    idle_timeout_s: f64,
    /// Connections open at once (1 to 1,048,576), kept below the open-file
    /// limit (raised to the hard limit at start) less 64. A connection
    /// beyond it closes the oldest one with no request being answered, so
    /// held connections never lock out new clients; with every one
    /// answering, it takes one of 4 health slots, which answer /health and
    /// /metrics only.
    #[arg(long, default_value_t = 4096, value_parser = ranges::count(1..=1 << 20))]
    max_connections: usize,
    /// Seconds a response may wait for its client to read (0.001 to
    /// 86,400; nginx's `send_timeout`): then its connection closes and its
    /// request is cancelled, its admission slot and pages released.
    #[arg(long, default_value_t = 60.0, value_parser = ranges::timeout)]
    send_timeout_s: f64,
    /// Seconds a shutdown waits for in-flight requests before stopping them
    /// (0 to 86,400).
    #[arg(long, default_value_t = 30.0, value_parser = ranges::seconds)]
    drain_timeout_s: f64,
    /// Require `Authorization: Bearer KEY` on /v1/*, /query* and /admin/*
    /// (OpenAI's API-key header; 401 otherwise); /health, /metrics and
    /// /stats stay open. Also read from RADIXKV_API_KEY; an empty key
    /// requires nothing.
    #[arg(long, env = "RADIXKV_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The model name served: /v1/models, and the `model` of responses to
    /// requests that give none. Default: radixkv-<model>.
    #[arg(long)]
    served_model_name: Option<String>,
    /// Background eviction (`LOW,HIGH`, free pages, LOW < HIGH <
    /// --pages-per-device): a thread evicts until HIGH pages are free on
    /// every device and on the host tier, woken at once when an allocation
    /// leaves fewer than LOW free and checking every 20 ms otherwise
    /// (changeable at run time through POST /admin/config). Default: evict
    /// only when an allocation needs it.
    #[arg(long, value_name = "LOW,HIGH", value_parser = parse_watermarks)]
    watermarks: Option<(usize, usize)>,
    /// Accept /admin/* from any address (default: loopback clients only).
    #[arg(long)]
    admin_from_anywhere: bool,
    #[command(flatten)]
    kv_events: crate::kv_events::KvEventArgs,
}

/// Starts the engine and the server; returns after a drained shutdown.
pub fn run(a: ServeArgs) -> CmdResult {
    use crate::model::ModelArg;
    use radixkv_engine::sched::batch::ModelBackend;
    use radixkv_engine::simulator::{CostModel, SimulatedBackend};
    use radixkv_engine::{Engine, EngineConfig};
    use radixkv_server::{shutdown_signals, Server, ServerConfig};
    let e = &a.engine;
    let ps = e.page_size.max(1);
    let pages_per_device = e.pages_per_device.unwrap_or(match a.model {
        ModelArg::Simulated => 16_384,
        ModelArg::Tiny => 4096 / ps + 1,
        ModelArg::Gguf(_) => 8192 / ps + 1,
    });
    let mut cfg = EngineConfig {
        pages_per_device,
        ..EngineConfig::default()
    };
    e.apply(&mut cfg, a.model.is_real())?;
    e.apply_tiers(&mut cfg)?;
    cfg.watermarks = a.watermarks;
    #[cfg_attr(not(feature = "gguf"), allow(unused_mut))]
    let mut codec: Option<std::sync::Arc<dyn radixkv_server::codec::TextCodec>> = None;
    let backend: std::sync::Arc<dyn ModelBackend> = match &a.model {
        ModelArg::Simulated => std::sync::Arc::new(
            SimulatedBackend::new(CostModel::default(), a.speedup)
                .with_layers(cfg.tiers.shape.layers),
        ),
        #[cfg(feature = "candle")]
        ModelArg::Tiny => {
            use radixkv_models::backend::PoolConfig;
            use radixkv_models::tiny::{TinyBackend, TinyConfig, TinyModel};
            let model = TinyModel::new(TinyConfig::default())?;
            std::sync::Arc::new(TinyBackend::new(model, PoolConfig::for_engine(&cfg))?)
        }
        #[cfg(not(feature = "candle"))]
        ModelArg::Tiny => return Err(crate::model::NO_CANDLE.into()),
        #[cfg(feature = "gguf")]
        ModelArg::Gguf(path) => {
            use radixkv_models::backend::PoolConfig;
            use radixkv_models::gguf::{GgufBackend, GgufFile};
            let file = GgufFile::open(path)?;
            codec = Some(std::sync::Arc::new(radixkv_server::codec::GgufCodec::new(
                &file,
            )?));
            std::sync::Arc::new(GgufBackend::new(
                file.llama()?,
                PoolConfig::for_engine(&cfg),
            )?)
        }
        #[cfg(not(feature = "gguf"))]
        ModelArg::Gguf(_) => return Err(crate::model::NO_GGUF.into()),
    };
    let scfg = ServerConfig {
        max_queue: a.max_queue,
        max_tokens_limit: a.max_tokens_limit,
        max_body_bytes: a.max_body_bytes,
        drain_timeout: Duration::from_secs_f64(a.drain_timeout_s),
        model_name: a
            .served_model_name
            .clone()
            .unwrap_or_else(|| format!("radixkv-{}", a.model.name())),
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        admin_from_anywhere: a.admin_from_anywhere,
        connections: radixkv_server::ConnectionLimits {
            header_read_timeout: Duration::from_secs_f64(a.header_read_timeout_s),
            body_read_timeout: Duration::from_secs_f64(a.body_read_timeout_s),
            idle_timeout: Duration::from_secs_f64(a.idle_timeout_s),
            max_connections: a.max_connections,
            send_timeout: Duration::from_secs_f64(a.send_timeout_s),
        },
        ..ServerConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("radixkv-http")
        .build()?;
    // The server answers /query_by_hash from the publisher's block index.
    let publisher = rt.block_on(crate::kv_events::start(&a.kv_events, &mut cfg, true))?;
    let engine = Engine::start(cfg, backend)?;
    let report = rt.block_on(async move {
        let mut server =
            Server::bind(std::net::SocketAddr::new(a.host, a.port), engine, scfg).await?;
        if let Some(p) = &publisher {
            server = server.with_kv_events(std::sync::Arc::clone(p));
        }
        if let Some(c) = codec {
            server = server.with_codec(c);
        }
        // Installed before the address is printed: a client may signal as
        // soon as it reads it. The first SIGINT/SIGTERM drains; a second
        // stops what is left at once, however soon after the first.
        let (shutdown, force) = shutdown_signals();
        server = server.with_force_stop(force);
        let addr = server.local_addr()?;
        {
            use std::io::Write as _;
            let mut out = io::stdout().lock();
            writeln!(out, "radixkv serve: listening on http://{addr}")?;
            out.flush()?;
        }
        let report = server.run(shutdown).await?;
        // The engine's caches are gone: their clearing (AllBlocksCleared)
        // reaches subscribers before the sockets close, so a router drops
        // this host's blocks now rather than at the next start.
        if let Some(p) = &publisher {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), p.flush()).await;
        }
        Ok::<_, Box<dyn std::error::Error>>(report)
    })?;
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    if report.drained {
        eprintln!("radixkv serve: shut down, all in-flight requests finished");
    } else {
        eprintln!(
            "radixkv serve: shut down, drain timed out; {} requests stopped",
            report.abandoned
        );
    }
    Ok(())
}

/// `LOW,HIGH`: two page counts (their order is checked with the pool size,
/// when the cache is built).
fn parse_watermarks(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("expected LOW,HIGH (two page counts, e.g. 256,1024), not `{s}`");
    let (low, high) = s.split_once(',').ok_or_else(bad)?;
    let num = |v: &str| v.trim().parse::<usize>().map_err(|_| bad());
    Ok((num(low)?, num(high)?))
}

#[cfg(test)]
mod tests {
    use super::parse_watermarks;

    #[test]
    fn watermarks_are_two_page_counts() {
        assert_eq!(parse_watermarks("16,64"), Ok((16, 64)));
        assert_eq!(parse_watermarks(" 16, 64"), Ok((16, 64)));
        for bad in ["16", "16,64,128", "a,b", "16,", ",64", "-1,4", ""] {
            let e = parse_watermarks(bad).unwrap_err();
            assert!(e.contains("LOW,HIGH"), "{bad}: {e}");
        }
    }
}
