//! `--model`: which backend computes behind the engine, shared by `serve`
//! and `replay`.

use std::path::PathBuf;

/// The error for `--model tiny` in a build without the `candle` feature.
#[cfg(not(feature = "candle"))]
pub const NO_CANDLE: &str =
    "--model tiny needs the tiny candle model: build with the `candle` feature (on by default)";

/// The error for `--model gguf:PATH` in a build without the `gguf` feature.
#[cfg(not(feature = "gguf"))]
pub const NO_GGUF: &str =
    "--model gguf:PATH needs GGUF support: build with the `gguf` feature (on by default)";

/// A `--model` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelArg {
    /// `sim` or `simulated`: the cost-model simulator.
    Simulated,
    /// `tiny`: the tiny random-weights candle transformer.
    Tiny,
    /// `gguf:PATH`: a GGUF llama (SmolLM2-135M-Instruct).
    Gguf(PathBuf),
}

impl ModelArg {
    /// Whether it computes for real (its times are wall time).
    pub fn is_real(&self) -> bool {
        !matches!(self, ModelArg::Simulated)
    }

    /// The short name for reports and the default served model name.
    pub fn name(&self) -> String {
        match self {
            ModelArg::Simulated => "sim".into(),
            ModelArg::Tiny => "tiny".into(),
            ModelArg::Gguf(p) => p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "gguf".into()),
        }
    }
}

impl std::str::FromStr for ModelArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sim" | "simulated" => Ok(ModelArg::Simulated),
            "tiny" => Ok(ModelArg::Tiny),
            _ => match s.strip_prefix("gguf:") {
                Some("") => Err("gguf: needs the model file's path (gguf:PATH)".into()),
                Some(p) => Ok(ModelArg::Gguf(PathBuf::from(p))),
                None => Err(format!(
                    "unknown model `{s}` (sim, simulated, tiny or gguf:PATH)"
                )),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ModelArg;

    #[test]
    fn model_names_parse() {
        assert_eq!("sim".parse(), Ok(ModelArg::Simulated));
        assert_eq!("simulated".parse(), Ok(ModelArg::Simulated));
        assert_eq!("tiny".parse(), Ok(ModelArg::Tiny));
        assert_eq!(
            "gguf:/m/SmolLM2.gguf".parse(),
            Ok(ModelArg::Gguf("/m/SmolLM2.gguf".into()))
        );
        assert_eq!(
            "gguf:/m/SmolLM2.gguf".parse::<ModelArg>().unwrap().name(),
            "SmolLM2"
        );
        assert!("gguf:".parse::<ModelArg>().unwrap_err().contains("PATH"));
        assert!("llama"
            .parse::<ModelArg>()
            .unwrap_err()
            .contains("gguf:PATH"));
    }
}
