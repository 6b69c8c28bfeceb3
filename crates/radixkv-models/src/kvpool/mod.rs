//! KV-cache memory per device: `layers × 2 (K, V) × slots × row` floats.
//!
//! A slot is where one token's K (or V) row lives; slot `p * page_size + j`
//! belongs to page `p` (see [`radixkv::alloc`]). [`HostKvPool`] keeps the pool
//! in host memory (the default, and what tests use); `CudaKvPool` (feature
//! `cuda`) keeps it in GPU memory through cudarc, loaded at run time, and
//! `PinnedKvPool` (feature `cuda`) in page-locked host memory, which the
//! GPU's copy engines read and write directly (no staging buffer).
//!
//! # Copies
//!
//! [`copy_runs`] moves [`SlotRun`](radixkv::SlotRun)s (`len` consecutive slots from `src` on
//! one pool to `dst` on another) between pools of any kind. Within a
//! (layer, K or V) block a run's rows are contiguous, so a run is **one**
//! copy per layer and K/V, however many pages it spans:
//!
//! ```text
//! pool:  [ layer 0 K: slot 0 | slot 1 | … ][ layer 0 V: … ][ layer 1 K: … ] …
//! run {src: 4, dst: 20, len: 8}:  layer l, K: floats [off(l,K,4), off(l,K,12))
//!                                 → one memcpy to [off(l,K,20), off(l,K,28))
//! ```
//!
//! | source → destination | one copy per run, layer and K/V |
//! | --- | --- |
//! | host (`HostKvPool` or `PinnedKvPool`) → host | a slice `copy_from_slice` |
//! | host → `CudaKvPool` | `cuMemcpyHtoDAsync` on the GPU pool's stream |
//! | `CudaKvPool` → host | `cuMemcpyDtoHAsync` on the GPU pool's stream |
//! | `CudaKvPool` → `CudaKvPool` | `cuMemcpyDtoDAsync` (`cuMemcpyPeerAsync` across GPUs) on the destination's stream, after everything on the source's |
//! | anything else | staged: `read_rows` then `write_rows`, one of each per run, layer and K/V |
//!
//! Every call is synchronous: it returns once its copies are done (the
//! stream that did them is synchronized, even when issuing failed half
//! way, so no transfer outlives the borrow of the memory it touches).
//! Every run is checked before anything is copied: a bad run is a typed
//! error and leaves the destination as it was. [`copy_pages`] copies whole
//! pages: [`page_runs`] merges consecutive page pairs into runs and it
//! delegates to [`copy_runs`].
//!
//! ```
//! use radixkv::SlotRun;
//! use radixkv_models::kvpool::{copy_pages, copy_runs, HostKvPool, Kv, KvLayout, KvPool};
//! let layout = KvLayout { layers: 2, slots: 16, row: 4 };
//! let mut a = HostKvPool::new(layout);
//! a.write_rows(1, Kv::V, &[5], &[1.0, 2.0, 3.0, 4.0]).unwrap();
//! let mut b = HostKvPool::new(layout);
//! copy_pages(&a, &mut b, &[(1, 3)], 4).unwrap(); // page 1 (slots 4..8) -> page 3
//! assert_eq!(b.read_rows(1, Kv::V, &[13]).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
//! // Slots 5..7 -> 9..11: one copy per layer and K/V, pages or not.
//! let mut c = HostKvPool::new(layout);
//! copy_runs(&a, &mut c, &[SlotRun { src: 5, dst: 9, len: 2 }]).unwrap();
//! assert_eq!(c.read_rows(1, Kv::V, &[9]).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
//! ```
//!
//! | file | what it holds |
//! | --- | --- |
//! | `layout.rs` | [`KvLayout`], the [`KvPool`] interface, [`KvPoolError`], copy spans |
//! | `host.rs` | [`HostKvPool`] and the row access of host-slice pools |
//! | `copy.rs` | [`page_runs`], [`copy_runs`], [`copy_pages`] |
//! | `rows.rs` | [`with_kv_rows`]: a layer's K and V rows of some slots, for attention |
//! | `cuda.rs` | `CudaKvPool` and `PinnedKvPool` (feature `cuda`) |

mod copy;
#[cfg(feature = "cuda")]
mod cuda;
mod host;
mod layout;
mod rows;

pub use copy::{copy_pages, copy_runs, page_runs};
#[cfg(feature = "cuda")]
pub use cuda::{CudaKvPool, PinnedKvPool};
pub use host::HostKvPool;
pub use layout::{Kv, KvLayout, KvPool, KvPoolError};
pub use rows::with_kv_rows;
