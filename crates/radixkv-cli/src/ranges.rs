//! The ranges of numeric flags, checked as clap parses them: a value out
//! of range is a usage error that names the flag (clap adds it) and the
//! range, never a panic or an overflow further in.

use clap::builder::RangedU64ValueParser;

/// Devices of one engine.
pub const DEVICES: std::ops::RangeInclusive<u64> = 1..=1024;
/// Tokens per page.
pub const PAGE_SIZE: std::ops::RangeInclusive<u64> = 1..=65_536;
/// Pages of one pool: page ids are `u32`, page 0 reserved.
pub const POOL_PAGES: std::ops::RangeInclusive<u64> = 2..=u32::MAX as u64;

/// Conversations, turns and tokens of a generated chat workload.
pub const CHAT_SIZE: std::ops::RangeInclusive<u64> = 1..=65_536;

/// A `usize` flag within `range`.
pub fn count(range: std::ops::RangeInclusive<u64>) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(range)
}

/// A real number, finite, within `lo..=hi`.
fn real(s: &str, lo: f64, hi: f64, what: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{what} must be between {lo} and {hi}, not {s}"))
    }
}

/// Model time per wall time of simulated GPUs: 0.001 (a thousand times
/// slower than real) to 10⁹.
pub fn speedup(s: &str) -> Result<f64, String> {
    real(s, 1e-3, 1e9, "the speedup")
}

/// A timeout or a wait in seconds: 0 to a day.
pub fn seconds(s: &str) -> Result<f64, String> {
    real(s, 0.0, 86_400.0, "seconds")
}

/// A timeout in seconds that is at least a millisecond (0 would close
/// every connection at once), at most a day.
pub fn timeout(s: &str) -> Result<f64, String> {
    real(s, 1e-3, 86_400.0, "a timeout in seconds")
}

/// A link's bandwidth in GB/s: 0.001 (1 MB/s) to 10⁶.
pub fn gb_per_s(s: &str) -> Result<f64, String> {
    real(s, 1e-3, 1e6, "a bandwidth in GB/s")
}

/// Pages of the host tier: 0 (none) or a pool's size.
pub fn host_pages(s: &str) -> Result<usize, String> {
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a page count"))?;
    if v == 0 || POOL_PAGES.contains(&v) {
        Ok(v as usize)
    } else {
        Err(format!(
            "the host tier has 0 pages (none) or {}..={} (page 0 is reserved), not {s}",
            POOL_PAGES.start(),
            POOL_PAGES.end()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reals_refuse_what_is_not_finite_or_out_of_range() {
        assert_eq!(speedup("50"), Ok(50.0));
        for bad in ["0", "-1", "1e-300", "1e300", "nan", "inf", "-inf", "", "x"] {
            assert!(speedup(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds("0"), Ok(0.0));
        assert!(seconds("1e30").is_err());
        assert!(timeout("0").is_err());
        assert!(gb_per_s("0").is_err() && gb_per_s("64").is_ok());
        assert_eq!(host_pages("0"), Ok(0));
        assert!(host_pages("1").is_err() && host_pages("4294967296").is_err());
        assert_eq!(host_pages("2"), Ok(2));
    }
}
