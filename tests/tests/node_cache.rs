//! The node cache (meld paper §5: nodes not in memory are read back by
//! their address): a node whose persisted subtrees were replaced by stubs
//! reads, writes, melds and decides exactly as one that keeps everything in
//! memory — same reads, same intention bytes, same outcomes, same state
//! digests — while holding less of the tree in memory. Failed read-backs
//! are reported, never silently used.

use std::ops::Bound;
use std::sync::Arc;

use melddb::cache::MemStore;
use melddb::checkpoint;
use melddb::validate::check_tree;
use melddb::{Isolation, Melder, NodeStore, Order, Settings, Transaction};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The parts of a checkpoint of `state` as generation `generation`: its
/// nodes now know their addresses there.
fn persist(
    settings: &Settings,
    state: &melddb::Snapshot,
    part_bytes: usize,
    generation: u16,
) -> Vec<Vec<u8>> {
    let mut parts = Vec::new();
    checkpoint::encode_streaming(settings, state, part_bytes, Some(generation), |p| {
        parts.push(p);
        true
    })
    .expect("encode");
    parts
}

fn key(i: u64) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

/// A melder holding keys 0..50·`chunks`, written 50 to a transaction,
/// with `value(i)` at key `i`.
fn filled(settings: Settings, chunks: u64, value: impl Fn(u64) -> Vec<u8>) -> Melder {
    let mut m = Melder::new(settings);
    for chunk in 0..chunks {
        let mut tx = Transaction::begin(m.lcs(), Isolation::Serializable);
        for i in chunk * 50..(chunk + 1) * 50 {
            tx.put(&key(i), &value(i)).expect("put");
        }
        let melddb::Finished::Intention(b) = tx.finish().expect("finish") else {
            panic!("writes")
        };
        m.apply(&b);
    }
    m
}

#[derive(Clone, Debug)]
enum Op {
    Get(u64),
    Put(u64, usize),
    Delete(u64),
    Scan(u64, u64, bool, usize),
}

/// Runs `ops` on a transaction and returns what it read, as text.
fn run(tx: &mut Transaction, ops: &[Op], salt: u64) -> Vec<String> {
    let mut seen = Vec::new();
    for op in ops {
        match op {
            Op::Get(k) => seen.push(format!("{:?}", tx.get(&key(*k)).expect("get"))),
            Op::Put(k, len) => {
                let v = vec![(salt % 251) as u8; *len];
                tx.put(&key(*k), &v).expect("put");
            }
            Op::Delete(k) => seen.push(format!("{:?}", tx.delete(&key(*k)).expect("delete"))),
            Op::Scan(a, b, rev, limit) => {
                let order = if *rev { Order::Reverse } else { Order::Forward };
                let r = tx
                    .range(
                        Bound::Included(&key(*a)[..]),
                        Bound::Excluded(&key(*b)[..]),
                        order,
                        Some(*limit),
                    )
                    .collect::<Result<Vec<_>, _>>()
                    .expect("scan");
                seen.push(format!("{r:?}"));
            }
        }
    }
    seen
}

struct Shape {
    seed: u64,
    txns: usize,
    keys: u64,
    degree: u64,
    /// Checkpoint into the store and evict every this many transactions.
    every: usize,
}

/// Plays one random history on a plain melder and on one whose persisted
/// subtrees are evicted now and then; everything observable must agree.
/// Returns (store reads, smallest memory ratio cached/plain seen).
fn agree(shape: Shape) -> (u64, f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(shape.seed);
    let settings = Settings {
        db_id: 11,
        max_conflict_zone: 32,
        ..Settings::default()
    };
    let mut plain = Melder::new(settings);
    let mut cached = Melder::new(settings);
    let store = Arc::new(MemStore::new());
    let dyn_store: Arc<dyn NodeStore> = store.clone();
    let mut generation = 0u16;
    let mut gone = 0u16;
    let mut ratio = f64::MAX;
    for t in 0..shape.txns {
        let lcs = plain.lcs().pos();
        let snap = lcs - rng.random_range(0..=shape.degree).min(lcs);
        let isolation = match rng.random_range(0..3) {
            0 => Isolation::Serializable,
            1 => Isolation::RepeatableRead,
            _ => Isolation::SnapshotIsolation,
        };
        let ops: Vec<Op> = (0..rng.random_range(1..8))
            .map(|_| match rng.random_range(0..10) {
                0..=2 => Op::Get(rng.random_range(0..shape.keys)),
                3..=6 => Op::Put(rng.random_range(0..shape.keys), rng.random_range(0..40)),
                7 => Op::Delete(rng.random_range(0..shape.keys)),
                _ => {
                    let a = rng.random_range(0..shape.keys);
                    Op::Scan(a, a + rng.random_range(1..20), rng.random_bool(0.5), 5)
                }
            })
            .collect();
        let mut ta = Transaction::begin(plain.state_at(snap).expect("retained"), isolation);
        let mut tb = Transaction::begin(cached.state_at(snap).expect("retained"), isolation);
        let salt = t as u64;
        assert_eq!(
            run(&mut ta, &ops, salt),
            run(&mut tb, &ops, salt),
            "reads differ"
        );
        let fa = ta.finish().expect("finish");
        let fb = tb.finish().expect("finish");
        let bytes = match (fa, fb) {
            (melddb::Finished::Intention(a), melddb::Finished::Intention(b)) => {
                assert_eq!(a, b, "intention bytes differ at txn {t}");
                a
            }
            (melddb::Finished::ReadOnly, melddb::Finished::ReadOnly) => continue,
            (a, b) => panic!("different kinds of finish: {a:?} / {b:?}"),
        };
        let oa = plain.apply(&bytes);
        let ob = if generation > 0 && rng.random_bool(0.3) {
            // Decoded before a sweep and melded after it, as a pipelined
            // host does: the intention's pointers are into the tree as it
            // was before the sweep.
            let decoded = cached.decode(cached.next_pos(), &bytes);
            cached.evict(&dyn_store, &|_| true);
            vec![cached.apply_decoded(decoded)]
        } else {
            cached.apply(&bytes)
        };
        assert_eq!(cached.read_error(), None);
        assert_eq!(oa, ob, "outcomes differ at txn {t}");
        assert_eq!(
            plain.lcs().digest().unwrap(),
            cached.lcs().digest().unwrap(),
            "states differ at txn {t}"
        );
        if t % shape.every == shape.every - 1 {
            // Persist the cached node's state as a new generation (as a
            // checkpoint would) and sweep; sometimes only sweep (CLOCK).
            if rng.random_bool(0.7) {
                generation += 1;
                let parts = persist(&settings, cached.lcs(), 512, generation);
                store.add(generation, &parts).expect("parts");
            }
            cached.evict(&dyn_store, &|_| true);
            // As a trimmed log would: drop what no stub reads from any
            // more. The sweep moved the stubs it reached to the newest
            // checkpoint, so older ones are usually free at once.
            for g in (gone + 1)..generation.saturating_sub(1) {
                if store.pins(g) > 0 {
                    break;
                }
                store.remove(g);
                gone = g;
            }
            let (a, b) = (plain.lcs().approx_bytes(), cached.lcs().approx_bytes());
            if a > 0 {
                ratio = ratio.min(b as f64 / a as f64);
            }
            assert_eq!(
                plain.lcs().digest().unwrap(),
                cached.lcs().digest().unwrap(),
                "evict changed the state"
            );
            assert_eq!(cached.read_error(), None);
        }
    }
    check_tree(cached.lcs()).expect("the cached tree is valid");
    // A checkpoint of the LCS and a sweep right after it: every stub the
    // LCS reaches now reads from that newest checkpoint, so once the older
    // states are gone no older checkpoint is pinned.
    generation += 1;
    let parts = persist(&settings, cached.lcs(), 512, generation);
    store.add(generation, &parts).expect("parts");
    cached.evict(&dyn_store, &|_| true);
    let lcs = cached.lcs().clone();
    drop(cached);
    for g in 1..generation {
        assert_eq!(store.pins(g), 0, "checkpoint {g} is still pinned");
    }
    assert_eq!(lcs.to_vec().unwrap(), plain.lcs().to_vec().unwrap());
    let cached = lcs;
    assert_eq!(plain.lcs().to_vec().unwrap(), cached.to_vec().unwrap());
    (store.reads(), ratio)
}

#[test]
fn cached_node_agrees_with_plain_node() {
    let (reads, ratio) = agree(Shape {
        seed: 1,
        txns: 3000,
        keys: 400,
        degree: 8,
        every: 50,
    });
    assert!(
        reads > 1000,
        "the cached node read nodes back ({reads} reads)"
    );
    assert!(
        ratio < 0.5,
        "evicting freed memory (smallest ratio {ratio:.2})"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn cached_node_agrees_for_any_history(
        seed in any::<u64>(),
        keys in 5u64..200,
        degree in 0u64..10,
        every in 1usize..30,
    ) {
        agree(Shape { seed, txns: 300, keys, degree, every });
    }
}

/// A database with stubs whose checkpoint is gone (trimmed) or damaged:
/// reads record a typed error instead of returning made-up data silently.
#[test]
fn failed_read_back_is_reported() {
    let settings = Settings {
        db_id: 3,
        ..Settings::default()
    };
    let mut m = filled(settings, 4, |_| b"value".to_vec());
    let store = Arc::new(MemStore::new());
    let dyn_store: Arc<dyn NodeStore> = store.clone();
    let parts = persist(&settings, m.lcs(), 4096, 1);
    store.add(1, &parts).expect("parts");
    let before = m.lcs().to_vec().unwrap();
    let unevicted = m.clone();
    let ev = m.evict(&dyn_store, &|_| true);
    assert!(ev.stubbed >= 1);
    // The whole LCS is one persisted subtree: one stub is left in memory.
    assert!(
        m.lcs().approx_bytes() < 400,
        "{} bytes in memory",
        m.lcs().approx_bytes()
    );
    assert_eq!(
        m.lcs().get(&key(7)).unwrap().as_deref(),
        Some(&b"value"[..])
    );
    assert_eq!(m.lcs().to_vec().unwrap(), before);

    // Evict again and lose the checkpoint: reads fail and say why.
    m.evict(&dyn_store, &|_| true);
    m.evict(&dyn_store, &|_| true);
    store.remove(1);
    match m.lcs().get(&key(120)) {
        Err(melddb::StoreError::Read { .. }) => {}
        other => panic!("expected a read error, got {other:?}"),
    }

    // A bit flipped on the way back: the record's checksum catches it.
    let corrupt = Arc::new(CorruptingStore {
        inner: MemStore::new(),
    });
    corrupt.inner.add(1, &parts).expect("parts");
    let dyn_corrupt: Arc<dyn NodeStore> = corrupt.clone();
    let mut fresh = unevicted;
    fresh.evict(&dyn_corrupt, &|_| true);
    match fresh.lcs().get(&key(7)) {
        Err(melddb::StoreError::Corrupt { .. }) => {}
        other => panic!("expected a corruption error, got {other:?}"),
    }
}

/// Flips one bit in every read.
struct CorruptingStore {
    inner: MemStore,
}

impl NodeStore for CorruptingStore {
    fn read(&self, addr: melddb::NodeAddr, len: usize) -> Result<Vec<u8>, melddb::StoreError> {
        let mut b = self.inner.read(addr, len)?;
        if b.len() > 3 {
            b[3] ^= 0x10;
        }
        Ok(b)
    }
}

/// Serves checkpoint bodies with one bit flipped at a chosen body offset.
struct FlippingStore {
    inner: MemStore,
    at: u64,
    bit: u8,
}

impl NodeStore for FlippingStore {
    fn read(&self, addr: melddb::NodeAddr, len: usize) -> Result<Vec<u8>, melddb::StoreError> {
        let mut b = self.inner.read(addr, len)?;
        let from = addr.offset();
        if self.at >= from && self.at < from + b.len() as u64 {
            b[(self.at - from) as usize] ^= 1 << (self.bit % 8);
        }
        Ok(b)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    /// Damage in what the store returns, anywhere in the body: reading the
    /// tree back never panics, and never returns wrong data silently —
    /// either everything matches or a `StoreError` was recorded.
    #[test]
    fn damaged_read_backs_are_caught(at_frac in 0.0f64..1.0, bit in 0u8..8, keys in 1u64..300) {
        let settings = Settings { db_id: 5, ..Settings::default() };
        let mut m = Melder::new(settings);
        let mut tx = Transaction::begin(m.lcs(), Isolation::Serializable);
        for i in 0..keys {
            tx.put(&key(i), format!("value {i}").as_bytes()).expect("put");
        }
        let melddb::Finished::Intention(b) = tx.finish().expect("finish") else {
            panic!("writes")
        };
        m.apply(&b);
        let expected = m.lcs().to_vec().unwrap();
        let parts = persist(&settings, m.lcs(), 1024, 1);
        let body_len = parts
            .iter()
            .map(|p| match checkpoint::parse_record(p) {
                Ok(checkpoint::Record::Part { chunk, .. }) => chunk.len() as u64,
                _ => 0,
            })
            .sum::<u64>();
        let at = (at_frac * body_len as f64) as u64;
        let store = Arc::new(FlippingStore { inner: MemStore::new(), at, bit });
        store.inner.add(1, &parts).expect("parts");
        let dyn_store: Arc<dyn NodeStore> = store;
        m.evict(&dyn_store, &|_| true);
        if let Ok(got) = m.lcs().to_vec() {
            prop_assert_eq!(got, expected);
        }
        // A transaction on the damaged tree fails cleanly too.
        let mut tx = Transaction::begin(m.lcs(), Isolation::Serializable);
        let r = tx.get(&key(keys / 2));
        if let Ok(v) = r {
            let want = format!("value {}", keys / 2);
            prop_assert_eq!(v.as_deref(), Some(want.as_bytes()));
        }
    }
}

/// After a newer checkpoint completes, `Melder::promote` moves every stub
/// (loaded or not) to read from it, so the older checkpoint is no longer
/// pinned and can be trimmed; reads keep working without it.
#[test]
fn promote_moves_stubs_to_the_newest_checkpoint() {
    let settings = Settings {
        db_id: 5,
        ..Settings::default()
    };
    let mut m = filled(settings, 6, |i| format!("v{}", i % 50).into_bytes());
    let before = m.lcs().to_vec().unwrap();
    let store = Arc::new(MemStore::new());
    let dyn_store: Arc<dyn NodeStore> = store.clone();
    // As a host does: a checkpoint's begin record (a barrier: older states
    // are dropped, the checkpoint holds everything still retained), then
    // its parts from the state at the barrier.
    m.apply(&checkpoint::begin_record(settings.db_id));
    store
        .add(1, &persist(&settings, m.lcs(), 4096, 1))
        .expect("parts");
    assert!(m.evict(&dyn_store, &|g| g == 1).stubbed >= 1);
    // Loads some bodies: their children are stubs of generation 1 too.
    for i in (0..300).step_by(37) {
        assert!(m.lcs().get(&key(i)).unwrap().is_some());
    }
    assert!(store.pins(1) > 0, "stubs read from checkpoint 1");

    m.apply(&checkpoint::begin_record(settings.db_id));
    store
        .add(2, &persist(&settings, m.lcs(), 4096, 2))
        .expect("parts");
    assert_eq!(m.read_error(), None);
    m.promote(&|g| g == 1 || g == 2);
    assert_eq!(store.pins(1), 0, "nothing reads from checkpoint 1 any more");
    assert!(store.pins(2) > 0, "stubs read from checkpoint 2");
    store.remove(1);
    assert_eq!(
        m.lcs().to_vec().unwrap(),
        before,
        "every read-back found its node"
    );

    // A melder that starts from a lazily loaded checkpoint holds a stub
    // from the start (its root): promote must move it too.
    let parts3 = persist(&settings, m.lcs(), 4096, 3);
    store.add(3, &parts3).expect("parts");
    let lazy = checkpoint::load_lazy(
        parts3.iter().map(Ok::<_, melddb::CheckpointError>),
        dyn_store.clone(),
        3,
    )
    .expect("lazy load");
    let mut r = Melder::from_checkpoint(lazy);
    assert!(store.pins(3) > 0, "the root stub reads from checkpoint 3");
    r.apply(&checkpoint::begin_record(settings.db_id));
    store
        .add(4, &persist(&settings, r.lcs(), 4096, 4))
        .expect("parts");
    r.promote(&|g| g == 3 || g == 4);
    assert_eq!(store.pins(3), 0, "nothing reads from checkpoint 3 any more");
    store.remove(3);
    assert_eq!(
        r.lcs().to_vec().unwrap(),
        before,
        "every read-back found its node"
    );
}
