//! `melddb bank`: a closed economy. Accounts start at 1,000 each; client
//! threads move random amounts between random pairs of accounts in
//! serializable transactions, so the total never changes whatever the
//! conflicts, and any node on the same log can check it.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use melddb::{Isolation, Outcome};
use melddb_runtime::{Database, DbError};
use rand::{Rng, SeedableRng};

/// The starting balance of every account.
pub const OPENING_BALANCE: i64 = 1_000;

/// What a run asks for.
pub struct BankArgs {
    pub accounts: u64,
    pub threads: usize,
    pub seconds: f64,
    pub seed: u64,
    pub json: bool,
    /// Print a JSON progress line four times a second (for `melddb demo`).
    pub progress: bool,
    /// Isolation of the transfers.
    pub isolation: Isolation,
}

fn key(i: u64) -> Vec<u8> {
    format!("acct/{i:06}").into_bytes()
}

fn balance(v: Option<melddb::Bytes>) -> Result<i64, String> {
    let v = v.ok_or("an account is missing")?;
    std::str::from_utf8(&v)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            format!(
                "an account holds {:?}, not a balance",
                String::from_utf8_lossy(&v)
            )
        })
}

/// What the client threads counted.
#[derive(Default)]
struct Tally {
    /// Log positions of this node's committed transfers.
    committed: Vec<u64>,
    /// Aborted attempts by reason kind.
    aborts: BTreeMap<&'static str, u64>,
    /// Commits whose outcome never came back (the log service went away
    /// while they were sent); the log decided them, the node does not
    /// know how.
    unknown: u64,
}

fn reason_kind(o: &Outcome) -> &'static str {
    use melddb::AbortReason as R;
    match o {
        Outcome::Aborted { reason, .. } | Outcome::Rejected { reason } => match reason {
            R::WriteWrite { .. } => "write-write",
            R::ReadWrite { .. } => "read-write",
            R::Phantom { .. } => "phantom",
            R::SnapshotTooOld { .. } => "snapshot-too-old",
            R::SnapshotUnavailable { .. } => "snapshot-unavailable",
            R::Malformed(_) => "malformed",
        },
        _ => "other",
    }
}

/// Opens the accounts if the log has none (one node wins; the others'
/// attempts find them and change nothing). Returns the position of the
/// commit that opened them, if this node's did.
fn open_accounts(db: &Database, accounts: u64) -> Result<Option<u64>, String> {
    for _ in 0..1_000 {
        let mut tx = db.begin(Isolation::Serializable);
        if tx.get(&key(0)).map_err(|e| e.to_string())?.is_some() {
            return Ok(None);
        }
        for i in 0..accounts {
            tx.put(&key(i), OPENING_BALANCE.to_string().as_bytes())
                .map_err(|e| e.to_string())?;
        }
        match db.commit(tx).map_err(|e| e.to_string())? {
            Outcome::Committed { pos, .. } => return Ok(Some(pos)),
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    Err("could not open the accounts in 1,000 attempts".into())
}

/// Sums every account of the latest state: (accounts, total).
fn audit(db: &Database) -> Result<(u64, i64), String> {
    let read = db.begin_read();
    let (mut accounts, mut total) = (0u64, 0i64);
    for pair in read.prefix(b"acct/") {
        let (_, v) = pair.map_err(|e| e.to_string())?;
        total += balance(Some(v))?;
        accounts += 1;
    }
    Ok((accounts, total))
}

/// Runs the workload and prints per node what it did and whether the
/// total held. Err if it did not.
pub fn run(db: Database, a: BankArgs) -> Result<(), String> {
    if a.accounts < 2 || a.threads == 0 || a.seconds.is_nan() || a.seconds <= 0.0 {
        return Err("bank needs at least 2 accounts, 1 thread and a positive --seconds".into());
    }
    let db = Arc::new(db);
    let opened_at = open_accounts(&db, a.accounts)?;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let aborted = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let threads: Vec<_> = (0..a.threads as u64)
        .map(|t| {
            let (db, stop, done, aborted, tally) = (
                db.clone(),
                stop.clone(),
                done.clone(),
                aborted.clone(),
                tally.clone(),
            );
            let (accounts, seed, isolation) = (a.accounts, a.seed, a.isolation);
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.wrapping_mul(1_000) + t);
                while !stop.load(Ordering::Relaxed) {
                    let from = rng.random_range(0..accounts);
                    let to = (from + rng.random_range(1..accounts)) % accounts;
                    let amount: i64 = rng.random_range(1..=100);
                    let mut tx = db.begin(isolation);
                    let x = balance(tx.get(&key(from)).map_err(|e| e.to_string())?)?;
                    let y = balance(tx.get(&key(to)).map_err(|e| e.to_string())?)?;
                    tx.put(&key(from), (x - amount).to_string().as_bytes())
                        .map_err(|e| e.to_string())?;
                    tx.put(&key(to), (y + amount).to_string().as_bytes())
                        .map_err(|e| e.to_string())?;
                    let outcome = match db.commit(tx) {
                        Ok(o) => o,
                        // The service is away: the transfer may or may not
                        // be in the log. Count it and go on; the node
                        // follows the log again once the service is back.
                        Err(DbError::Service { .. }) => {
                            tally
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .unknown += 1;
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        }
                        Err(e) => return Err(e.to_string()),
                    };
                    let mut t = tally
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    match outcome {
                        Outcome::Committed { pos, .. } => {
                            t.committed.push(pos);
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        other => {
                            *t.aborts.entry(reason_kind(&other)).or_default() += 1;
                            aborted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    let start = Instant::now();
    let total_time = Duration::from_secs_f64(a.seconds);
    let bar = (!a.json).then(|| {
        let b = indicatif::ProgressBar::new(total_time.as_millis() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {elapsed_precise} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut ticks = 0u64;
    while start.elapsed() < total_time && !threads.iter().all(|t| t.is_finished()) {
        std::thread::sleep(Duration::from_millis(100));
        ticks += 1;
        if a.progress && ticks % 2 == 0 {
            let v = serde_json::json!({"progress": {
                "committed": done.load(Ordering::Relaxed),
                "aborted": aborted.load(Ordering::Relaxed),
                "position": db.snapshot().pos(),
            }});
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{v}");
            let _ = out.flush();
        }
        if let Some(b) = &bar {
            b.set_position(start.elapsed().as_millis() as u64);
            b.set_message(format!(
                "{} committed, {} aborted",
                done.load(Ordering::Relaxed),
                aborted.load(Ordering::Relaxed)
            ));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut failed = None;
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = Some(e),
            Err(_) => failed = Some("a client thread panicked".into()),
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Every commit answered anywhere before now, then the audit.
    db.sync_with_log().map_err(|e| e.to_string())?;
    let (accounts, total) = audit(&db)?;
    let expected = a.accounts as i64 * OPENING_BALANCE;
    let held = accounts == a.accounts && total == expected;
    let snap = db.begin_read();
    let digest = snap.digest_hex().map_err(|e| e.to_string())?;
    let t = tally
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let aborts: u64 = t.aborts.values().sum();
    if a.json {
        let v = serde_json::json!({
            "committed": t.committed.len(),
            "aborted": aborts,
            "aborts_by_reason": t.aborts,
            "unknown_outcomes": t.unknown,
            "tps": t.committed.len() as f64 / elapsed,
            "seconds": elapsed,
            "position": snap.pos(),
            "digest": digest,
            "accounts": accounts,
            "total": total,
            "expected_total": expected,
            "total_held": held,
            "isolation": match a.isolation {
                Isolation::Serializable => "serializable",
                Isolation::RepeatableRead => "repeatable-read",
                Isolation::SnapshotIsolation => "snapshot",
            },
            "committed_positions": t.committed,
            "opened_accounts_at": opened_at,
            "checkpoints_published": db.log_stats().checkpoints_written,
            "joined_from_checkpoint": db.recovery().checkpoint,
        });
        println!("{v}");
    } else {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{} transfers committed ({:.0}/s), {} aborted",
            t.committed.len(),
            t.committed.len() as f64 / elapsed,
            aborts
        );
        for (why, n) in &t.aborts {
            let _ = writeln!(out, "  aborted, {why}: {n}");
        }
        if t.unknown > 0 {
            let _ = writeln!(
                out,
                "  {} outcomes unknown (the log service was unreachable)",
                t.unknown
            );
        }
        let _ = writeln!(
            out,
            "position {}, digest {}\n{} accounts hold {total} (expected {expected}): {}",
            snap.pos(),
            digest,
            accounts,
            if held {
                "the total held"
            } else {
                "THE TOTAL DID NOT HOLD"
            }
        );
    }
    if held {
        Ok(())
    } else {
        Err(format!("the total is {total}, not {expected}"))
    }
}
