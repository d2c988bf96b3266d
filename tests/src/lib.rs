//! Random concurrent histories for MeldDB, checked step by step.
//!
//! [`run`] executes a workload against a melder on an in-memory log: each
//! transaction runs on a snapshot up to `degree` log entries old, its
//! intention is appended and melded, and at every step the meld decision is
//! compared with the brute-force validator's, the tree invariants are
//! checked, and committed writes are applied to a `BTreeMap` model. The
//! returned records (what every transaction read and wrote) feed the SQLite
//! oracle in `tests/sqlite_oracle.rs`.

pub mod conformance;

use std::collections::BTreeMap;
use std::ops::Bound;

use melddb::validate::{check_tree, vns, BruteAbort, BruteForce, IntentionSets};
use melddb::{
    pipeline, Finished, Isolation, LogPos, Melder, Order, Outcome, Settings, Transaction,
};
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
    /// Digest of the final state.
    pub digest: String,
    /// The log: the genesis record, then every entry in order.
    pub log: Vec<Vec<u8>>,
}

/// Default settings with premeld threads `t`, distance `d` and group meld.
pub fn pipeline_settings(t: u32, d: u32, group: bool) -> Settings {
    Settings {
        premeld_threads: t,
        premeld_distance: d,
        group_meld: group,
        ..Settings::default()
    }
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
            .range(
                start.as_ref().map(|b| &b[..]),
                end.as_ref().map(|b| &b[..]),
                order,
                limit,
            )
            .collect::<Result<Vec<_>, _>>()
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
        .expect("an in-memory tree reads")
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

/// Key-value pairs as owned byte vectors.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// What the harness knows about a log entry until its outcome arrives.
struct Pending {
    /// Index into the records (`None` for the initial load and fillers).
    record: Option<usize>,
    snapshot_pos: LogPos,
    /// Read/range/write sets of the decoded intention (`None`: undecodable).
    sets: Option<IntentionSets>,
}

/// The melder under test, its log, and the checks of every outcome against
/// the brute-force validator (pairwise under group meld) and the model.
struct Harness {
    settings: Settings,
    melder: Melder,
    /// The genesis record, then every entry in order.
    log: Vec<Vec<u8>>,
    records: Vec<Record>,
    counts: Counts,
    brute: BruteForce,
    pending: BTreeMap<LogPos, Pending>,
    model: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Writes of the initial load, applied to the model when it commits.
    load: BTreeMap<LogPos, Pairs>,
}

impl Harness {
    /// Appends one entry, feeds it to the melder and checks what got
    /// decided.
    fn append(&mut self, bytes: Vec<u8>, record: Option<usize>) -> Result<Vec<Outcome>, String> {
        let pos = self.melder.next_pos();
        let (snapshot_pos, sets) = match self.melder.decode(pos, &bytes) {
            Ok(int) => (int.snapshot_pos, Some(IntentionSets::of(&int))),
            Err(e) if record.is_some() => return Err(format!("own intention rejected: {e}")),
            Err(_) => (0, None),
        };
        self.pending.insert(
            pos,
            Pending {
                record,
                snapshot_pos,
                sets,
            },
        );
        let outcomes = self.melder.apply(&bytes);
        self.log.push(bytes);
        self.counts.ephemeral += self.melder.last_stats().ephemeral_nodes;
        self.settle(&outcomes)?;
        Ok(outcomes)
    }

    /// Group meld: closes a pending pair with a filler (aborted as
    /// malformed), so every entry so far is decided.
    fn close_pair(&mut self) -> Result<(), String> {
        if self.melder.next_pos() != self.melder.lcs().pos() + 1 {
            self.append(Vec::new(), None)?;
        }
        Ok(())
    }

    fn settle(&mut self, outcomes: &[Outcome]) -> Result<(), String> {
        let mut verdicts = Vec::new();
        if outcomes.len() == 2 && self.settings.group_meld {
            let (pa, pb) = (
                outcomes[0].pos().unwrap_or(0),
                outcomes[1].pos().unwrap_or(0),
            );
            let a = self.pending.remove(&pa).ok_or("unknown entry")?;
            let b = self.pending.remove(&pb).ok_or("unknown entry")?;
            // Both members are brought to the later of their premeld bases.
            let base = |pos, snap| pipeline::premeld_base(&self.settings, pos, snap);
            let q = base(pa, a.snapshot_pos).max(base(pb, b.snapshot_pos));
            let (ra, rb) = self.brute.decide_pair(
                (pa, a.snapshot_pos, a.sets.clone()),
                (pb, b.snapshot_pos, b.sets.clone()),
                q,
            );
            verdicts.push((a, ra));
            verdicts.push((b, rb));
        } else {
            for o in outcomes {
                let pos = o.pos().unwrap_or(0);
                let e = self.pending.remove(&pos).ok_or("unknown entry")?;
                let v = match &e.sets {
                    Some(sets) => self.brute.decide(pos, e.snapshot_pos, sets.clone()),
                    None => Err(BruteAbort::Malformed),
                };
                verdicts.push((e, v));
            }
        }
        for (o, (e, verdict)) in outcomes.iter().zip(verdicts) {
            let pos = o.pos().unwrap_or(0);
            match brute_matches(o, &verdict) {
                Some(true) => {}
                Some(false) => self.counts.extra_aborts += 1,
                None => {
                    return Err(format!(
                        "entry {pos} (snapshot {}): meld {o:?} but brute force {verdict:?}",
                        e.snapshot_pos
                    ))
                }
            }
            if let Some(writes) = self.load.remove(&pos) {
                if !o.is_committed() {
                    return Err(format!("initial load at {pos} aborted: {o:?}"));
                }
                self.model.extend(writes);
                continue;
            }
            let Some(ix) = e.record else { continue };
            let rec = &mut self.records[ix];
            rec.outcome = o.clone();
            if o.is_committed() {
                self.counts.committed += 1;
                for op in &rec.ops {
                    match op {
                        Op::Put(k, v) => {
                            self.model.insert(k.clone(), v.clone());
                        }
                        // Deleting a key absent from the snapshot writes nothing.
                        Op::Del(k, true) => {
                            self.model.remove(k);
                        }
                        _ => {}
                    }
                }
            } else {
                self.counts.aborted += 1;
            }
        }
        Ok(())
    }
}

/// Checks the LCS against the model and the tree invariants.
fn check_state(
    melder: &Melder,
    model: &BTreeMap<Vec<u8>, Vec<u8>>,
    at: &str,
) -> Result<(), String> {
    check_tree(melder.lcs()).map_err(|e| format!("{at}: {e:?}"))?;
    let now = pairs(melder.lcs());
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    if now != want {
        return Err(format!(
            "{at}: tree differs from the model\n tree  {now:?}\n model {want:?}"
        ));
    }
    let mut v = vns(melder.lcs());
    let n = v.len();
    v.sort_unstable();
    v.dedup();
    if v.len() != n {
        return Err(format!("{at}: duplicate VNs in the LCS"));
    }
    if v.last().is_some_and(|m| *m > melder.lcs().csn()) {
        return Err(format!("{at}: VN beyond the CSN"));
    }
    Ok(())
}

/// Runs a workload, checking every step; `Err` describes the first violation.
///
/// Entries go through [`Melder::apply`], the single-threaded driver, so
/// premeld and group meld run as the settings say. Outcomes may arrive one
/// entry late (group meld decides pairs); each is checked when it arrives.
pub fn run(cfg: &Config) -> Result<Run, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut melder = Melder::new(cfg.settings);
    melder.set_keep_readset(cfg.keep_readset);
    let mut h = Harness {
        settings: cfg.settings,
        melder,
        log: vec![cfg.settings.encode()],
        records: Vec::with_capacity(cfg.txns),
        counts: Counts::default(),
        brute: BruteForce::new(&cfg.settings),
        pending: BTreeMap::new(),
        model: BTreeMap::new(),
        load: BTreeMap::new(),
    };
    let mut initial = Vec::new();

    // Initial load, in serial batches.
    let stride = (cfg.keys / cfg.initial.max(1)).max(1);
    let load: Vec<u64> = (0..cfg.keys)
        .step_by(stride as usize)
        .take(cfg.initial as usize)
        .collect();
    for chunk in load.chunks(512) {
        let mut tx = Transaction::begin(h.melder.lcs(), Isolation::SnapshotIsolation);
        let mut writes = Vec::new();
        for k in chunk {
            let v = format!("init{k}").into_bytes();
            tx.put(&key(*k), &v).map_err(|e| e.to_string())?;
            writes.push((key(*k), v.clone()));
            initial.push((key(*k), v));
        }
        let Finished::Intention(bytes) = tx.finish().map_err(|e| e.to_string())? else {
            return Err("initial load produced no intention".into());
        };
        h.load.insert(h.melder.next_pos(), writes);
        h.append(bytes, None)?;
        h.close_pair()?;
    }
    let load_end = h.melder.lcs().pos();

    for id in 0..cfg.txns {
        let delta = rng.random_range(0..=cfg.degree);
        let mut snap_pos = h.melder.lcs().pos().saturating_sub(delta).max(load_end);
        if h.melder.state_at(snap_pos).is_none() && snap_pos > load_end {
            // Group meld: the first position of a pair is no state.
            snap_pos -= 1;
        }
        let snapshot = h
            .melder
            .state_at(snap_pos)
            .ok_or_else(|| format!("state {snap_pos} not retained"))?
            .clone();
        let isolation = random_isolation(&mut rng, cfg);
        let mut tx = Transaction::begin(&snapshot, isolation);
        let ops = run_ops(&mut tx, &mut rng, cfg, id);
        let finished = tx.finish().map_err(|e| e.to_string())?;
        h.records.push(Record {
            snapshot_pos: snap_pos,
            isolation,
            ops,
            // Replaced when meld decides an intention.
            outcome: Outcome::ReadOnly,
        });
        let Finished::Intention(bytes) = finished else {
            h.counts.read_only += 1;
            continue;
        };
        let pos = h.melder.next_pos();
        let ix = h.records.len() - 1;
        let outcomes = h
            .append(bytes, Some(ix))
            .map_err(|e| format!("txn {id}: {e}"))?;
        if !outcomes.is_empty() && (cfg.check_every_meld || id + 1 == cfg.txns) {
            check_state(
                &h.melder,
                &h.model,
                &format!("txn {id} at {pos} (snapshot {snap_pos})"),
            )?;
        }
    }
    h.close_pair()?;
    check_state(&h.melder, &h.model, "end")?;
    if let Some(p) = h.pending.keys().next() {
        return Err(format!("entry {p} was never decided"));
    }
    let final_state = pairs(h.melder.lcs());
    Ok(Run {
        records: h.records,
        initial,
        final_state,
        counts: h.counts,
        digest: h
            .melder
            .lcs()
            .digest_hex()
            .expect("an in-memory tree reads"),
        log: h.log,
    })
}

pub use melddb_testkit::skip;
