//! The GGUF llama's compute kernels: the quantized block dots of its
//! matmuls (and the vector path of its attention), in plain Rust or with
//! AVX2, chosen by a [`Kernel`] that the model is given.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`Kernel`]: which path runs, and the dispatch to it |
//! | `blocks.rs` | the blocks the kernels read: `Q4_1`, `Q8_0` (scales as stored or widened) and the 8-bit activation blocks |
//! | `portable.rs` | the kernels in plain Rust, on any CPU |
//! | `avx2.rs` | the kernels with AVX2, FMA and F16C (x86-64), and the lane sum attention shares |
//!
//! Both paths compute each block's integer dot exactly; they differ only
//! in the order the float sums are taken in (and FMA), so their results
//! agree to about 1e-6 of a row's scale, and each is deterministic:
//! a row's outputs never depend on the other rows or on the work split.
//! Since the model is handed its kernel, the portable path is tested end
//! to end on every machine, AVX2 or not ([`Kernel::available`]).

pub(crate) mod blocks;
pub(crate) mod portable;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

use blocks::{Act, Rows, Scale, Q41, Q80};

/// Which path the kernels take: plain Rust, or AVX2 with FMA and F16C.
/// Only [`Kernel::detect`] and [`Kernel::available`] make the vector one,
/// after the CPU reported its features, so holding a `Kernel` is the
/// proof its instructions run here.
///
/// ```
/// use radixkv_models::gguf::Kernel;
/// let best = Kernel::detect();
/// assert!(Kernel::available().contains(&best));
/// assert!(Kernel::available().contains(&Kernel::portable()));
/// println!("{best}");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel(Path);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernel {
    /// The plain-Rust path (any CPU).
    pub fn portable() -> Kernel {
        Kernel(Path::Portable)
    }

    /// The fastest path this CPU runs: AVX2 where it has AVX2, FMA and
    /// F16C, else the portable one.
    pub fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return Kernel(Path::Avx2);
        }
        Kernel::portable()
    }

    /// Every path this CPU runs, the portable one first.
    pub fn available() -> Vec<Kernel> {
        let mut all = vec![Kernel::portable()];
        if Kernel::detect() != Kernel::portable() {
            all.push(Kernel::detect());
        }
        all
    }

    /// Whether this is the AVX2 path (the CPU has AVX2, FMA and F16C).
    pub fn is_avx2(self) -> bool {
        match self.0 {
            Path::Portable => false,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => true,
        }
    }

    /// One activation block, quantized as llama.cpp's `q8_1` (the same
    /// bits on both paths).
    pub(crate) fn quantize(self, x: &[f32]) -> Act {
        match self.0 {
            Path::Portable => portable::quantize(x),
            // SAFETY: `Path::Avx2` is only made by `detect` after the CPU
            // reported AVX2 (and FMA and F16C).
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { avx2::quantize(x) },
        }
    }

    /// `Σ_blocks (d_w d_a Σ q_w q_a + m_w s_a)` over each of `N` `Q4_1`
    /// rows with the same activations. Each row's sum is taken as if alone:
    /// several at once only keep more independent work in flight. `N` is 1
    /// to 4, the vector path's widest step (a wider call does not compile
    /// on x86-64).
    pub(crate) fn q4_1<S: Scale, const N: usize>(self, w: [&[Q41<S>]; N], a: &[Act]) -> [f32; N] {
        match self.0 {
            Path::Portable => w.map(|w| portable::q4_1(w, a)),
            // SAFETY: `Path::Avx2` is only made by `detect` after the CPU
            // reported AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { avx2::q4_1(w, a) },
        }
    }

    /// `Σ_blocks d_w d_a Σ q_w q_a` over each of `N` `Q8_0` rows, as
    /// [`q4_1`](Self::q4_1).
    pub(crate) fn q8_0<S: Scale, const N: usize>(self, w: [&[Q80<S>]; N], a: &[Act]) -> [f32; N] {
        match self.0 {
            Path::Portable => w.map(|w| portable::q8_0(w, a)),
            // SAFETY: as in `q4_1`: the CPU has AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { avx2::q8_0(w, a) },
        }
    }

    /// One activation row `a` (`kb` blocks) against the `n` weight rows of
    /// `rows`, into `out[..n]`, four rows at a time.
    pub(crate) fn columns<S: Scale>(
        self,
        rows: Rows<'_, S>,
        kb: usize,
        n: usize,
        a: &[Act],
        out: &mut [f32],
    ) {
        let mut c = 0;
        macro_rules! run {
            ($w:expr, $f:ident) => {{
                let row = |c: usize| &$w[c * kb..(c + 1) * kb];
                while c + 4 <= n {
                    let ys = self.$f([row(c), row(c + 1), row(c + 2), row(c + 3)], a);
                    out[c..c + 4].copy_from_slice(&ys);
                    c += 4;
                }
                while c < n {
                    out[c] = self.$f([row(c)], a)[0];
                    c += 1;
                }
            }};
        }
        match rows {
            Rows::Q41(w) => run!(w, q4_1),
            Rows::Q80(w) => run!(w, q8_0),
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_avx2() { "avx2" } else { "portable" })
    }
}

#[cfg(test)]
mod tests;
