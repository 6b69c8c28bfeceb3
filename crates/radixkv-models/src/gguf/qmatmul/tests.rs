//! `QWeight` against candle's quantized tensors, on every kernel this CPU
//! runs: block parsing, dequantized rows, products of one and several
//! rows, and products split over rayon's threads.

use super::*;
use candle_core::quantized::QMatMul;
use candle_core::{Device, Module, Tensor};

fn random(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

fn weight(dtype: GgmlDType, n: usize, k: usize) -> (QTensor, QWeight) {
    let w = Tensor::from_vec(random(n * k, 7), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, dtype).unwrap();
    let own = QWeight::new(&q).unwrap().unwrap();
    (q, own)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn several_rows_at_once_give_each_rows_bits_alone() {
    // Several activation rows read the task's blocks with their scales
    // widened once into a copy; one row widens them in the dot. The two
    // must agree to the bit, on every kernel.
    for kernel in Kernel::available() {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (_, own) = weight(dtype, 40, 96);
            let x = random(3 * 96, 5);
            let all = own.matmul(kernel, &x, 3);
            for r in 0..3 {
                let one = own.matmul(kernel, &x[r * 96..(r + 1) * 96], 1);
                assert_eq!(
                    bits(&all[r * 40..(r + 1) * 40]),
                    bits(&one),
                    "{kernel} {dtype:?} row {r}"
                );
            }
        }
    }
}

#[test]
fn rows_dequantize_to_candles_bits() {
    for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
        let (q, own) = weight(dtype, 6, 64);
        let all = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (r, want) in all.iter().enumerate() {
            let mut got = Vec::new();
            own.row_into(r, &mut got);
            assert_eq!(bits(&got), bits(want), "{dtype:?} row {r}");
        }
    }
}

/// Each output against candle's quantized matmul of the same tensor (the
/// same block math, with `s` rounded once more): within 1e-3 of the
/// output's own scale `Σ_j |w_ij x_j|` (over the dequantized weights), on
/// every kernel.
#[test]
fn matmul_agrees_with_candles_quantized_matmul() {
    for kernel in Kernel::available() {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (n, k, rows) = (40, 96, 5);
            let (q, own) = weight(dtype, n, k);
            let w = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let x = random(rows * k, 3);
            let ours = own.matmul(kernel, &x, rows);
            let xt = Tensor::from_vec(x.clone(), (rows, k), &Device::Cpu).unwrap();
            let theirs = QMatMul::from_qtensor(q).unwrap().forward(&xt).unwrap();
            let theirs = theirs.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let mut worst = 0f32;
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                let (r, c) = (i / n, i % n);
                let scale: f32 = w[c]
                    .iter()
                    .zip(&x[r * k..(r + 1) * k])
                    .map(|(w, x)| (w * x).abs())
                    .sum();
                worst = worst.max((a - b).abs() / scale);
                assert!(
                    (a - b).abs() <= 1e-3 * scale,
                    "{kernel} {dtype:?} [{i}]: {a} vs {b}, scale {scale}"
                );
            }
            eprintln!("{kernel} {dtype:?}: worst |Δ| / scale {worst:e}");
        }
    }
}

/// No rows (a dense pass asked for no positions) give no outputs.
#[test]
fn no_rows_give_no_outputs() {
    let (_, own) = weight(GgmlDType::Q4_1, 8, 32);
    assert!(own.matmul(Kernel::detect(), &[], 0).is_empty());
}

/// A row's outputs are the same alone or among other rows, to the bit.
#[test]
fn a_rows_outputs_do_not_depend_on_the_other_rows() {
    for kernel in Kernel::available() {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (n, k, rows) = (50, 64, 7);
            let (_, own) = weight(dtype, n, k);
            let x = random(rows * k, 11);
            let all = own.matmul(kernel, &x, rows);
            for r in 0..rows {
                let one = own.matmul(kernel, &x[r * k..(r + 1) * k], 1);
                assert_eq!(one, all[r * n..(r + 1) * n], "{kernel} {dtype:?} row {r}");
            }
        }
    }
}

/// A product large enough to be split over rayon's threads (the
/// model's products are: 576 × 576 and larger) gives the same bits as
/// the same columns computed in one piece, one activation row and
/// several, on every kernel; the split really happens (several tasks,
/// run in parallel).
#[test]
fn a_product_split_over_threads_gives_the_bits_of_one_piece() {
    for kernel in Kernel::available() {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (n, k) = (300, 256);
            let (_, own) = weight(dtype, n, k);
            let kb = k / BLOCK;
            for rows in [1, 3] {
                assert!(
                    own.columns_per_task(rows) < n,
                    "{rows} rows of {n} x {k}: one task"
                );
                let x = random(rows * k, 13);
                let split = own.matmul(kernel, &x, rows);
                // One piece: every column of a row through the kernel at once.
                let mut whole = vec![0f32; rows * n];
                for (r, out) in whole.chunks_exact_mut(n).enumerate() {
                    let acts: Vec<Act> = x[r * k..(r + 1) * k]
                        .chunks_exact(BLOCK)
                        .map(|b| kernel.quantize(b))
                        .collect();
                    match &own.blocks {
                        Blocks::Q41(w) => kernel.columns(Rows::Q41(w), kb, n, &acts, out),
                        Blocks::Q80(w) => kernel.columns(Rows::Q80(w), kb, n, &acts, out),
                    }
                }
                assert_eq!(bits(&split), bits(&whole), "{kernel} {dtype:?} {rows} rows");
            }
        }
    }
}

/// The portable kernel's products against the vector kernel's, where this
/// CPU has one: within 1e-5 of each output's scale.
#[test]
fn the_kernels_products_agree() {
    let kernels = Kernel::available();
    let (_, own) = weight(GgmlDType::Q4_1, 64, 512);
    let x = random(2 * 512, 17);
    let reference = own.matmul(Kernel::portable(), &x, 2);
    for kernel in kernels {
        let y = own.matmul(kernel, &x, 2);
        for (a, b) in y.iter().zip(&reference) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{kernel}: {a} vs {b}"
            );
        }
    }
}

/// Products of several weights of different types and widths in one
/// parallel region (`matmuls`) give each product's bits alone, for one
/// and several rows; a weight with no rows of output gives none.
#[test]
fn products_taken_together_give_their_bits_alone() {
    let k = 256;
    let (_, a) = weight(GgmlDType::Q4_1, 300, k);
    let (_, b) = weight(GgmlDType::Q8_0, 70, k);
    let (_, c) = weight(GgmlDType::Q4_1, 4, k);
    for kernel in Kernel::available() {
        for rows in [1, 3] {
            let x = random(rows * k, 17);
            let together = matmuls([&a, &b, &c], kernel, &x, rows);
            for (w, y) in [&a, &b, &c].into_iter().zip(&together) {
                assert_eq!(y.len(), rows * w.n);
                assert_eq!(
                    bits(y),
                    bits(&w.matmul(kernel, &x, rows)),
                    "{kernel} {rows} rows"
                );
            }
        }
    }
    let [y] = matmuls([&a], Kernel::detect(), &[], 0);
    assert!(y.is_empty());
}
