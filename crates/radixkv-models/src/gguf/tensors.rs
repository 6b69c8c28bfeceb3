//! Which types a GGUF llama's tensors may have, by what each one is for.
//!
//! A matmul weight (the blocks' projections and the output layer) must be
//! `Q4_1` or `Q8_0`: those are the types `super::qmatmul` computes itself,
//! each activation row on its own, so a position's logits have the same
//! bits in a decode step of one row and in a dense pass of many. candle's
//! quantized matmul, the only other one at hand, picks its CPU kernel by
//! the number of rows (and the CPU, and an environment variable), so a
//! paged pass and the dense reference would part by a few units in the
//! last place, and thirty layers of 8-bit activations grow that into false
//! mismatches of `--verify`. Every other tensor (the token embedding when
//! the file has its own `output.weight`, the norms) is dequantized to f32
//! once at load and read row by row or element by element, so it may have
//! any type candle dequantizes.

use super::GgufError;
use candle_core::quantized::GgmlDType;

/// The types a matmul weight may have (see the module's docs).
pub(crate) const MATMUL_TYPES: [GgmlDType; 2] = [GgmlDType::Q4_1, GgmlDType::Q8_0];

/// The projections of a block `blk.N.` that are matmul weights.
const BLOCK_MATMULS: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// What a tensor of a llama GGUF is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// Multiplied with activations: one of [`MATMUL_TYPES`].
    Matmul,
    /// Dequantized once at load (embedding rows, norm weights) or unused:
    /// any type candle dequantizes.
    Dequantized,
}

/// What the tensor `name` is used for; `tied`: the file has no
/// `output.weight`, so the token embedding is the output layer too.
pub(crate) fn use_of(name: &str, tied: bool) -> Use {
    let in_block = name
        .strip_prefix("blk.")
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(layer, rest)| layer.parse::<usize>().ok().map(|_| rest))
        .and_then(|rest| rest.strip_suffix(".weight"))
        .is_some_and(|w| BLOCK_MATMULS.contains(&w));
    if in_block || name == "output.weight" || (tied && name == "token_embd.weight") {
        Use::Matmul
    } else {
        Use::Dequantized
    }
}

/// Types candle dequantizes on the CPU that a GGUF llama stores.
fn dequantizable(t: GgmlDType) -> bool {
    use GgmlDType::*;
    matches!(
        t,
        F32 | F16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K
    )
}

/// Checks each tensor's type against its use; the error names the first
/// refused tensor (by name), its type, how many more are refused, which
/// types are accepted, and what file to use instead.
pub(crate) fn check_types<'a>(
    tensors: impl IntoIterator<Item = (&'a str, GgmlDType)>,
) -> Result<(), GgufError> {
    let tensors: Vec<(&str, GgmlDType)> = tensors.into_iter().collect();
    let tied = !tensors.iter().any(|(n, _)| *n == "output.weight");
    let mut refused: Vec<(&str, GgmlDType, Use)> = tensors
        .into_iter()
        .map(|(n, t)| (n, t, use_of(n, tied)))
        .filter(|&(_, t, u)| match u {
            Use::Matmul => !MATMUL_TYPES.contains(&t),
            Use::Dequantized => !dequantizable(t),
        })
        .collect();
    refused.sort_unstable_by_key(|&(n, _, _)| n);
    let Some(&(name, t, u)) = refused.first() else {
        return Ok(());
    };
    let more = match refused.len() - 1 {
        0 => String::new(),
        n => format!(" (and {n} more tensors)"),
    };
    let why = match u {
        Use::Matmul => format!(
            "matmul weights must be Q4_1 or Q8_0, the types radixkv computes with the same bits \
             for one row and many (candle's matmul for other types does not, and `--verify` \
             would report false mismatches); use a Q4_1 or Q8_0 GGUF, such as the \
             SmolLM2-135M-Instruct.Q4_1.gguf that scripts/fetch-smollm2.sh fetches{}",
            if tied && name == "token_embd.weight" {
                " (the file has no `output.weight`, so its token embedding is the output layer)"
            } else {
                ""
            }
        ),
        Use::Dequantized => "embeddings and norms may be F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, \
                             Q8_0 or Q2K to Q6K"
            .to_string(),
    };
    Err(GgufError::Unsupported(format!(
        "tensor `{name}` of type {t:?}{more}: {why}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlDType::*;

    #[test]
    fn projections_and_the_output_layer_are_matmuls() {
        for name in [
            "blk.0.attn_q.weight",
            "blk.12.attn_k.weight",
            "blk.3.attn_v.weight",
            "blk.29.attn_output.weight",
            "blk.0.ffn_gate.weight",
            "blk.0.ffn_up.weight",
            "blk.7.ffn_down.weight",
            "output.weight",
        ] {
            assert_eq!(use_of(name, false), Use::Matmul, "{name}");
        }
        for name in [
            "token_embd.weight",
            "output_norm.weight",
            "blk.0.attn_norm.weight",
            "blk.0.ffn_norm.weight",
            "rope_freqs.weight",
            "blk.x.attn_q.weight",
            "blk.0.attn_q.bias",
        ] {
            assert_eq!(use_of(name, false), Use::Dequantized, "{name}");
        }
        assert_eq!(use_of("token_embd.weight", true), Use::Matmul);
    }

    /// A matmul weight of any type but `Q4_1` and `Q8_0` is refused by
    /// name and type; the same type as an embedding or a norm is not.
    #[test]
    fn matmul_weights_of_other_types_are_refused_by_name() {
        let ok = [
            ("token_embd.weight", Q8_0),
            ("output_norm.weight", F32),
            ("blk.0.attn_norm.weight", F32),
            ("blk.0.attn_q.weight", Q4_1),
            ("blk.0.ffn_down.weight", Q8_0),
        ];
        assert!(check_types(ok).is_ok());
        for t in [F32, F16, Q4_0, Q5_0, Q5_1, Q2K, Q3K, Q4K, Q5K, Q6K, Q8_1] {
            let mut file = ok.to_vec();
            file[4].1 = t;
            file.push(("blk.1.ffn_down.weight", t));
            let e = check_types(file).unwrap_err().to_string();
            for part in [
                &format!("`blk.0.ffn_down.weight` of type {t:?}"),
                "and 1 more",
                "Q4_1 or Q8_0",
                "fetch-smollm2.sh",
            ] {
                assert!(e.contains(part), "{t:?}: {e}");
            }
        }
        // A K-quant or F16 embedding is a lookup when the output layer is
        // its own tensor, and a matmul weight when it is the embedding.
        let untied = [
            ("token_embd.weight", Q4K),
            ("output.weight", Q8_0),
            ("output_norm.weight", F16),
        ];
        assert!(check_types(untied).is_ok());
        let e = check_types([("token_embd.weight", Q6K)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`token_embd.weight` of type Q6K"), "{e}");
        assert!(e.contains("no `output.weight`"), "{e}");
        let e = check_types([("output.weight", Q8_0), ("token_embd.weight", Q8_1)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`token_embd.weight` of type Q8_1") && e.contains("embeddings and norms"),
            "{e}"
        );
    }
}
