//! A closed economy shared by the embedded database's tests: accounts that
//! start at 1000 and threads moving money between them, so the total never
//! changes whatever commits or aborts.

use std::sync::Arc;
use std::thread::{self, JoinHandle};

use melddb::Isolation;
use melddb_runtime::Database;

/// The key of account `i`.
pub fn account(i: u64) -> Vec<u8> {
    format!("acct/{i:04}").into_bytes()
}

/// An account's balance (0 if missing or unreadable).
pub fn balance(v: Option<melddb::Bytes>) -> i64 {
    v.map(|b| String::from_utf8_lossy(&b).parse().unwrap_or(0))
        .unwrap_or(0)
}

/// Opens `n` accounts at 1000 each, in one transaction.
pub fn seed_accounts(db: &Database, n: u64) {
    db.transact(Isolation::Serializable, |tx| {
        for i in 0..n {
            tx.put(&account(i), b"1000")?;
        }
        Ok::<_, melddb::TxnError>(())
    })
    .unwrap();
}

/// Four threads, each making `rounds` serializable transfers of `amount`
/// between two of the `accounts` accounts (retried on conflict). Join
/// them to wait.
pub fn spawn_transfers(
    db: &Arc<Database>,
    accounts: u64,
    rounds: u64,
    amount: i64,
) -> Vec<JoinHandle<()>> {
    (0..4u64)
        .map(|w| {
            let db = db.clone();
            thread::spawn(move || {
                for j in 0..rounds {
                    let (a, b) = ((w * 7 + j) % accounts, (w * 3 + j * 5 + 1) % accounts);
                    if a == b {
                        continue;
                    }
                    db.transact(Isolation::Serializable, |tx| {
                        let x = balance(tx.get(&account(a))?);
                        let y = balance(tx.get(&account(b))?);
                        tx.put(&account(a), (x - amount).to_string().as_bytes())?;
                        tx.put(&account(b), (y + amount).to_string().as_bytes())?;
                        Ok::<_, melddb::TxnError>(())
                    })
                    .unwrap();
                }
            })
        })
        .collect()
}
