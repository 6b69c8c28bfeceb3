//! The tiny model behind the engine: [`TinyBackend`] (the generic
//! [`PagedBackend`] over [`TinyModel`]) and the defaults of `radixkv replay
//! --model tiny`.

use super::{TinyModel, TOLERANCE};
use crate::backend::{Logits, ModelError, PagedBackend, PagedModel, PagedSeq, Tolerance};
use crate::kvpool::{KvLayout, KvPool};

/// The tiny model as the engine's backend.
///
/// ```
/// use radixkv_models::backend::PoolConfig;
/// use radixkv_models::tiny::{TinyBackend, TinyConfig, TinyModel};
/// use radixkv_engine::EngineConfig;
/// let cfg = EngineConfig { devices: 2, pages_per_device: 64, ..EngineConfig::default() };
/// let model = TinyModel::new(TinyConfig::default())?;
/// let backend = TinyBackend::new(model, PoolConfig::for_engine(&cfg))?;
/// assert_eq!(backend.model().config().layers, 2);
/// # Ok::<(), radixkv_models::backend::ModelError>(())
/// ```
pub type TinyBackend = PagedBackend<TinyModel>;

impl PagedModel for TinyModel {
    fn pool_layout(&self, slots: usize) -> KvLayout {
        TinyModel::pool_layout(self, slots)
    }

    fn forward_paged(
        &self,
        pool: &mut dyn KvPool,
        seqs: &[PagedSeq<'_>],
        all_rows: bool,
    ) -> Result<Vec<Logits>, ModelError> {
        TinyModel::forward_paged(self, pool, seqs, all_rows)
    }

    fn reference(&self, tokens: &[u32], positions: &[usize]) -> Result<Vec<Vec<f32>>, ModelError> {
        let dense = self.forward_dense(tokens)?;
        positions
            .iter()
            .map(|&p| {
                dense
                    .position(p)
                    .map(<[f32]>::to_vec)
                    .ok_or_else(|| ModelError::Input(format!("position {p} of {}", tokens.len())))
            })
            .collect()
    }

    fn tolerance(&self) -> Tolerance {
        TOLERANCE
    }

    fn verifies_every_position(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        let c = self.config();
        format!(
            "tiny transformer ({} layers, {} heads x {}, vocab {}, seed {})",
            c.layers, c.heads, c.head_dim, c.vocab, c.seed
        )
    }
}

/// KV tokens per device of the default tiny replay: far less than the
/// default workload's shared prefixes (2,048 tokens), so prefixes are
/// evicted and inserted again during the run.
pub const DEFAULT_POOL_TOKENS: usize = 512;

/// Pages per device (page 0 reserved) holding [`DEFAULT_POOL_TOKENS`].
pub fn default_pages_per_device(page_size: usize) -> usize {
    DEFAULT_POOL_TOKENS / page_size.max(1) + 1
}
