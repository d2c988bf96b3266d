//! `melddb crash-child`: transfers until killed, for the crash test.

use std::io::Write as _;

use melddb::{Isolation, Outcome};
use melddb_runtime::{Database, DbOptions};
use rand::{Rng, SeedableRng};

use crate::text;

/// Transfers between `accounts` accounts (each starting at 1000) from two
/// threads; each transfer also writes a marker `x/ID`. Runs until killed.
pub fn crash_child(
    dir: &std::path::Path,
    opts: DbOptions,
    accounts: u64,
    first_id: u64,
    seed: u64,
) -> Result<(), String> {
    let db = std::sync::Arc::new(Database::open_with(dir, opts).map_err(|e| e.to_string())?);
    let key = |i: u64| format!("acct/{i:04}").into_bytes();
    if db.get(&key(0)).map_err(|e| e.to_string())?.is_none() {
        db.transact(Isolation::Serializable, |tx| {
            for i in 0..accounts {
                tx.put(&key(i), b"1000")?;
            }
            Ok::<_, melddb::TxnError>(())
        })
        .map_err(|e| e.to_string())?;
    }
    println!("ready");
    {
        // Tell the test when checkpoints happen, so it can count kills
        // that land near them.
        let db = db.clone();
        std::thread::spawn(move || {
            let mut seen = db.log_stats().checkpoints_written;
            loop {
                std::thread::sleep(std::time::Duration::from_millis(1));
                let st = db.log_stats();
                if st.checkpoints_written != seen {
                    seen = st.checkpoints_written;
                    let pos = st.last_checkpoint.map_or(0, |c| c.pos);
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "checkpoint {pos}");
                    let _ = out.flush();
                }
            }
        });
    }
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed * 2 + t);
                let mut id = first_id + t;
                loop {
                    let a = rng.random_range(0..accounts);
                    let b = (a + rng.random_range(1..accounts)) % accounts;
                    let amount: i64 = rng.random_range(1..50);
                    let mut tx = db.begin(Isolation::Serializable);
                    let bal = |v: Option<melddb::Bytes>| -> i64 {
                        v.and_then(|v| text(&v).parse().ok()).unwrap_or(0)
                    };
                    let x = bal(tx.get(&key(a)).map_err(|e| e.to_string())?);
                    let y = bal(tx.get(&key(b)).map_err(|e| e.to_string())?);
                    tx.put(&key(a), (x - amount).to_string().as_bytes())
                        .map_err(|e| e.to_string())?;
                    tx.put(&key(b), (y + amount).to_string().as_bytes())
                        .map_err(|e| e.to_string())?;
                    tx.put(
                        format!("x/{id}").as_bytes(),
                        format!("{a}>{b}:{amount}").as_bytes(),
                    )
                    .map_err(|e| e.to_string())?;
                    if let Outcome::Committed { .. } = db.commit(tx).map_err(|e| e.to_string())? {
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "ack {id}");
                        let _ = out.flush();
                    }
                    id += 2;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "worker panicked".to_string())??;
    }
    Ok(())
}
