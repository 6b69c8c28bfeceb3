//! Loom models of radixkv's concurrent protocols, run on the real tree code
//! through radixkv's `sync` shim; this crate holds what the models share.
//! The models live in `tests/`, one file per protocol: `structure.rs`
//! (splits, attaches, unlinks, readers, wide nodes), `pins_and_eviction.rs`,
//! `allocator.rs`, `namespaces.rs`, `copies.rs` and `events.rs`. Each model
//! names the protecting step it relies on (a function of the core named
//! after it); `negative.sh` runs the model without that step
//! (`RADIXKV_NEGATIVE_STEP=…`, read by the core's loom build at run time) and
//! expects the model to fail with its own message.
//!
//! Run: `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 \
//!       cargo test -p loom-tests --release --target-dir target/loom`
#![cfg(loom)]

use radixkv::{DeviceId, PagedCache, RadixCache, TokenKey};
use std::sync::Arc;

/// Device 0.
pub const D0: DeviceId = DeviceId(0);
/// Device 1.
pub const D1: DeviceId = DeviceId(1);

/// Checks `f` under every interleaving within the preemption bound (2
/// unless `LOOM_MAX_PREEMPTIONS` says otherwise).
pub fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    model_with_branches(1_000, f);
}

/// A model whose execution takes up to `branches` atomic steps (loom's
/// default is 1,000: a setup of many inserts needs more).
pub fn model_with_branches<F: Fn() + Sync + Send + 'static>(branches: usize, f: F) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b.max_branches = b.max_branches.max(branches);
    b.check(f);
}

/// A cache of `devices` devices whose values come from the caller.
pub fn cache(devices: usize) -> Arc<RadixCache> {
    Arc::new(RadixCache::builder().devices(devices).build().unwrap())
}

/// A cache of `devices` devices that owns `pages` pages on each.
pub fn paged(devices: usize, pages: usize) -> Arc<PagedCache> {
    Arc::new(
        RadixCache::builder()
            .devices(devices)
            .pages_per_device(pages)
            .build()
            .unwrap(),
    )
}

/// A key in the default namespace.
pub fn key(t: &[u32]) -> TokenKey<'_> {
    TokenKey::new(t)
}
