//! Random concurrent histories for MeldDB, checked step by step.
//!
//! [`run`] executes a workload against a melder on an in-memory log: each
//! transaction runs on a snapshot up to `degree` log entries old, its
//! intention is appended and melded, and at every step the meld decision is
//! compared with the brute-force validator's, the tree invariants are
//! checked, and committed writes are applied to a `BTreeMap` model. The
//! returned records (what every transaction read and wrote) feed the SQLite
//! oracle in `tests/sqlite_oracle.rs`.

use std::collections::BTreeMap;
use std::ops::Bound;

use melddb::validate::{check_tree, vns, BruteAbort, BruteForce, IntentionSets};
use melddb::{Finished, Isolation, LogPos, Melder, Order, Outcome, Settings, Transaction};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Relative weights of operation kinds.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// `get` of a random key.
    pub read: u32,
    /// `get` then `put` of a random key.
    pub update: u32,
    /// blind `put` of a random key (usually absent).
    pub insert: u32,
    /// `delete` of a random key.
    pub delete: u32,
    /// ordered range scan with random bounds, direction and limit.
    pub scan: u32,
}

impl Mix {
    /// Every kind of operation.
    pub const ALL: Mix = Mix {
        read: 4,
        update: 3,
        insert: 2,
        delete: 2,
        scan: 1,
    };
    /// Point operations only.
    pub const POINT: Mix = Mix {
        read: 4,
        update: 3,
        insert: 2,
        delete: 2,
        scan: 0,
    };
}

/// A workload.
#[derive(Debug, Clone)]
pub struct Config {
    /// Key space size.
    pub keys: u64,
    /// Keys loaded before the workload (every `keys / initial`-th key).
    pub initial: u64,
    /// Largest conflict zone (log entries between snapshot and intention).
    pub degree: u64,
    /// Operations per transaction, inclusive range.
    pub ops: (usize, usize),
    /// Operation mix.
    pub mix: Mix,
    /// Skewed key choice (hot keys) instead of uniform.
    pub skew: bool,
    /// Isolation level, or `None` for a random level per transaction.
    pub isolation: Option<Isolation>,
    /// Number of transactions.
    pub txns: usize,
    /// RNG seed: the same seed gives the same history.
    pub seed: u64,
    /// Database settings.
    pub settings: Settings,
    /// Check tree invariants after every meld (slow for large runs).
    pub check_every_meld: bool,
    /// Meld keeps unchanged read-only intention subtrees (Hyder II §3.3).
    pub keep_readset: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            keys: 64,
            initial: 32,
            degree: 8,
            ops: (1, 8),
            mix: Mix::ALL,
            skew: false,
            isolation: None,
            txns: 200,
            seed: 1,
            settings: Settings::default(),
            check_every_meld: true,
            keep_readset: false,
        }
    }
}

/// One operation and what it observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `get(key)` returned the value.
    Get(Vec<u8>, Option<Vec<u8>>),
    /// `put(key, value)`.
    Put(Vec<u8>, Vec<u8>),
    /// `delete(key)` returned whether the key existed.
    Del(Vec<u8>, bool),
    /// A scan and the pairs it returned.
    Scan {
        /// Lower bound.
        start: Bound<Vec<u8>>,
        /// Upper bound.
        end: Bound<Vec<u8>>,
        /// Direction.
        order: Order,
        /// Limit.
        limit: Option<usize>,
        /// Returned pairs.
        out: Vec<(Vec<u8>, Vec<u8>)>,
    },
}

/// One transaction of a history.
#[derive(Debug, Clone)]
pub struct Record {
    /// Snapshot position it read.
    pub snapshot_pos: LogPos,
    /// Its level.
    pub isolation: Isolation,
    /// Operations in program order.
    pub ops: Vec<Op>,
    /// Meld's verdict (`ReadOnly` for read-only transactions).
    pub outcome: Outcome,
}

/// Counters of a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Committed update transactions.
    pub committed: u64,
    /// Aborted ones.
    pub aborted: u64,
    /// Read-only transactions.
    pub read_only: u64,
    /// Transactions meld aborted and the brute-force validator committed.
    pub extra_aborts: u64,
    /// Ephemeral nodes created.
    pub ephemeral: u64,
}

/// The result of a run that passed every step check.
#[derive(Debug)]
pub struct Run {
    /// Every transaction (the initial load excluded), in commit-attempt order.
    pub records: Vec<Record>,
    /// The keys loaded before the workload, in order.
    pub initial: Vec<(Vec<u8>, Vec<u8>)>,
    /// The final committed state.
    pub final_state: Vec<(Vec<u8>, Vec<u8>)>,
    /// Counters.
    pub counts: Counts,
}

/// A key as 8 big-endian bytes.
pub fn key(i: u64) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

fn pick_key(rng: &mut ChaCha8Rng, cfg: &Config) -> u64 {
    if cfg.skew {
        // Cube of a uniform draw: the low keys are hot.
        let u: f64 = rng.random();
        ((u * u * u) * cfg.keys as f64) as u64 % cfg.keys
    } else {
        rng.random_range(0..cfg.keys)
    }
}

fn random_isolation(rng: &mut ChaCha8Rng, cfg: &Config) -> Isolation {
    cfg.isolation
        .unwrap_or_else(|| match rng.random_range(0..3) {
            0 => Isolation::SnapshotIsolation,
            1 => Isolation::RepeatableRead,
            _ => Isolation::Serializable,
        })
}

fn random_bound(rng: &mut ChaCha8Rng, cfg: &Config) -> Bound<Vec<u8>> {
    match rng.random_range(0..5) {
        0 => Bound::Unbounded,
        1 | 2 => Bound::Included(key(rng.random_range(0..cfg.keys))),
        _ => Bound::Excluded(key(rng.random_range(0..cfg.keys))),
    }
}

fn run_ops(tx: &mut Transaction, rng: &mut ChaCha8Rng, cfg: &Config, id: usize) -> Vec<Op> {
    let n = rng.random_range(cfg.ops.0..=cfg.ops.1);
    let m = cfg.mix;
    let total = m.read + m.update + m.insert + m.delete + m.scan;
    let mut ops = Vec::with_capacity(n);
    for j in 0..n {
        let value = format!("t{id}.{j}").into_bytes();
        let mut x = rng.random_range(0..total);
        let k = key(pick_key(rng, cfg));
        if x < m.read {
            let v = tx.get(&k).expect("valid key");
            ops.push(Op::Get(k, v.map(|v| v.to_vec())));
            continue;
        }
        x -= m.read;
        if x < m.update {
            let v = tx.get(&k).expect("valid key");
            ops.push(Op::Get(k.clone(), v.map(|v| v.to_vec())));
            tx.put(&k, &value).expect("valid pair");
            ops.push(Op::Put(k, value));
            continue;
        }
        x -= m.update;
        if x < m.insert {
            tx.put(&k, &value).expect("valid pair");
            ops.push(Op::Put(k, value));
            continue;
        }
        x -= m.insert;
        if x < m.delete {
            let existed = tx.delete(&k).expect("valid key");
            ops.push(Op::Del(k, existed));
            continue;
        }
        let start = random_bound(rng, cfg);
        let end = random_bound(rng, cfg);
        let order = if rng.random_bool(0.5) {
            Order::Forward
        } else {
            Order::Reverse
        };
        let limit = if rng.random_bool(0.5) {
            Some(rng.random_range(1..6))
        } else {
            None
        };
        let out = tx
            .scan(
                start.as_ref().map(|b| &b[..]),
                end.as_ref().map(|b| &b[..]),
                order,
                limit,
            )
            .expect("valid bounds")
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        ops.push(Op::Scan {
            start,
            end,
            order,
            limit,
            out,
        });
    }
    ops
}

fn brute_matches(outcome: &Outcome, brute: &Result<(), BruteAbort>) -> Option<bool> {
    // Some(true) = same; Some(false) = meld aborted, brute committed (extra
    // abort); None = meld committed what brute aborted (a bug).
    match (outcome, brute) {
        (Outcome::Committed { .. }, Ok(())) => Some(true),
        (Outcome::Aborted { .. }, Err(_)) => Some(true),
        (Outcome::Aborted { .. }, Ok(())) => Some(false),
        _ => None,
    }
}

/// The pairs of a committed state as owned byte vectors.
fn pairs(s: &melddb::Snapshot) -> Vec<(Vec<u8>, Vec<u8>)> {
    s.to_vec()
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

/// Runs a workload, checking every step; `Err` describes the first violation.
pub fn run(cfg: &Config) -> Result<Run, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut melder = Melder::new(cfg.settings);
    melder.set_keep_readset(cfg.keep_readset);
    let mut brute = BruteForce::new(&cfg.settings);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut counts = Counts::default();
    let mut initial = Vec::new();

    // Initial load, in serial batches.
    let stride = (cfg.keys / cfg.initial.max(1)).max(1);
    let load: Vec<u64> = (0..cfg.keys)
        .step_by(stride as usize)
        .take(cfg.initial as usize)
        .collect();
    for chunk in load.chunks(512) {
        let mut tx = Transaction::begin(melder.lcs(), Isolation::SnapshotIsolation);
        for k in chunk {
            let v = format!("init{k}").into_bytes();
            tx.put(&key(*k), &v).map_err(|e| e.to_string())?;
            model.insert(key(*k), v.clone());
            initial.push((key(*k), v));
        }
        let Finished::Intention(bytes) = tx.finish().map_err(|e| e.to_string())? else {
            return Err("initial load produced no intention".into());
        };
        let pos = melder.next_pos();
        let int = melder.decode(pos, &bytes).map_err(|e| e.to_string())?;
        brute
            .decide(pos, int.snapshot_pos, IntentionSets::of(&int))
            .map_err(|e| format!("{e:?}"))?;
        if !melder.apply_decoded(Ok(int)).is_committed() {
            return Err("initial load aborted".into());
        }
    }
    let load_end = melder.lcs().pos();

    let mut records = Vec::with_capacity(cfg.txns);
    for id in 0..cfg.txns {
        let delta = rng.random_range(0..=cfg.degree);
        let snap_pos = melder.lcs().pos().saturating_sub(delta).max(load_end);
        let snapshot = melder
            .state_at(snap_pos)
            .ok_or_else(|| format!("state {snap_pos} not retained"))?
            .clone();
        let isolation = random_isolation(&mut rng, cfg);
        let mut tx = Transaction::begin(&snapshot, isolation);
        let ops = run_ops(&mut tx, &mut rng, cfg, id);
        let bytes = match tx.finish().map_err(|e| e.to_string())? {
            Finished::ReadOnly => {
                counts.read_only += 1;
                records.push(Record {
                    snapshot_pos: snap_pos,
                    isolation,
                    ops,
                    outcome: Outcome::ReadOnly,
                });
                continue;
            }
            Finished::Intention(b) => b,
        };
        let pos = melder.next_pos();
        let decoded = melder.decode(pos, &bytes);
        let verdict = match &decoded {
            Ok(int) => brute.decide(pos, int.snapshot_pos, IntentionSets::of(int)),
            Err(e) => return Err(format!("txn {id}: own intention rejected: {e}")),
        };
        let outcome = melder.apply_decoded(decoded);
        match brute_matches(&outcome, &verdict) {
            Some(true) => {}
            Some(false) => counts.extra_aborts += 1,
            None => {
                let zone: Vec<String> = records
                    .iter()
                    .filter(|r: &&Record| matches!(r.outcome, Outcome::Committed { pos: p, .. } if p > snap_pos))
                    .map(|r| format!("{:?} snap {} {:?}", r.outcome, r.snapshot_pos, r.ops))
                    .collect();
                return Err(format!(
                    "txn {id} at {pos} (snapshot {snap_pos}): meld {outcome:?} but brute force {verdict:?}; ops {ops:?}\nzone:\n{}",
                    zone.join("\n")
                ));
            }
        }
        counts.ephemeral += melder.last_stats().ephemeral_nodes;
        if outcome.is_committed() {
            counts.committed += 1;
            for op in &ops {
                match op {
                    Op::Put(k, v) => {
                        model.insert(k.clone(), v.clone());
                    }
                    // Deleting a key absent from the snapshot writes nothing.
                    Op::Del(k, true) => {
                        model.remove(k);
                    }
                    _ => {}
                }
            }
        } else {
            counts.aborted += 1;
        }
        if cfg.check_every_meld || id + 1 == cfg.txns {
            check_tree(melder.lcs()).map_err(|e| format!("txn {id} at {pos}: {e:?}"))?;
            let now = pairs(melder.lcs());
            let want: Vec<(Vec<u8>, Vec<u8>)> =
                model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            if now != want {
                return Err(format!(
                    "txn {id} at {pos} (snapshot {snap_pos}, {outcome:?}): tree differs from the model\n tree  {now:?}\n model {want:?}\n ops {ops:?}"
                ));
            }
            let mut v = vns(melder.lcs());
            let n = v.len();
            v.sort_unstable();
            v.dedup();
            if v.len() != n {
                return Err(format!("txn {id} at {pos}: duplicate VNs in the LCS"));
            }
            if v.last().is_some_and(|m| *m > melder.lcs().csn()) {
                return Err(format!("txn {id} at {pos}: VN beyond the CSN"));
            }
        }
        records.push(Record {
            snapshot_pos: snap_pos,
            isolation,
            ops,
            outcome,
        });
    }
    let final_state = pairs(melder.lcs());
    let model_state: Vec<(Vec<u8>, Vec<u8>)> = model.into_iter().collect();
    if final_state != model_state {
        return Err(format!(
            "final tree ({} keys) differs from the model ({} keys)",
            final_state.len(),
            model_state.len()
        ));
    }
    Ok(Run {
        records,
        initial,
        final_state,
        counts,
    })
}
