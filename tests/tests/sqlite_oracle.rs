//! The SQLite oracle. Committed transactions are replayed in log order
//! into a temporal SQLite table (each row valid from the log position that
//! wrote it until the one that replaced it). Then:
//! * every transaction (committed, aborted or read-only) must have read
//!   exactly the state of its snapshot, overlaid with its own writes;
//! * every committed serializable transaction must also have read exactly
//!   the state just before its own log position (a serial execution in log
//!   order), scans included; repeatable-read ones for their point reads and
//!   every pair their scans returned;
//! * the final table must equal the engine's final tree.

use std::collections::BTreeMap;
use std::ops::Bound;

use melddb::{Isolation, Order, Outcome};
use melddb_tests::{run, Config, Mix, Op, Record};
use rusqlite::{params, Connection};

struct Oracle {
    db: Connection,
}

#[derive(Clone, Copy, PartialEq)]
enum Check {
    /// Every operation, scans compared whole.
    Full,
    /// Point reads, deletes, and each pair a scan returned.
    Points,
}

impl Oracle {
    fn new(initial: &[(Vec<u8>, Vec<u8>)]) -> Oracle {
        let db = Connection::open_in_memory().unwrap();
        db.execute_batch(
            "CREATE TABLE kv (k BLOB NOT NULL, v BLOB NOT NULL, vf INTEGER NOT NULL, vt INTEGER);
             CREATE INDEX kv_k ON kv (k, vf);",
        )
        .unwrap();
        for (k, v) in initial {
            db.execute("INSERT INTO kv VALUES (?1, ?2, 0, NULL)", params![k, v])
                .unwrap();
        }
        Oracle { db }
    }

    fn replay(&self, records: &[Record]) {
        let mut committed: Vec<(u64, &Record)> = records
            .iter()
            .filter_map(|r| match r.outcome {
                Outcome::Committed { pos, .. } => Some((pos, r)),
                _ => None,
            })
            .collect();
        committed.sort_by_key(|(p, _)| *p);
        for (p, r) in committed {
            for op in &r.ops {
                match op {
                    Op::Put(k, v) => {
                        self.end(k, p);
                        self.db
                            .execute(
                                "INSERT INTO kv VALUES (?1, ?2, ?3, NULL)",
                                params![k, v, p as i64],
                            )
                            .unwrap();
                    }
                    Op::Del(k, true) => self.end(k, p),
                    _ => {}
                }
            }
        }
    }

    fn end(&self, k: &[u8], p: u64) {
        self.db
            .execute(
                "UPDATE kv SET vt = ?2 WHERE k = ?1 AND vt IS NULL",
                params![k, p as i64],
            )
            .unwrap();
    }

    fn get_at(&self, k: &[u8], s: u64) -> Option<Vec<u8>> {
        let mut st = self
            .db
            .prepare_cached(
                "SELECT v FROM kv WHERE k = ?1 AND vf <= ?2 AND (vt IS NULL OR vt > ?2)",
            )
            .unwrap();
        let mut rows = st.query(params![k, s as i64]).unwrap();
        rows.next().unwrap().map(|r| r.get(0).unwrap())
    }

    fn scan_at(
        &self,
        start: &Bound<Vec<u8>>,
        end: &Bound<Vec<u8>>,
        s: u64,
    ) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let mut sql =
            String::from("SELECT k, v FROM kv WHERE vf <= ?1 AND (vt IS NULL OR vt > ?1)");
        let mut args: Vec<Vec<u8>> = Vec::new();
        for (b, incl, excl) in [(start, ">=", ">"), (end, "<=", "<")] {
            match b {
                Bound::Included(x) => {
                    args.push(x.clone());
                    sql += &format!(" AND k {incl} ?{}", args.len() + 1);
                }
                Bound::Excluded(x) => {
                    args.push(x.clone());
                    sql += &format!(" AND k {excl} ?{}", args.len() + 1);
                }
                Bound::Unbounded => {}
            }
        }
        let mut st = self.db.prepare(&sql).unwrap();
        let mut p: Vec<&dyn rusqlite::ToSql> = vec![];
        let s = s as i64;
        p.push(&s);
        for a in &args {
            p.push(a);
        }
        st.query_map(p.as_slice(), |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(|x| x.unwrap())
            .collect()
    }

    /// Re-evaluates a transaction's reads as of state `s` with its own
    /// writes overlaid; returns the first difference.
    fn check(&self, r: &Record, s: u64, mode: Check) -> Result<(), String> {
        let mut own: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let read = |own: &BTreeMap<Vec<u8>, Option<Vec<u8>>>, k: &[u8]| match own.get(k) {
            Some(v) => v.clone(),
            None => self.get_at(k, s),
        };
        for (i, op) in r.ops.iter().enumerate() {
            match op {
                Op::Get(k, seen) => {
                    let want = read(&own, k);
                    if &want != seen {
                        return Err(format!(
                            "op {i} get {k:?}: saw {seen:?}, state {s} has {want:?}"
                        ));
                    }
                }
                Op::Put(k, v) => {
                    own.insert(k.clone(), Some(v.clone()));
                }
                Op::Del(k, existed) => {
                    let want = read(&own, k).is_some();
                    if want != *existed {
                        return Err(format!(
                            "op {i} delete {k:?}: existed {existed}, state {s} says {want}"
                        ));
                    }
                    own.insert(k.clone(), None);
                }
                Op::Scan {
                    start,
                    end,
                    order,
                    limit,
                    out,
                } => {
                    if mode == Check::Points {
                        for (k, v) in out {
                            if read(&own, k).as_ref() != Some(v) {
                                return Err(format!(
                                    "op {i} scan pair {k:?} differs from state {s}"
                                ));
                            }
                        }
                        continue;
                    }
                    let mut all = self.scan_at(start, end, s);
                    let range = (start.clone(), end.clone());
                    for (k, v) in &own {
                        if std::ops::RangeBounds::contains(&range, k) {
                            match v {
                                Some(v) => all.insert(k.clone(), v.clone()),
                                None => all.remove(k),
                            };
                        }
                    }
                    let mut want: Vec<(Vec<u8>, Vec<u8>)> = all.into_iter().collect();
                    if *order == Order::Reverse {
                        want.reverse();
                    }
                    want.truncate(limit.unwrap_or(usize::MAX));
                    if &want != out {
                        return Err(format!(
                            "op {i} scan {start:?}..{end:?} {order:?} limit {limit:?}: saw {} pairs, state {s} gives {}",
                            out.len(),
                            want.len()
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn check_all(&self, records: &[Record]) -> Result<(usize, usize), String> {
        let (mut snap_checks, mut serial_checks) = (0, 0);
        for (n, r) in records.iter().enumerate() {
            self.check(r, r.snapshot_pos, Check::Full)
                .map_err(|e| format!("txn {n} ({:?}) vs its snapshot: {e}", r.isolation))?;
            snap_checks += 1;
            if let Outcome::Committed { pos, .. } = r.outcome {
                let mode = match r.isolation {
                    Isolation::Serializable => Some(Check::Full),
                    Isolation::RepeatableRead => Some(Check::Points),
                    Isolation::SnapshotIsolation => None,
                };
                if let Some(mode) = mode {
                    self.check(r, pos - 1, mode).map_err(|e| {
                        format!("txn {n} ({:?}) at its commit point {pos}: {e}", r.isolation)
                    })?;
                    serial_checks += 1;
                }
            }
        }
        Ok((snap_checks, serial_checks))
    }

    fn final_table(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut st = self
            .db
            .prepare("SELECT k, v FROM kv WHERE vt IS NULL ORDER BY k")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(|x| x.unwrap())
            .collect()
    }
}

fn oracle_run(cfg: &Config) -> (usize, usize) {
    let run = run(cfg).unwrap_or_else(|e| panic!("history check failed: {e}"));
    let oracle = Oracle::new(&run.initial);
    oracle.replay(&run.records);
    let counts = oracle
        .check_all(&run.records)
        .unwrap_or_else(|e| panic!("{cfg:?}: {e}"));
    assert_eq!(
        oracle.final_table(),
        run.final_state,
        "final table differs from SQLite"
    );
    counts
}

#[test]
fn sqlite_agrees_on_every_isolation_level() {
    let mut total = (0, 0);
    for seed in 0..12u64 {
        for isolation in [
            Some(Isolation::Serializable),
            Some(Isolation::RepeatableRead),
            Some(Isolation::SnapshotIsolation),
            None,
        ] {
            let cfg = Config {
                seed,
                keys: [16, 64, 300][seed as usize % 3],
                initial: [8, 32, 150][seed as usize % 3],
                degree: [1, 4, 16, 64][seed as usize % 4],
                ops: (1, [4, 8, 16][seed as usize % 3]),
                skew: seed % 2 == 0,
                mix: Mix::ALL,
                isolation,
                txns: 250,
                ..Config::default()
            };
            let (a, b) = oracle_run(&cfg);
            total.0 += a;
            total.1 += b;
        }
    }
    // The oracle really ran: many transactions checked at their commit point.
    assert!(total.0 > 10_000 && total.1 > 1_000, "{total:?}");
}

#[test]
fn oracle_detects_a_tampered_read() {
    // The oracle can fail: change one value a committed serializable
    // transaction read and the check must report it.
    let cfg = Config {
        isolation: Some(Isolation::Serializable),
        mix: Mix::POINT,
        txns: 100,
        ..Config::default()
    };
    let mut run = run(&cfg).unwrap();
    let oracle = Oracle::new(&run.initial);
    oracle.replay(&run.records);
    assert!(oracle.check_all(&run.records).is_ok());
    let victim = run
        .records
        .iter_mut()
        .find(|r| {
            r.outcome.is_committed() && r.ops.iter().any(|o| matches!(o, Op::Get(_, Some(_))))
        })
        .expect("a committed transaction that read a value");
    for op in &mut victim.ops {
        if let Op::Get(_, Some(v)) = op {
            v.push(b'!');
            break;
        }
    }
    assert!(oracle.check_all(&run.records).is_err());
}
