//! How a model picks the next token from its logits: greedy (temperature
//! 0, the default) or sampled with temperature and top-p (nucleus) from a
//! seed. A sample depends only on the logits, the seed and the position
//! sampled, never on which requests share the pass: the same request with
//! the same seed gives the same text however it is batched, chunked or
//! retracted.

use crate::rng::SplitMix64;

/// A request's sampling parameters (OpenAI's `temperature`, `top_p`,
/// `seed`).
///
/// ```
/// use radixkv_engine::sched::sampling::Sampling;
/// let logits = [0.0f32, 3.0, 1.0, 2.9];
/// assert_eq!(Sampling::default().sample(&logits, 7), Some(1)); // greedy
/// let s = Sampling { temperature: 1.0, top_p: 0.9, seed: 42 };
/// let a = s.sample(&logits, 7);
/// assert_eq!(a, s.sample(&logits, 7)); // the same seed and position
/// assert!(matches!(a, Some(1) | Some(3) | Some(2)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; 0 (or less, or not finite) is greedy.
    pub temperature: f32,
    /// Nucleus: sample among the most likely tokens whose probabilities
    /// sum to at least this (1: all; values outside (0, 1] act as 1).
    pub top_p: f32,
    /// The seed of the draws.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl Sampling {
    /// Whether this is greedy decoding.
    pub fn is_greedy(&self) -> bool {
        !(self.temperature.is_finite() && self.temperature > 0.0)
    }

    /// The token sampled from `logits` at context position `position`
    /// (the draw's stream is the seed's and the position's); `None` for an
    /// empty row or one with no finite logit.
    pub fn sample(&self, logits: &[f32], position: usize) -> Option<u32> {
        let best = greedy(logits)?;
        if self.is_greedy() {
            return Some(best);
        }
        // Probabilities of the finite logits, most likely first.
        let m = logits[best as usize];
        let t = self.temperature;
        let mut p: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, x)| x.is_finite())
            .map(|(i, &x)| (i as u32, ((x - m) / t).exp()))
            .collect();
        p.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let total: f32 = p.iter().map(|x| x.1).sum();
        let top_p = if self.top_p > 0.0 && self.top_p < 1.0 {
            self.top_p
        } else {
            1.0
        };
        // The nucleus: the shortest head whose mass reaches top_p.
        let mut mass = 0.0;
        let mut keep = p.len();
        for (i, x) in p.iter().enumerate() {
            mass += x.1 / total;
            if mass >= top_p {
                keep = i + 1;
                break;
            }
        }
        let p = &p[..keep];
        let kept: f32 = p.iter().map(|x| x.1).sum();
        let mut rng =
            SplitMix64::new(self.seed ^ (position as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        let mut u = rng.unit() as f32 * kept;
        for x in p {
            if u < x.1 {
                return Some(x.0);
            }
            u -= x.1;
        }
        p.last().map(|x| x.0)
    }
}

/// The index of the largest finite value (the first of equals).
fn greedy(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if x.is_finite() && best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i as u32)
}

#[cfg(test)]
mod tests {
    use super::Sampling;

    #[test]
    fn greedy_takes_the_first_largest_finite_logit() {
        let g = Sampling::default();
        assert_eq!(g.sample(&[1.0, 5.0, 5.0], 0), Some(1));
        assert_eq!(g.sample(&[f32::NAN, 1.0], 0), Some(1));
        assert_eq!(g.sample(&[], 0), None);
        assert_eq!(g.sample(&[f32::NAN], 0), None);
    }

    #[test]
    fn sampling_follows_the_distribution_and_the_nucleus() {
        // ln 3 apart: probabilities 3/4 and 1/4 at temperature 1.
        let logits = [3f32.ln(), 0.0, f32::NEG_INFINITY];
        let s = |seed| Sampling {
            temperature: 1.0,
            top_p: 1.0,
            seed,
        };
        let draws: Vec<u32> = (0..4000)
            .map(|seed| s(seed).sample(&logits, 3).unwrap())
            .collect();
        let zeros = draws.iter().filter(|&&t| t == 0).count();
        assert!((2800..3200).contains(&zeros), "{zeros} of 4000");
        assert!(draws.iter().all(|&t| t < 2), "never a -inf token");
        // top_p 0.5: the nucleus is the first token alone.
        let nucleus = Sampling { top_p: 0.5, ..s(0) };
        assert!((0..200).all(|p| nucleus.sample(&logits, p) == Some(0)));
        // Different positions draw differently.
        let spread: std::collections::HashSet<u32> =
            (0..64).map(|p| s(9).sample(&logits, p).unwrap()).collect();
        assert_eq!(spread.len(), 2);
    }

    #[test]
    fn a_tiny_temperature_is_nearly_greedy_and_zero_is_greedy() {
        let logits = [1.0f32, 1.5, 0.2];
        for seed in 0..100 {
            let cold = Sampling {
                temperature: 0.01,
                top_p: 1.0,
                seed,
            };
            assert_eq!(cold.sample(&logits, 0), Some(1));
        }
        let zero = Sampling {
            temperature: 0.0,
            top_p: 0.1,
            seed: 5,
        };
        assert!(zero.is_greedy());
    }
}
