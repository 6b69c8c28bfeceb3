//! `Shared`: the state the sinks, the publisher and the socket tasks share
//! (every device's queue, the block index), with the cache's side
//! (`Shared::push`, `Shared::fan_out`: queueing a change) and the socket
//! task's side (`Shared::encode`: a queued change into KV events, chained
//! block ids and the block index kept up to date).

use super::queue::{lock, Changes, DeviceQueue, Head, Op};
use super::remembered::Remembered;
use crate::wire::{self, BatchEncoder, EventRef, Medium};
use radixkv::{Tier, TokenKey};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A published block, while some socket's tier holds it.
#[derive(Debug)]
pub(super) struct IndexedBlock {
    pub(super) parent: Option<u64>,
    pub(super) tokens: Box<[u32]>,
    pub(super) namespace: Option<Arc<str>>,
    /// Stores minus removals, over every socket (a host-tier block counts
    /// once per socket, as it is published).
    refs: u32,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) queues: Vec<DeviceQueue>,
    /// The next sink's tag.
    pub(super) next_tag: std::sync::atomic::AtomicU32,
    pub(super) index: Option<Mutex<std::collections::HashMap<u64, IndexedBlock>>>,
    pub(super) page_size: usize,
    pub(super) max_pending: usize,
    pub(super) closing: AtomicBool,
}

impl Shared {
    /// Queues a change on `device`'s queue. An event past
    /// [`KvEventsConfig::max_pending`] is dropped and counted; a split or
    /// a forget never is (what the task remembers must follow the tree).
    ///
    /// [`KvEventsConfig::max_pending`]: super::config::KvEventsConfig::max_pending
    pub(super) fn push(
        &self,
        device: usize,
        op: Op,
        who: (bool, u32, u64),
        namespace: Option<&str>,
        pages: &[u32],
    ) {
        let Some(q) = self.queues.get(device) else {
            return;
        };
        let event = op.kind().is_event();
        // Counted under the queue's lock, with no atomic of their own (an
        // atomic read-modify-write per event waits for the event's writes
        // to leave the core): the task adds them to the socket's counters
        // when it takes the queue.
        let mut p = lock(&q.pending);
        p.events += u64::from(event);
        // A node of 2^32 tokens or more (16 GiB of token ids) is not
        // published; nothing below it can be chained, so its children's
        // stores are dropped too, counted.
        if event && (p.heads.len() >= self.max_pending || u32::try_from(pages.len()).is_err()) {
            p.dropped += 1;
            return;
        }
        let first = p.heads.is_empty();
        p.push(op, who, namespace, pages);
        p.prepare_next(pages.len());
        drop(p);
        // The task ticks every max_delay while changes come, and parks only
        // after a run of empty ticks: only then does a change wake it (a
        // wake-up of a parked runtime thread is a system call, several
        // times an insert's cost). SeqCst: with the task's SeqCst store of
        // `parked` before it looks at the queue once more under the lock,
        // either that look sees this change or this load sees `parked`.
        if first && q.parked.load(Ordering::SeqCst) {
            q.notify.notify_one();
        }
    }

    /// Queues a change of `host`'s tier or `device` (`sink`: the device a
    /// one-device cache stands for). The host tier is shared: every
    /// device can load its pages, so every device's socket reports them
    /// (medium CPU).
    pub(super) fn fan_out(
        &self,
        tier: Tier,
        sink: Option<usize>,
        op: Op,
        who: (u32, u64),
        namespace: Option<&str>,
        pages: &[u32],
    ) {
        let who = (tier.is_host(), who.0, who.1);
        match tier {
            Tier::Host => {
                for d in 0..self.queues.len() {
                    self.push(d, op, who, namespace, pages);
                }
            }
            Tier::Device(device) => {
                self.push(sink.unwrap_or(device.index()), op, who, namespace, pages)
            }
        }
    }

    /// Appends `h`'s events to `b` and keeps what the task remembers
    /// (`mem`) and the block index (`ids`: a reused buffer); returns how
    /// many events it wrote. None for a split or a forget, or for an event
    /// whose node (or parent) the task does not know because its store was
    /// dropped at a full queue (counted as dropped by the caller); several
    /// for a cleared cache that shared this socket with another.
    pub(super) fn encode(
        &self,
        b: &mut BatchEncoder,
        (h, pages): (&Head, &[u32]),
        q: &Changes,
        mem: &mut Remembered,
        ids: &mut Vec<u64>,
    ) -> usize {
        let ps = self.page_size.max(1);
        let namespace = q.namespace(h);
        match h.op() {
            Op::Forget => {
                mem.forget(h.tag);
                0
            }
            Op::Cleared => {
                let alone = mem.sinks.iter().all(|(t, m)| *t == h.tag || m.is_empty());
                let nodes = mem.take(h.tag);
                for ids in nodes.values() {
                    self.index_removed(ids);
                }
                if alone {
                    b.push(EventRef::AllBlocksCleared);
                    return 1;
                }
                for ((host, _), ids) in &nodes {
                    b.push(EventRef::BlockRemoved {
                        block_hashes: ids,
                        medium: medium(*host),
                    });
                }
                nodes.len()
            }
            Op::Split { prefix, moved } => {
                let nodes = mem.of(h.tag);
                if let Some(all) = nodes.get_mut(&(h.host, h.node)) {
                    let cut = moved as usize / ps;
                    if cut > 0 && cut < all.len() {
                        let first: Box<[u64]> = all[..cut].into();
                        *all = all[cut..].into();
                        nodes.insert((h.host, prefix), first);
                    }
                }
                0
            }
            Op::Stored { parent } => {
                let nodes = mem.of(h.tag);
                let before = match parent {
                    None => None,
                    Some(p) => match nodes.get(&(h.host, p)).and_then(|i| i.last()) {
                        Some(&id) => Some(id),
                        None => return 0,
                    },
                };
                wire::chain_ids_into(before, namespace.map(|n| &**n), pages, ps, ids);
                nodes.insert((h.host, h.node), ids.as_slice().into());
                if let Some(index) = &self.index {
                    let mut index = lock(index);
                    for (i, &id) in ids.iter().enumerate() {
                        index
                            .entry(id)
                            .or_insert_with(|| IndexedBlock {
                                parent: if i == 0 { before } else { Some(ids[i - 1]) },
                                tokens: pages[i * ps..(i + 1) * ps].into(),
                                namespace: namespace.cloned(),
                                refs: 0,
                            })
                            .refs += 1;
                    }
                }
                let (lora_name, cache_salt) =
                    namespace.map_or((None, None), |n| TokenKey::namespace_parts(n));
                b.push(EventRef::BlockStored {
                    parent_block_hash: before,
                    block_hashes: ids,
                    token_ids: pages,
                    block_size: ps,
                    medium: medium(h.host),
                    lora_name,
                    cache_salt,
                });
                1
            }
            Op::Removed => {
                let Some(known) = mem.of(h.tag).remove(&(h.host, h.node)) else {
                    return 0;
                };
                self.index_removed(&known);
                b.push(EventRef::BlockRemoved {
                    block_hashes: &known,
                    medium: medium(h.host),
                });
                1
            }
        }
    }

    /// Takes a removal of blocks `ids` into the block index.
    fn index_removed(&self, ids: &[u64]) {
        if let Some(index) = &self.index {
            let mut index = lock(index);
            for id in ids {
                if let Some(b) = index.get_mut(id) {
                    b.refs -= 1;
                    if b.refs == 0 {
                        index.remove(id);
                    }
                }
            }
        }
    }
}

/// The medium of a tier's events.
fn medium(host: bool) -> Medium {
    if host {
        Medium::Cpu
    } else {
        Medium::Gpu
    }
}
