//! `radixkv stress`: the torture run.

use crate::CmdResult;
use std::path::PathBuf;

/// `radixkv stress` options.
#[derive(clap::Args, Debug)]
pub struct StressArgs {
    /// Devices.
    #[arg(long, default_value_t = 4)]
    devices: usize,
    /// Pages per device (page 0 reserved).
    #[arg(long, default_value_t = 4096)]
    pages: usize,
    /// Tokens per page.
    #[arg(long, default_value_t = 16)]
    page_size: usize,
    /// Scheduler threads (0 is taken as 1).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Duration in seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// PRNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Runs the torture run, prints its report, fails unless it found nothing.
pub fn run(a: StressArgs) -> CmdResult {
    if !(a.seconds.is_finite() && a.seconds >= 0.0) {
        return Err(format!("--seconds must be a non-negative number, not {}", a.seconds).into());
    }
    let cfg = radixkv_tools::torture::TortureConfig {
        devices: a.devices,
        pages: a.pages,
        page_size: a.page_size,
        threads: a.threads.max(1),
        duration: std::time::Duration::from_secs_f64(a.seconds),
        seed: a.seed,
    };
    let report = radixkv_tools::torture::run(&cfg)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(p) = &a.json {
        crate::args::write_json(p, &report)?;
    }
    if !report.ok() {
        return Err("torture run found a problem (see the report)".into());
    }
    Ok(())
}
