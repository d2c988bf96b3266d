//! Times reopening (recovering) an embedded database directory.
//! `cargo run --release -p melddb-bench --example reopen -- DIR [MiB]`
fn main() {
    let dir = std::env::args().nth(1).expect("a directory");
    let mib: u64 = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    if !std::path::Path::new(&dir).exists() {
        let db = melddb_runtime::Database::open_with(
            &dir,
            melddb_runtime::DbOptions {
                durability: melddb_runtime::Durability::Buffered,
                ..Default::default()
            },
        )
        .unwrap();
        let mut i = 0u64;
        while db.snapshot().pos() * 400 < mib << 20 {
            db.transact(melddb::Isolation::SnapshotIsolation, |tx| {
                for j in 0..2u64 {
                    tx.put(&(i * 2 + j).to_be_bytes(), &[7u8; 100])?;
                }
                Ok::<_, melddb::TxnError>(())
            })
            .unwrap();
            i += 1;
        }
    }
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let db = melddb_runtime::Database::open(&dir).unwrap();
        println!(
            "reopen {:?} ({} records)",
            t.elapsed(),
            db.recovery().records
        );
    }
}
