//! The protocol that lets readers walk the tree without a lock while
//! writers change it: who may change what, under which lock, and when
//! unlinked memory may be freed.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `lock.rs` | the lock guards every structural change goes through: [`ParentLocked`](lock::ParentLocked) becomes [`PairLocked`](lock::PairLocked); images and children are published only through them |
//! | `residency.rs` | the per-(node, tier) state word: pins, `RESIDENT`, generation; the pin/eviction CAS |
//! | `pin.rs` | [`HeldPin`](pin::HeldPin): an insert's pins, released on drop |
//! | `inbox.rs` | the leaf inbox: nodes that may have become eviction candidates |
//! | `reclaim.rs` | retired objects (type-erased) and the reclaimer that frees them after the grace period |
//!
//! # Readers
//!
//! Readers (`peek`, a match that does not split) hold an epoch guard and
//! take no lock. From a node `cur` they load its children, find the child
//! by page, and load the child's image (parent, key and values in one
//! immutable object). If the image's parent is not `cur`, a split has just
//! put a new node between them (and may not have published `cur`'s new
//! children yet): the reader climbs the parent links to the node now
//! hanging below `cur` and goes on from there, never waiting for the
//! splitter (`reader_parent_check`, `reader_never_waits`). Values are only
//! read *after* a pin on the end node succeeded, walking the images up to
//! the root (`pin_then_read`). A match that must split takes the two locks
//! only if they are free (`Locking::Try`); otherwise it reports the prefix
//! it has.
//!
//! # Writers
//!
//! Each structural change is a short transaction under the write locks of
//! the node it changes and its parent, parent first (`lock.rs`). The
//! transaction re-checks what it relied on (image unchanged, parent still
//! the parent, nodes not unlinked, parent resident) and reports a conflict
//! otherwise; the caller re-walks. Residency is added with the parent's
//! lock held and only when the parent is resident on that tier; it is
//! removed only when no child is resident on that tier, a count changed
//! only under the node's lock (`leaf_check`, `unlink_check`); splits and
//! evictions of a node take the same two locks (`split_recheck`). Pins are
//! lock-free CASes on the state word that eviction CASes too
//! (`evict_pin_check`).
//!
//! # Reclamation
//!
//! The tree holds one strong reference (`Arc`) to each linked node, named
//! by its parent's children (arrays and tables hold plain addresses);
//! parent links are raw pointers. An unlinked node's reference, replaced
//! images, arrays and tables are retired through the epoch (`reclaim.rs`),
//! so a reader that reached a node under its guard keeps that node (and,
//! transitively, its parent at that moment) alive until the guard drops
//! (`defer_destroy`, `table_retire`). Handles and leases hold an `Arc` to
//! their node but never follow its parent pointer unless a pin proves the
//! node is still linked.
//!
//! # Orderings
//!
//! Each file's docs give, per atomic, the ordering it uses and the edge it
//! carries. loom treats SeqCst as AcqRel, so the models passing proves
//! nothing about weakening a store→load edge: the residency word (a pin
//! reads it, then reads values through images; an eviction CASes it, then
//! publishes an image) and the image and children words it is ordered with
//! stay SeqCst. What is Relaxed carries no edge: advisory stamps and
//! statistics, id counters, hints.
//!
//! # Protecting steps and their controls
//!
//! Every step whose removal a loom model (`loom-tests/`) must catch is one
//! function named after the step, holding the step's one control,
//! `negative::removed("<step>")`: a loom build run with
//! `RADIXKV_NEGATIVE_STEP=<step>` (see `src/negative.rs`) makes the function
//! do what the step prevents, and the model must fail with its own message
//! (`loom-tests/negative.sh`; `scripts/check-core-structure.sh` fails if a
//! control stands anywhere else).

pub(crate) mod inbox;
pub(crate) mod lock;
pub(crate) mod pin;
pub(crate) mod reclaim;
pub(crate) mod residency;
