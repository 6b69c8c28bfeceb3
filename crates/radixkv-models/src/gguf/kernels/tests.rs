//! The kernels on blocks made here: each path this CPU runs against the
//! portable one, several rows at once against each alone, stored scales
//! against widened ones, and the activations' rounding.

use super::blocks::{Act, Q41, Q80};
use super::Kernel;
use half::f16;

/// A xorshift stream: `next()` in 0..2³².
struct Stream(u32);

impl Stream {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
    /// In -1..1.
    fn unit(&mut self) -> f32 {
        self.next() as f32 / u32::MAX as f32 * 2.0 - 1.0
    }
}

fn acts(kernel: Kernel, blocks: usize, seed: u32) -> Vec<Act> {
    let mut s = Stream(seed);
    let x: Vec<f32> = (0..blocks * 32).map(|_| s.unit()).collect();
    x.chunks_exact(32).map(|b| kernel.quantize(b)).collect()
}

fn q41_rows(rows: usize, blocks: usize, seed: u32) -> Vec<Vec<Q41>> {
    let mut s = Stream(seed);
    (0..rows)
        .map(|_| {
            (0..blocks)
                .map(|_| Q41 {
                    d: f16::from_f32(0.01 + 0.04 * s.unit().abs()).to_bits(),
                    m: f16::from_f32(0.1 * s.unit()).to_bits(),
                    qs: std::array::from_fn(|_| s.next() as u8),
                })
                .collect()
        })
        .collect()
}

fn q80_rows(rows: usize, blocks: usize, seed: u32) -> Vec<Vec<Q80>> {
    let mut s = Stream(seed);
    (0..rows)
        .map(|_| {
            (0..blocks)
                .map(|_| Q80 {
                    d: f16::from_f32(0.01 + 0.04 * s.unit().abs()).to_bits(),
                    qs: std::array::from_fn(|_| s.next() as i8),
                })
                .collect()
        })
        .collect()
}

/// Every path quantizes an activation block to the portable path's bits.
#[test]
fn every_kernel_quantizes_to_the_same_bits() {
    for kernel in Kernel::available() {
        let ours = acts(kernel, 16, 3);
        let reference = acts(Kernel::portable(), 16, 3);
        for (a, b) in ours.iter().zip(&reference) {
            assert_eq!(
                (a.d.to_bits(), a.s.to_bits(), a.qs),
                (b.d.to_bits(), b.s.to_bits(), b.qs),
                "{kernel}"
            );
        }
    }
}

/// Each path's block dots against the portable path's: the integer sums
/// are exact, so only the float sums' order (and FMA) differs.
#[test]
fn every_kernel_matches_the_portable_one() {
    let a = acts(Kernel::portable(), 8, 5);
    let (w4, w8) = (q41_rows(3, 8, 7), q80_rows(3, 8, 9));
    for kernel in Kernel::available() {
        for c in 0..3 {
            for (fast, slow) in [
                (
                    kernel.q4_1([&w4[c][..]], &a)[0],
                    Kernel::portable().q4_1([&w4[c][..]], &a)[0],
                ),
                (
                    kernel.q8_0([&w8[c][..]], &a)[0],
                    Kernel::portable().q8_0([&w8[c][..]], &a)[0],
                ),
            ] {
                assert!(
                    (fast - slow).abs() <= 1e-4 * slow.abs().max(1.0),
                    "{kernel}: {fast} vs {slow}"
                );
            }
        }
    }
}

/// Four rows at once give each row's bits alone, on every path.
#[test]
fn rows_taken_four_at_once_give_their_bits_alone() {
    let a = acts(Kernel::portable(), 8, 9);
    let (w4, w8) = (q41_rows(4, 8, 11), q80_rows(4, 8, 13));
    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for kernel in Kernel::available() {
        let four = kernel.q4_1([&w4[0][..], &w4[1][..], &w4[2][..], &w4[3][..]], &a);
        let alone: Vec<f32> = (0..4).map(|c| kernel.q4_1([&w4[c][..]], &a)[0]).collect();
        assert_eq!(bits(&four), bits(&alone), "{kernel} Q4_1");
        let four = kernel.q8_0([&w8[0][..], &w8[1][..], &w8[2][..], &w8[3][..]], &a);
        let alone: Vec<f32> = (0..4).map(|c| kernel.q8_0([&w8[c][..]], &a)[0]).collect();
        assert_eq!(bits(&four), bits(&alone), "{kernel} Q8_0");
    }
}

/// Scales as stored (f16 bits) and widened into f32 give the same bits.
#[test]
fn stored_and_widened_scales_give_the_same_bits() {
    let a = acts(Kernel::portable(), 8, 15);
    let (w4, w8) = (q41_rows(1, 8, 17), q80_rows(1, 8, 19));
    let wide4: Vec<_> = w4[0].iter().map(Q41::widened).collect();
    let wide8: Vec<_> = w8[0].iter().map(Q80::widened).collect();
    for kernel in Kernel::available() {
        assert_eq!(
            kernel.q4_1([&w4[0][..]], &a)[0].to_bits(),
            kernel.q4_1([&wide4[..]], &a)[0].to_bits(),
            "{kernel}"
        );
        assert_eq!(
            kernel.q8_0([&w8[0][..]], &a)[0].to_bits(),
            kernel.q8_0([&wide8[..]], &a)[0].to_bits(),
            "{kernel}"
        );
    }
}

#[test]
fn quantize_rounds_ties_to_even_and_sums() {
    for kernel in Kernel::available() {
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        let a = kernel.quantize(&x);
        assert_eq!((a.qs[0], a.qs[1], a.qs[2]), (127, 2, -4), "{kernel}");
        assert_eq!(a.d, 1.0);
        assert_eq!(a.s, 125.0);
        let zero = kernel.quantize(&[0f32; 32]);
        assert_eq!((zero.d, zero.s, zero.qs), (0.0, 0.0, [0; 32]), "{kernel}");
    }
}
