//! `radixkv hitrate`: hit rates of a workload per eviction policy and
//! capacity, with Belady's bound, as a table (and JSON rows).

use crate::args::{TlruArgs, WorkloadArgs};
use crate::CmdResult;
use radixkv::EvictionPolicy;
use radixkv_tools::hitrate::{self, HitRow, PolicySetup};
use std::path::PathBuf;

/// `radixkv hitrate` options.
#[derive(clap::Args, Debug)]
pub struct HitrateArgs {
    /// The requests (`--workload`, alias `--trace`: gsp, chat, tot or a
    /// trace file; the same generators and readers as `replay`).
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Capacities as shares of the workload's distinct tokens (default
    /// 0.1,0.25,0.5; not with --pages).
    #[arg(long, value_delimiter = ',')]
    capacity: Vec<f64>,
    /// Capacities as pool sizes in pages (not with --capacity); rows
    /// report the share pages x page size / distinct tokens.
    #[arg(long, value_delimiter = ',')]
    pages: Vec<usize>,
    /// Eviction policies: lru, lfu, fifo, mru, filo, priority, slru, sieve,
    /// tlru (default: all). Belady's bound is reported at every capacity too.
    #[arg(long, value_delimiter = ',')]
    policy: Vec<String>,
    /// Tlru's budget, and the budget every policy's row is counted
    /// against.
    #[command(flatten)]
    tlru: TlruArgs,
    /// Tokens per page.
    #[arg(long, default_value_t = 16)]
    page_size: usize,
    /// A host tier behind the device, as a positive share of the distinct
    /// tokens (write-back: the device's victims go there; requests load
    /// from it what the device lacks). Belady's rows stay device-only.
    #[arg(long)]
    host_capacity: Option<f64>,
    /// Also write the rows as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Validates the options, evaluates, prints the table.
pub fn run(a: HitrateArgs) -> CmdResult {
    if !a.capacity.is_empty() && !a.pages.is_empty() {
        return Err("give --capacity (shares) or --pages (pool sizes), not both".into());
    }
    if a.pages.contains(&0) {
        return Err("--pages must be at least 1".into());
    }
    if a.page_size == 0 {
        return Err("--page-size must be at least 1".into());
    }
    let policies: Vec<EvictionPolicy> = if a.policy.is_empty() {
        EvictionPolicy::ALL.to_vec()
    } else {
        a.policy
            .iter()
            .map(|p| p.parse())
            .collect::<Result<_, _>>()?
    };
    let tlru = policies.contains(&EvictionPolicy::Tlru);
    let (threshold, estimate) = a.tlru.checked(tlru)?;
    let policies: Vec<PolicySetup> = policies
        .into_iter()
        .map(|p| PolicySetup::from(p).with_tlru(threshold, estimate))
        .collect();
    let mut t = a.workload.load()?;
    if let Some(n) = a.workload.max_requests {
        t.requests.truncate(n);
    }
    let ps = a.page_size;
    let distinct = t.distinct_tokens(ps);
    println!(
        "{} ({} requests, {} input tokens, {distinct} distinct tokens, page size {ps})",
        t.name,
        t.requests.len(),
        t.input_tokens()
    );
    if tlru {
        println!("tlru: threshold {threshold} tokens, next prompt estimate {estimate} tokens");
    }
    println!(
        "over budget: requests that computed more than {threshold} tokens (--tlru-threshold); \
         excess: the tokens past it, as a share of the input"
    );
    let capacity = if a.capacity.is_empty() && a.pages.is_empty() {
        vec![0.1, 0.25, 0.5]
    } else {
        a.capacity
    };
    let rows = match a.host_capacity {
        Some(h) => {
            hitrate::evaluate_with_host(&t, &policies, &capacity, &a.pages, ps, distinct, h)?
        }
        None if a.pages.is_empty() => {
            hitrate::evaluate_sized(&t, &policies, &capacity, ps, distinct)?
        }
        None => hitrate::evaluate_pages(&t, &policies, &a.pages, ps, distinct)?,
    };
    print!("{}", table(&rows));
    if let Some(p) = &a.json {
        crate::args::write_json(p, &rows)?;
    }
    Ok(())
}

/// The rows as a fixed-width table with a header line.
fn table(rows: &[HitRow]) -> String {
    let host = rows.iter().any(|r| r.host_pages > 0);
    let mut s = format!(
        "{:<10} {:>9} {:>12} {:>10} {:>16} {:>12} {:>8}",
        "policy", "capacity", "pages", "hit rate", "evicted tokens", "over budget", "excess"
    );
    if host {
        s += &format!(" {:>9} {:>11} {:>8}", "host cap", "host loads", "reuse");
    }
    s += "\n";
    for r in rows {
        let share = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}%", v * 100.0));
        s += &format!(
            "{:<10} {:>8.1}% {:>12} {:>9.1}% {:>16} {:>12} {:>8}",
            r.policy,
            r.capacity * 100.0,
            r.pages,
            r.hit_rate_tokens * 100.0,
            r.evicted_tokens,
            share(r.over_budget_requests),
            share(r.excess_tokens)
        );
        if host {
            s += &format!(
                " {:>8.1}% {:>10.1}% {:>7.1}%",
                r.host_capacity * 100.0,
                r.host_rate_tokens * 100.0,
                (r.hit_rate_tokens + r.host_rate_tokens) * 100.0
            );
        }
        s += "\n";
    }
    s
}
