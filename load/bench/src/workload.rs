//! The meld paper's synthetic workloads (§8, App. F): a table of 8-byte keys
//! and values, serializable transactions of a fixed size, and a fixed
//! concurrency degree `d`: every transaction runs on the state `d` log
//! entries before its own position, so exactly `d` intentions lie in its
//! conflict zone.

use std::time::Instant;

use melddb::validate::{BruteForce, IntentionSets};
use melddb::{parse, Finished, Isolation, Melder, Outcome, Settings, Transaction};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Gap between consecutive loaded keys; inserts go into the gaps.
const STRIDE: u64 = 1 << 16;

/// What the non-read operations do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Write {
    /// Update an existing key (symmetric case).
    Update,
    /// Insert a new key between existing ones (asymmetric case).
    Insert,
}

/// One experiment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Spec {
    /// Experiment name (table section).
    pub experiment: &'static str,
    /// Keys loaded.
    pub keys: u64,
    /// Operations per transaction.
    pub ops: usize,
    /// Concurrency degree.
    pub degree: u64,
    /// Percentage of operations that are reads.
    pub read_pct: u32,
    /// Kind of writes.
    pub write: Write,
    /// Transactions measured.
    pub txns: usize,
    /// Also run the brute-force validator on the same intentions.
    pub brute: bool,
}

/// What one experiment measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Measured {
    /// The experiment.
    pub spec: Spec,
    /// Melds per second (1 / mean meld latency, as in the paper).
    pub meld_tps: f64,
    /// Mean meld latency in microseconds.
    pub mean_us: f64,
    /// Median meld latency in microseconds.
    pub p50_us: f64,
    /// 99th percentile meld latency in microseconds.
    pub p99_us: f64,
    /// Mean time to free the memory one meld released, in microseconds
    /// (done off the meld thread by a host; measured here on the same one).
    pub reclaim_us: f64,
    /// Intention plus LCS nodes visited per meld (plus range-check nodes).
    pub nodes_per_meld: f64,
    /// Ephemeral nodes created per meld.
    pub ephemeral_per_meld: f64,
    /// Fraction of transactions aborted.
    pub abort_rate: f64,
    /// Average metadata bytes per logged node.
    pub meta_bytes_per_node: f64,
    /// Average intention size in bytes.
    pub intention_bytes: f64,
    /// Brute-force decisions per second on the same intentions (0 if not run).
    pub brute_tps: f64,
    /// Decisions where meld and the brute-force validator differ.
    pub brute_disagreements: u64,
    /// Melds/s of every round (`meld_tps` is the best of them).
    pub meld_tps_rounds: Vec<f64>,
    /// Brute-force decisions/s of every round (`brute_tps` is the best).
    pub brute_tps_rounds: Vec<f64>,
}

impl Measured {
    /// Melds/s of the slowest round.
    pub fn slowest_meld_tps(&self) -> f64 {
        self.meld_tps_rounds
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }
}

fn key(i: u64) -> [u8; 8] {
    (i * STRIDE).to_be_bytes()
}

/// A melder with `keys` keys loaded by serial intentions.
pub fn loaded(keys: u64) -> Melder {
    let mut m = Melder::new(Settings {
        db_id: 0,
        max_conflict_zone: 1024,
        ..Settings::default()
    });
    let mut i = 0;
    while i < keys {
        let mut tx = Transaction::begin(m.lcs(), Isolation::SnapshotIsolation);
        for j in i..(i + 16384).min(keys) {
            tx.put(&key(j), &j.to_le_bytes()).expect("valid pair");
        }
        i += 16384;
        if let Ok(Finished::Intention(b)) = tx.finish() {
            m.apply(&b);
        }
    }
    m
}

/// Generates the experiment's intentions (untimed): transactions run on a
/// copy of `base`, each on the state `degree` entries before its position.
pub fn generate(spec: &Spec, base: &Melder, seed: u64) -> Vec<Vec<u8>> {
    let mut m = base.clone();
    m.set_deferred_reclaim(true);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let load_end = m.lcs().pos();
    let total = warmup(spec) + spec.txns;
    let mut out = Vec::with_capacity(total);
    let mut fresh = 0u64;
    while out.len() < total {
        let n = out.len();
        let pos = m.next_pos();
        let snap_pos = pos.saturating_sub(1 + spec.degree).max(load_end);
        let snap = m.state_at(snap_pos).expect("within the window").clone();
        let mut tx = Transaction::begin(&snap, Isolation::Serializable);
        let reads = if spec.read_pct == 50 {
            spec.ops / 2
        } else {
            (0..spec.ops)
                .filter(|_| rng.random_range(0..100) < spec.read_pct)
                .count()
        }
        .min(spec.ops - 1);
        for op in 0..spec.ops {
            let k = rng.random_range(0..spec.keys);
            if op < reads {
                tx.get(&key(k)).expect("valid key");
            } else {
                match spec.write {
                    Write::Update => tx.put(&key(k), &(n as u64).to_le_bytes()),
                    Write::Insert => {
                        // A new key inside a random gap.
                        fresh += 1;
                        let off = 1 + (fresh * 2654435761) % (STRIDE - 1);
                        tx.put(&(k * STRIDE + off).to_be_bytes(), &(n as u64).to_le_bytes())
                    }
                }
                .expect("valid pair");
            }
        }
        if let Ok(Finished::Intention(b)) = tx.finish() {
            m.apply(&b);
            drop(m.take_garbage());
            out.push(b);
        }
    }
    out
}

/// Transactions run before measuring.
pub fn warmup(spec: &Spec) -> usize {
    (spec.txns / 10).max(2 * spec.degree as usize + 10)
}

/// Runs one experiment on a copy of `base` (which holds `spec.keys` keys),
/// timing it in `rounds` rounds (at least one).
///
/// Phase 1 generates every intention. Phase 2 replays them on a fresh copy:
/// intentions are decoded ahead in batches (a transaction's snapshot is
/// `degree` entries back, so up to `degree + 1` can be decoded before their
/// predecessors are melded), then melded back to back, each meld timed on
/// its own. Decoding is the paper's pre-deserialization, off meld's
/// critical path (§8); freeing retired memory is timed separately.
///
/// Phase 2 runs `rounds` times on the same intentions, each time from a
/// fresh copy of `base`; with `spec.brute`, every round has a second
/// replay that times the brute-force validator instead of meld. The work
/// is identical in every replay (decisions and nodes are deterministic and
/// checked to agree); the timings are not, on a shared machine, and the
/// reported rates are those of the fastest round for meld and,
/// separately, for the brute-force validator, with every round's rate
/// kept in the result.
pub fn run(spec: &Spec, base: &Melder, seed: u64, rounds: usize) -> Measured {
    let log = generate(spec, base, seed);
    let mut best: Option<Measured> = None;
    let (mut meld_rounds, mut brute_rounds) = (Vec::new(), Vec::new());
    let mut disagreements = 0;
    for _ in 0..rounds.max(1) {
        let r = replay(spec, base, &log, Timed::Meld);
        meld_rounds.push(r.meld_tps);
        if spec.brute {
            let b = replay(spec, base, &log, Timed::BruteForce);
            same_work(&r, &b);
            brute_rounds.push(b.brute_tps);
            disagreements = disagreements.max(b.brute_disagreements);
        }
        best = Some(match best {
            None => r,
            Some(b) => {
                same_work(&b, &r);
                if r.meld_tps > b.meld_tps {
                    r
                } else {
                    b
                }
            }
        });
    }
    let mut m = best.expect("at least one round");
    m.brute_tps = brute_rounds.iter().copied().fold(0.0, f64::max);
    m.brute_disagreements = disagreements;
    m.meld_tps_rounds = meld_rounds;
    m.brute_tps_rounds = brute_rounds;
    m
}

/// Every replay of the same intentions does the same work (meld is
/// deterministic); a difference is a bug worth stopping the run for.
fn same_work(a: &Measured, b: &Measured) {
    assert_eq!(
        (a.nodes_per_meld, a.ephemeral_per_meld, a.abort_rate),
        (b.nodes_per_meld, b.ephemeral_per_meld, b.abort_rate),
        "two replays of the same intentions did different work"
    );
}

/// What one replay times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timed {
    /// Each meld.
    Meld,
    /// Each brute-force decision (meld still runs, untimed: the next
    /// intentions decode against its states). Kept apart from the meld
    /// rounds so neither one's data evicts the other's from the cache.
    BruteForce,
}

/// One timed replay of `log` on a fresh copy of `base` (see [`run`]).
fn replay(spec: &Spec, base: &Melder, log: &[Vec<u8>], timed: Timed) -> Measured {
    let mut m = base.clone();
    // Free old states and replaced nodes outside the timed region (a host
    // does it on another thread); the cost is measured separately below.
    m.set_deferred_reclaim(true);
    let mut brute = BruteForce::new(m.settings());
    let warm = warmup(spec);
    let batch = std::env::var("MELD_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or((spec.degree as usize + 1).min(64));
    let mut lat = Vec::with_capacity(spec.txns);
    let (mut nodes, mut eph, mut aborts, mut meta, mut bytes_total) =
        (0u64, 0u64, 0u64, 0f64, 0u64);
    let (mut brute_ns, mut disagree, mut reclaim_ns) = (0u128, 0u64, 0u128);
    let mut idx = 0;
    while idx < log.len() {
        let first = m.next_pos();
        let chunk = &log[idx..(idx + batch).min(log.len())];
        let mut decoded = Vec::with_capacity(chunk.len());
        for (j, b) in chunk.iter().enumerate() {
            let int = m
                .decode(first + j as u64, b)
                .expect("own intention decodes");
            let verdict = if timed == Timed::BruteForce {
                let t = Instant::now();
                let sets = IntentionSets::of(&int);
                let v = brute.decide(first + j as u64, int.snapshot_pos, sets);
                if idx + j >= warm {
                    brute_ns += t.elapsed().as_nanos();
                }
                Some(v.is_ok())
            } else {
                None
            };
            decoded.push((int, verdict));
        }
        for (j, (int, verdict)) in decoded.into_iter().enumerate() {
            let t = Instant::now();
            let out = m.apply_decoded(Ok(int));
            let dt = t.elapsed().as_nanos() as u64;
            if idx + j < warm {
                continue;
            }
            lat.push(dt);
            let s = m.last_stats();
            nodes += s.intention_nodes + s.lcs_nodes + s.range_nodes;
            eph += s.ephemeral_nodes;
            if matches!(out, Outcome::Aborted { .. }) {
                aborts += 1;
            }
            if verdict.is_some_and(|v| v != out.is_committed()) {
                disagree += 1;
            }
        }
        let t = Instant::now();
        drop(m.take_garbage());
        if idx >= warm {
            reclaim_ns += t.elapsed().as_nanos();
        }
        for b in chunk {
            let p = parse(b).expect("own intention parses");
            meta += p.metadata_bytes_per_node();
            bytes_total += b.len() as u64;
        }
        idx += chunk.len();
    }
    let count = lat.len().max(1) as f64;
    let logged = log.len() as f64;
    let mean_ns = lat.iter().sum::<u64>() as f64 / count;
    lat.sort_unstable();
    let pct = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    Measured {
        spec: spec.clone(),
        meld_tps: 1e9 / mean_ns,
        mean_us: mean_ns / 1000.0,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        reclaim_us: reclaim_ns as f64 / count / 1000.0,
        nodes_per_meld: nodes as f64 / count,
        ephemeral_per_meld: eph as f64 / count,
        abort_rate: aborts as f64 / count,
        meta_bytes_per_node: meta / logged,
        intention_bytes: bytes_total as f64 / logged,
        brute_tps: if timed == Timed::BruteForce && brute_ns > 0 {
            count * 1e9 / brute_ns as f64
        } else {
            0.0
        },
        brute_disagreements: disagree,
        meld_tps_rounds: Vec::new(),
        brute_tps_rounds: Vec::new(),
    }
}
