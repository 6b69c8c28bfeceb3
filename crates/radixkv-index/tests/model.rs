//! The index against a model of what each source holds, on random event
//! streams: chains stored below any block the source knows (on either of
//! two media), removals of random sets of held blocks in random order
//! (parents and their children in one event, either order), clears. After
//! every batch, each path of the block universe scores, per (source,
//! medium), the blocks from its root held there without a break: what a
//! prefix match on that worker finds.

use radixkv_index::decode::{BlockHash, Event, Medium, Stored};
use radixkv_index::{KvIndex, Source};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};

const BS: usize = 2;
const BLOCKS: u64 = 60;
const MEDIA: [Medium; 2] = [Medium::Gpu, Medium::Cpu];

/// The universe: block `b` (1..=BLOCKS) has one parent (or none) and the
/// tokens `[BS·b, BS·b + BS)`, whoever stores it.
struct Universe {
    parent: Vec<Option<u64>>,
}

impl Universe {
    fn new(rng: &mut StdRng) -> Self {
        let mut parent = vec![None; BLOCKS as usize + 1];
        for b in 2..=BLOCKS {
            if rng.random_bool(0.85) {
                parent[b as usize] = Some(rng.random_range(b.saturating_sub(6).max(1)..b));
            }
        }
        Universe { parent }
    }

    /// Root → `b`.
    fn path(&self, b: u64) -> Vec<u64> {
        let mut p = vec![b];
        while let Some(q) = self.parent[*p.last().unwrap() as usize] {
            p.push(q);
        }
        p.reverse();
        p
    }

    fn tokens(path: &[u64]) -> Vec<u32> {
        path.iter()
            .flat_map(|&b| (0..BS as u32).map(move |j| b as u32 * BS as u32 + j))
            .collect()
    }
}

/// A source: the media holding each block.
#[derive(Default)]
struct Model {
    media: HashMap<u64, u8>,
}

impl Model {
    fn held(&self, b: u64, m: usize) -> bool {
        self.media.get(&b).is_some_and(|x| x & (1 << m) != 0)
    }

    /// Known to the source: held somewhere, or above a block that is.
    fn known(&self, u: &Universe, b: u64) -> bool {
        self.media
            .iter()
            .any(|(&c, &x)| x != 0 && u.path(c).contains(&b))
    }
}

fn step(rng: &mut StdRng, u: &Universe, m: &mut Model) -> Vec<Event> {
    let mut events = Vec::new();
    for _ in 0..rng.random_range(1..=3) {
        let r = rng.random_range(0..100);
        if r < 55 {
            // Store a chain ending at a random block, below the deepest
            // block of its path the source knows (or from any known
            // block above it).
            let path = u.path(rng.random_range(1..=BLOCKS));
            let known = path.iter().take_while(|&&b| m.known(u, b)).count();
            let from = rng.random_range(0..=known.min(path.len() - 1));
            let medium = rng.random_range(0..MEDIA.len());
            let chain = &path[from..];
            events.push(Event::Stored(Stored {
                hashes: chain.iter().map(|&b| BlockHash(b)).collect(),
                parent: from.checked_sub(1).map(|i| BlockHash(path[i])),
                tokens: Universe::tokens(chain),
                block_size: BS,
                medium: MEDIA[medium],
                lora_name: None,
                cache_salt: None,
            }));
            for &b in chain {
                *m.media.entry(b).or_default() |= 1 << medium;
            }
        } else if r < 97 {
            let medium = rng.random_range(0..MEDIA.len());
            let mut held: Vec<u64> = m
                .media
                .keys()
                .copied()
                .filter(|&b| m.held(b, medium))
                .collect();
            if held.is_empty() {
                continue;
            }
            held.sort();
            held.shuffle(rng);
            held.truncate(rng.random_range(1..=held.len().min(8)));
            events.push(Event::Removed {
                hashes: held.iter().map(|&b| BlockHash(b)).collect(),
                medium: MEDIA[medium],
            });
            for b in held {
                *m.media.entry(b).or_default() &= !(1 << medium);
            }
        } else {
            events.push(Event::Cleared);
            m.media.clear();
        }
    }
    m.media.retain(|_, x| *x != 0);
    events
}

#[test]
fn random_streams_score_as_the_sources_hold() {
    for seed in 0..12 {
        let mut rng = StdRng::seed_from_u64(seed);
        let u = Universe::new(&mut rng);
        let sources = [Source { worker: 1, rank: 0 }, Source { worker: 2, rank: 1 }];
        let mut models: Vec<Model> = sources.iter().map(|_| Model::default()).collect();
        // 24 tiers: the tree's sparse tier slots (4 of them used).
        let ix = KvIndex::new(BS, 24).unwrap();
        for round in 0..400 {
            let k = rng.random_range(0..sources.len());
            let events = step(&mut rng, &u, &mut models[k]);
            let (_, errors) = ix.apply(sources[k], &events);
            assert!(errors.is_empty(), "seed {seed} round {round}: {errors:?}");
            for b in 1..=BLOCKS {
                let path = u.path(b);
                let mut want = BTreeMap::new();
                for (s, model) in sources.iter().zip(&models) {
                    for (mi, medium) in MEDIA.iter().enumerate() {
                        let n = path.iter().take_while(|&&c| model.held(c, mi)).count();
                        if n > 0 {
                            want.insert((*s, *medium), n * BS);
                        }
                    }
                }
                let got: BTreeMap<_, _> = ix
                    .scores(&Universe::tokens(&path), None)
                    .into_iter()
                    .map(|s| ((s.source, s.medium), s.tokens))
                    .collect();
                assert_eq!(got, want, "seed {seed} round {round}, path to {b}");
            }
            if let Err(e) = ix.check() {
                panic!("seed {seed} round {round}: {e}");
            }
        }
        ix.check().unwrap();
    }
}
