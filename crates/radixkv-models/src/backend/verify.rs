//! The check of paged passes against a model's dense reference: the
//! comparison of logits rows ([`compare_rows`], [`Comparison`], within a
//! [`Tolerance`]), and the per-request log the backend keeps with `verify`
//! and checks when the request leaves the device.

use super::{ModelError, PagedModel};

/// How close a paged pass's logits must be to the dense reference's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Largest absolute difference allowed between a logit of a paged pass
    /// and the reference's.
    pub logit: f32,
    /// Argmaxes are compared only where the reference's top-2 margin
    /// exceeds this (a near tie may flip on rounding).
    pub argmax_margin: f32,
}

/// The argmax of a row and its margin over the runner-up, the first of
/// equal values winning. NaNs never win and are never the runner-up: they
/// are skipped, so a row of only NaNs has no argmax and gives `None`, as an
/// empty row does. The margin is infinite when no other value is left, and
/// 0 when the runner-up equals the winner (two infinities included).
///
/// ```
/// use radixkv_models::backend::argmax;
/// assert_eq!(argmax(&[f32::NAN, 1.0, 3.0, 2.0]), Some((2, 1.0)));
/// assert_eq!(argmax(&[f32::NAN, f32::NAN]), None);
/// ```
pub fn argmax(row: &[f32]) -> Option<(u32, f32)> {
    let mut best: Option<(usize, f32)> = None;
    let mut second: Option<f32> = None;
    for (i, &x) in row.iter().enumerate().filter(|(_, x)| !x.is_nan()) {
        match best {
            Some((_, b)) if x > b => {
                second = Some(b);
                best = Some((i, x));
            }
            Some(_) => second = Some(second.map_or(x, |s| s.max(x))),
            None => best = Some((i, x)),
        }
    }
    best.map(|(i, b)| {
        let margin = match second {
            None => f32::INFINITY,
            Some(s) if s == b => 0.0,
            Some(s) => b - s,
        };
        (i as u32, margin)
    })
}

/// How paged logits compare with the dense reference's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Comparison {
    /// Positions (rows) compared.
    pub positions: u64,
    /// Largest absolute difference of a logit (NaN counts as infinite).
    pub max_abs_diff: f32,
    /// Positions with a logit off by more than the tolerance.
    pub logit_mismatches: u64,
    /// Positions whose argmax was compared (top-2 margin above the
    /// tolerance's).
    pub argmax_checked: u64,
    /// Of which the argmaxes differ.
    pub argmax_mismatches: u64,
}

impl Comparison {
    /// No mismatch of logits or argmaxes.
    pub fn ok(&self) -> bool {
        self.logit_mismatches == 0 && self.argmax_mismatches == 0
    }

    /// Adds another comparison's counts.
    pub fn merge(&mut self, o: &Comparison) {
        self.positions += o.positions;
        self.max_abs_diff = self.max_abs_diff.max(o.max_abs_diff);
        self.logit_mismatches += o.logit_mismatches;
        self.argmax_checked += o.argmax_checked;
        self.argmax_mismatches += o.argmax_mismatches;
    }
}

/// Compares one position's logits (`got`, from a paged pass) with the
/// dense reference's (`want`) within `tol`. Rows of different lengths
/// mismatch.
///
/// ```
/// use radixkv_models::backend::{compare_rows, Tolerance};
/// let tol = Tolerance { logit: 1e-3, argmax_margin: 1e-2 };
/// assert!(compare_rows(&[1.0, 2.0], &[1.0005, 2.0], tol).ok());
/// assert!(!compare_rows(&[2.0, 1.0], &[1.0, 2.0], tol).ok());
/// ```
pub fn compare_rows(got: &[f32], want: &[f32], tol: Tolerance) -> Comparison {
    let mut c = Comparison {
        positions: 1,
        ..Comparison::default()
    };
    if got.len() != want.len() {
        c.logit_mismatches = 1;
        c.max_abs_diff = f32::INFINITY;
        return c;
    }
    for (a, b) in got.iter().zip(want) {
        let d = (a - b).abs();
        // A NaN difference is a mismatch too.
        let d = if d.is_nan() { f32::INFINITY } else { d };
        c.max_abs_diff = c.max_abs_diff.max(d);
    }
    if c.max_abs_diff > tol.logit {
        c.logit_mismatches = 1;
    }
    if let (Some((wi, margin)), Some((gi, _))) = (argmax(want), argmax(got)) {
        if margin > tol.argmax_margin {
            c.argmax_checked = 1;
            if wi != gi {
                c.argmax_mismatches = 1;
            }
        }
    }
    c
}

/// One request's computed positions on a device, kept for verification.
#[derive(Debug, Default)]
pub(super) struct RequestLog {
    /// The request's tokens (the longest context seen).
    pub(super) tokens: Vec<u32>,
    /// Every computed position and its logits row.
    pub(super) rows: Vec<(usize, Vec<f32>)>,
    /// Passes that contributed rows.
    pub(super) passes: u64,
}

impl RequestLog {
    /// Recomputes the logged context with `model`'s dense reference and
    /// compares every kept row: the comparison, and whether the request
    /// mismatched (a row off, or rows the reference could not produce).
    /// `None` when no row was kept.
    pub(super) fn verify<M: PagedModel + ?Sized>(&self, model: &M) -> Option<(Comparison, bool)> {
        let end = self.rows.iter().map(|(p, _)| p + 1).max()?;
        let mut positions: Vec<usize> = self.rows.iter().map(|(p, _)| *p).collect();
        positions.sort_unstable();
        positions.dedup();
        let mut c = Comparison::default();
        let mut failed = false;
        match self
            .tokens
            .get(..end)
            .ok_or_else(|| ModelError::Input("rows past the tokens".into()))
            .and_then(|t| model.reference(t, &positions))
        {
            Ok(reference) => {
                for (pos, row) in &self.rows {
                    match positions
                        .binary_search(pos)
                        .ok()
                        .and_then(|i| reference.get(i))
                    {
                        Some(want) => c.merge(&compare_rows(row, want, model.tolerance())),
                        None => failed = true,
                    }
                }
            }
            Err(_) => failed = true,
        }
        Some((c, failed || !c.ok()))
    }
}

#[cfg(test)]
mod tests {
    use super::argmax;

    const NAN: f32 = f32::NAN;

    #[test]
    fn argmax_takes_the_first_largest_value_and_its_margin() {
        assert_eq!(argmax(&[1.0, 5.0, 5.0]), Some((1, 0.0)));
        assert_eq!(argmax(&[1.0, 5.0, 3.0]), Some((1, 2.0)));
        assert_eq!(argmax(&[4.0]), Some((0, f32::INFINITY)));
        assert_eq!(argmax(&[]), None);
        let inf = f32::INFINITY;
        assert_eq!(argmax(&[inf, 1.0, inf]), Some((0, 0.0)));
        assert_eq!(argmax(&[-inf, -inf]), Some((0, 0.0)));
    }

    /// A NaN wins nowhere in the row and is never the runner-up.
    #[test]
    fn nans_never_win_nor_set_the_margin() {
        assert_eq!(argmax(&[NAN, 1.0, 3.0, 2.0]), Some((2, 1.0)));
        assert_eq!(argmax(&[1.0, NAN, 3.0, 2.0]), Some((2, 1.0)));
        assert_eq!(argmax(&[1.0, 3.0, NAN]), Some((1, 2.0)));
        assert_eq!(argmax(&[NAN, 3.0]), Some((1, f32::INFINITY)));
        assert_eq!(argmax(&[-1.0, NAN, -2.0]), Some((0, 1.0)));
    }

    /// A row of only NaNs has no argmax.
    #[test]
    fn a_row_of_only_nans_has_no_argmax() {
        assert_eq!(argmax(&[NAN]), None);
        assert_eq!(argmax(&[NAN, NAN, NAN]), None);
    }
}
