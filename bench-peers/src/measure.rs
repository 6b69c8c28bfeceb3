//! Per-operation histograms, figures, and the report (table and JSON).

use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A latency histogram in nanoseconds, 1 ns to 60 s.
pub fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Records the time `f` takes.
#[inline]
pub fn timed<R>(h: &mut Histogram<u64>, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    record(h, t.elapsed());
    r
}

/// Records one latency.
#[inline]
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let _ = h.record((d.as_nanos() as u64).max(1));
}

/// One phase's figures for one implementation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    /// Operations per second (all threads together).
    pub ops_per_s: f64,
    /// Latency percentiles and maximum, ns (NaN-free: 0 when not measured).
    pub p50: u64,
    /// 99th percentile, ns.
    pub p99: u64,
    /// 99.9th percentile, ns.
    pub p999: u64,
    /// Maximum, ns.
    pub max: u64,
    /// Operations over 100 µs.
    pub over_100us: u64,
    /// Whether per-operation latencies were measured.
    pub has_latency: bool,
}

impl Figures {
    /// Figures from a histogram of `ops` operations over `wall`.
    pub fn of(h: &Histogram<u64>, ops: usize, wall: Duration) -> Figures {
        Figures {
            ops_per_s: ops as f64 / wall.as_secs_f64(),
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            over_100us: h.count_between(100_001, u64::MAX),
            has_latency: true,
        }
    }

    /// Throughput only (no per-operation latency).
    pub fn throughput(ops: usize, wall: Duration) -> Figures {
        Figures {
            ops_per_s: ops as f64 / wall.as_secs_f64(),
            ..Figures::default()
        }
    }
}

/// The report: rows printed as they come, figures kept for JSON.
#[derive(Default)]
pub struct Report {
    /// Flat figures (`workload.phase.impl.metric`), for `--json`.
    pub json: BTreeMap<String, f64>,
}

impl Report {
    /// Prints a phase header.
    pub fn header(&self, title: &str) {
        println!("\n== {title}");
        println!(
            "{:<26} {:<24} {:>11} {:>8} {:>8} {:>9} {:>10} {:>8}   ratio radixkv/peer (ops/s; p99)",
            "phase", "impl", "ops/s", "p50 ns", "p99 ns", "p99.9 ns", "max ns", ">100µs"
        );
    }

    /// One phase: radixkv first, then its peers, with ratios.
    pub fn phase(&mut self, wl: &str, phase: &str, rows: &[(&str, Figures)]) {
        // The baseline: radixkv's row, or (the router index's phases)
        // the first.
        let Some((base, ours)) = rows
            .iter()
            .find(|(n, _)| *n == "radixkv")
            .or(rows.first())
            .copied()
        else {
            return;
        };
        for (name, f) in rows {
            let key = format!("{wl}.{phase}.{name}");
            self.json.insert(format!("{key}.ops"), f.ops_per_s);
            if f.has_latency {
                print!(
                    "{:<26} {:<24} {:>11.0} {:>8} {:>8} {:>9} {:>10} {:>8}",
                    phase, name, f.ops_per_s, f.p50, f.p99, f.p999, f.max, f.over_100us
                );
                self.json.insert(format!("{key}.p50_ns"), f.p50 as f64);
                self.json.insert(format!("{key}.p99_ns"), f.p99 as f64);
                self.json.insert(format!("{key}.p999_ns"), f.p999 as f64);
                self.json.insert(format!("{key}.max_ns"), f.max as f64);
                self.json
                    .insert(format!("{key}.over_100us"), f.over_100us as f64);
            } else {
                print!(
                    "{:<26} {:<24} {:>11.0} {:>8} {:>8} {:>9} {:>10} {:>8}",
                    phase, name, f.ops_per_s, "-", "-", "-", "-", "-"
                );
            }
            if *name != base {
                let r = ours.ops_per_s / f.ops_per_s;
                self.json.insert(format!("{wl}.{phase}.ratio_vs_{name}"), r);
                print!("   x{r:.2}");
                if f.has_latency && ours.has_latency {
                    let p = f.p99 as f64 / ours.p99.max(1) as f64;
                    self.json
                        .insert(format!("{wl}.{phase}.p99_ratio_vs_{name}"), p);
                    print!("; p99 x{p:.2}");
                }
            }
            println!();
        }
    }

    /// A single timed action (ms) per implementation, with ratios
    /// (peer time / radixkv time: > 1 means radixkv is faster).
    pub fn timing(&mut self, wl: &str, phase: &str, rows: &[(&str, f64)], note: &str) {
        self.lower_is_better(wl, phase, rows, Some("ms"), note);
    }

    /// A memory figure per implementation (lower is better; ratio peer /
    /// radixkv).
    pub fn memory(&mut self, wl: &str, what: &str, rows: &[(&str, f64)]) {
        self.lower_is_better(wl, what, rows, None, "");
    }

    /// One figure per implementation where less is better: printed with
    /// `unit`, kept as `wl.what.impl[.unit]`, and each peer's ratio
    /// (peer / radixkv) as `wl.what.ratio_vs_impl`.
    fn lower_is_better(
        &mut self,
        wl: &str,
        what: &str,
        rows: &[(&str, f64)],
        unit: Option<&str>,
        note: &str,
    ) {
        let (base, ours) = rows
            .iter()
            .find(|(n, _)| *n == "radixkv")
            .or(rows.first())
            .map_or(("", f64::NAN), |&(n, v)| (n, v));
        for (name, v) in rows {
            print!("{what:<26} {name:<24} {v:>11.2}");
            let key = match unit {
                Some(u) => {
                    print!(" {u}");
                    format!("{wl}.{what}.{name}.{u}")
                }
                None => format!("{wl}.{what}.{name}"),
            };
            self.json.insert(key, *v);
            if *name != base {
                let r = v / ours;
                self.json.insert(format!("{wl}.{what}.ratio_vs_{name}"), r);
                print!("   x{r:.2}");
            }
            if note.is_empty() {
                println!();
            } else {
                println!("   {note}");
            }
        }
    }
}
