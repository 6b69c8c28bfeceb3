//! The passes: prefill and decode batches, what follows each, retraction,
//! and finishing or failing requests.

use super::interface::{CacheOp, Completion, RequestError, StreamEvent};
use super::state::{emit, next_token, prompt_key, Entry, Scheduler};
use crate::sched::batch::{Batch, DecodeWork, PrefillWork, WorkData};
use crate::tiers::WritePolicy;
use radixkv::cache::{CacheError, TokenKey};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

impl Scheduler {
    pub(super) fn chunk_of(&self, extend: usize) -> usize {
        match self.cfg.chunked_prefill_size {
            0 => extend,
            c => extend.min(c),
        }
    }

    pub(super) fn prefill_batch(&mut self) -> Batch {
        let mut b = Batch {
            copy_time: std::mem::take(&mut self.copy_wait),
            ..Batch::default()
        };
        let data = self.backend.wants_data();
        for r in &self.running {
            if r.computed < r.prompt {
                let new = self.chunk_of(r.prompt - r.computed);
                let end = r.computed + new;
                b.prefill.push(PrefillWork {
                    request: r.entry.job.id,
                    new_tokens: new,
                    context_tokens: r.computed,
                    samples: end >= r.prompt,
                    data: data.then(|| {
                        let mut slots = r.req.slots();
                        slots.truncate(end);
                        WorkData {
                            tokens: r.req.tokens()[..end].to_vec(),
                            slots,
                            sampling: r.entry.job.sampling,
                        }
                    }),
                });
            }
        }
        b
    }

    pub(super) fn after_prefill(
        &mut self,
        batch: &Batch,
        sampled: &HashMap<u64, u32>,
    ) -> Result<(), CacheError> {
        let now = Instant::now();
        self.stats.prefill_passes += 1;
        let mut done = Vec::new();
        // Prompts settled in this pass that the write policy sends to the
        // host: (tokens, namespace).
        let mut writes: Vec<(Vec<u32>, Option<Arc<str>>)> = Vec::new();
        let ps = self.cache.page_size().max(1);
        for (i, r) in self.running.iter_mut().enumerate() {
            let Some(p) = batch.prefill.iter().find(|p| p.request == r.entry.job.id) else {
                continue;
            };
            self.stats.prefill_tokens += p.new_tokens as u64;
            r.computed += p.new_tokens;
            // Cache what is computed so far (the whole prompt once done),
            // pinning the new end before the old pin goes.
            let t = Instant::now();
            r.req.commit_chunk(r.computed)?;
            self.events
                .cache_op(self.reported, CacheOp::Insert, t.elapsed());
            if r.computed < r.prompt {
                continue;
            }
            if r.computing {
                r.computing = false;
                self.events.computed(prompt_key(&r.req, ps), self.reported);
            }
            if !r.entry.settled {
                r.entry.settled = true;
                self.events.prompt_settled(&r.entry.job, self.reported);
                let upto = match self.tiers.write {
                    WritePolicy::WriteThrough => r.prompt / ps * ps,
                    // The reused prefix, once hit often enough.
                    WritePolicy::WriteThroughSelective
                        if r.req.prefix_hits() >= self.tiers.selective_hits =>
                    {
                        r.reused
                    }
                    _ => 0,
                };
                if upto > 0 && self.host.is_some() && self.tiers.copy.host() {
                    writes.push((
                        r.req.tokens()[..upto].to_vec(),
                        r.entry.job.namespace.clone(),
                    ));
                }
            }
            // The pass also produced the first output token.
            let tok = next_token(&r.entry, sampled.get(&r.entry.job.id).copied());
            emit(&r.entry, tok);
            r.entry.generated.push(tok);
            r.entry.first_token.get_or_insert(now);
            if r.entry.generated.len() >= r.entry.job.output_len {
                // The last token is never fed back, so it has no KV: it must
                // not join the request's tokens, or `finish` would cache a
                // slot nothing wrote.
                done.push(i);
            } else {
                r.req.extend(&[tok]);
            }
        }
        for (tokens, ns) in writes {
            self.write_to_host(TokenKey::new(&tokens).in_namespace(ns.as_deref()));
        }
        self.finish(done)
    }

    pub(super) fn decode_batch(&mut self) -> Result<Batch, CacheError> {
        let mut b = Batch::default();
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            if r.computed < r.prompt {
                i += 1;
                continue;
            }
            // The token produced last pass needs a slot before this pass.
            let short = r.req.backed_len() < r.req.tokens().len();
            if short {
                self.make_room(self.cache.page_size());
            }
            let r = &mut self.running[i];
            if short && r.req.reserve().is_err() {
                match self.retract_for(i) {
                    None => break,
                    // Someone else was retracted: look at `i` again (it
                    // moved down by one if the victim came before it).
                    Some(v) if v < i => i -= 1,
                    // `i` itself, or one after it: `i` is the next one now.
                    Some(_) => {}
                }
                continue;
            }
            let r = &self.running[i];
            let len = r.req.tokens().len();
            b.decode.push(DecodeWork {
                request: r.entry.job.id,
                context_tokens: len,
                data: self.backend.wants_data().then(|| {
                    let mut slots = r.req.slots();
                    slots.truncate(len);
                    WorkData {
                        tokens: r.req.tokens().to_vec(),
                        slots,
                        sampling: r.entry.job.sampling,
                    }
                }),
            });
            i += 1;
        }
        // Retraction may have removed requests already in the batch.
        b.decode
            .retain(|d| self.running.iter().any(|r| r.entry.job.id == d.request));
        Ok(b)
    }

    /// Retracts one decoding request (fewest output tokens, then longest
    /// prompt; SGLang's order) so that request `i` can get a page; returns
    /// the victim's index, or `None` when nothing could be retracted.
    pub(super) fn retract_for(&mut self, i: usize) -> Option<usize> {
        let victim = (0..self.running.len())
            .filter(|&j| self.running[j].computed >= self.running[j].prompt)
            .min_by_key(|&j| {
                let r = &self.running[j];
                (
                    r.entry.generated.len(),
                    std::cmp::Reverse(r.entry.job.tokens.len()),
                    j != i,
                )
            });
        let v = victim?;
        let r = self.running.remove(v);
        self.done_computing(&r);
        drop(r.req); // pages back, pin released, nothing cached
        self.backend.release(self.reported, r.entry.job.id);
        let mut entry = r.entry;
        entry.retractions += 1;
        self.stats.retractions += 1;
        let span = self.cfg.init_new_token_ratio - self.cfg.min_new_token_ratio;
        self.ratio = (self.ratio + span / 2.0).min(1.0);
        let job = entry.job.clone();
        self.enqueue(job, Some(entry));
        Some(v)
    }

    pub(super) fn after_decode(&mut self, sampled: &HashMap<u64, u32>) -> Result<(), CacheError> {
        self.stats.decode_passes += 1;
        let steps = self.cfg.new_token_ratio_decay_steps.max(1) as f64;
        let decay = (self.cfg.init_new_token_ratio - self.cfg.min_new_token_ratio) / steps;
        self.ratio = (self.ratio - decay).max(self.cfg.min_new_token_ratio);
        let mut done = Vec::new();
        for (i, r) in self.running.iter_mut().enumerate() {
            if r.computed < r.prompt {
                continue;
            }
            let tok = next_token(&r.entry, sampled.get(&r.entry.job.id).copied());
            emit(&r.entry, tok);
            r.entry.generated.push(tok);
            if r.entry.generated.len() >= r.entry.job.output_len {
                done.push(i); // the last token has no KV: not cached (above)
            } else {
                r.req.extend(&[tok]);
            }
        }
        self.finish(done)
    }

    /// Finishes the running requests at `done` (ascending indices).
    pub(super) fn finish(&mut self, done: Vec<usize>) -> Result<(), CacheError> {
        let now = Instant::now();
        for i in done.into_iter().rev() {
            let r = self.running.remove(i);
            // Prompt and every generated token but the last (which has no
            // KV), in whole pages.
            let t = Instant::now();
            let result = r.req.finish();
            self.events
                .cache_op(self.reported, CacheOp::Insert, t.elapsed());
            self.backend.release(self.reported, r.entry.job.id);
            let c = r
                .entry
                .completion(self.reported, now, result.err().map(RequestError::from));
            self.complete(&r.entry, c);
        }
        Ok(())
    }

    pub(super) fn fail_all(&mut self, why: RequestError) {
        let mut entries: Vec<Entry> = Vec::new();
        for r in std::mem::take(&mut self.running) {
            self.done_computing(&r);
            drop(r.req);
            entries.push(r.entry);
        }
        self.waiting.clear();
        entries.extend(self.entries.drain().map(|(_, e)| e));
        for e in entries {
            self.fail(e, why.clone());
        }
    }

    /// Ends a request that did not finish (its pages are already back).
    pub(super) fn fail(&mut self, e: Entry, why: RequestError) {
        self.end(e, Some(why));
    }

    /// Ends a request that left before its natural end (its pages are
    /// already back): failed with `error`, or finished early without.
    pub(super) fn end(&mut self, e: Entry, error: Option<RequestError>) {
        let now = Instant::now();
        self.backend.release(self.reported, e.job.id);
        if !e.settled {
            self.events.prompt_settled(&e.job, self.reported);
        }
        let c = e.completion(self.reported, now, error);
        self.complete(&e, c);
    }

    pub(super) fn complete(&self, e: &Entry, c: Completion) {
        // The engine's accounting first: a client that sees `Done` sees the
        // request no longer outstanding.
        let done = e.job.stream.as_ref().map(|s| (s, c.clone()));
        self.events.completed(&e.job, c);
        if let Some((s, c)) = done {
            let _ = s.send(StreamEvent::Done(c));
        }
    }
}
