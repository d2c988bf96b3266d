//! Crash tests with real processes: a child runs money transfers and is
//! killed with SIGKILL at random moments. After every kill the database
//! reopens, every acknowledged transfer is present, the closed economy
//! still sums to its starting total (no transfer is half visible) and the
//! tree is valid. The child checkpoints every 8 KiB of log on 64 KiB
//! segments, so kills also land while checkpoints are written and the log
//! is trimmed, and most restarts recover from a checkpoint; every other
//! child has a node cache of 1 KiB, so it evicts and reads nodes back all
//! the time. 200 cycles by default; `MELDDB_CRASH_CYCLES=1000` for more.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use melddb_runtime::Database;
use rand::{Rng, SeedableRng};

const ACCOUNTS: u64 = 16;

#[test]
fn killed_writers_lose_no_acknowledged_commit() {
    let cycles: u64 = std::env::var("MELDDB_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let d = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut acked: BTreeSet<u64> = BTreeSet::new();
    let mut killed_mid_run = 0;
    let mut checkpoints = 0;
    let mut from_checkpoint = 0;
    for cycle in 0..cycles {
        // Every other child runs with a node cache far smaller than its
        // data, so kills also land in evictions and read-backs.
        let cache = if cycle % 2 == 0 { "1024" } else { "1073741824" };
        let mut child = Command::new(env!("CARGO_BIN_EXE_melddb"))
            .arg("--dir")
            .arg(d.path())
            .args(["--cache-bytes", cache])
            .args(["crash-child", "--accounts", &ACCOUNTS.to_string()])
            .args(["--first-id", &(cycle * 10_000_000).to_string()])
            .args(["--seed", &cycle.to_string()])
            // Small checkpoints and segments: kills land in checkpoint
            // writes, recovery starts from checkpoints, trims delete files.
            .args(["--checkpoint-bytes", "8192", "--segment-bytes", "65536"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the child");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait until it is running, then let it work a random while
        // (sometimes not at all: killed during recovery or start-up).
        let budget = Duration::from_millis(rng.random_range(0..60));
        let start = Instant::now();
        let mut ready = false;
        while start.elapsed() < budget + Duration::from_secs(if ready { 0 } else { 20 }) {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(l) if l == "ready" => ready = true,
                Ok(l) => {
                    if let Some(id) = l.strip_prefix("ack ") {
                        acked.insert(id.parse().expect("numeric id"));
                    }
                    checkpoints += u64::from(l.starts_with("checkpoint "));
                }
                Err(_) => {}
            }
            if ready && start.elapsed() >= budget {
                break;
            }
            if rng.random_bool(0.02) && !ready {
                break; // kill during start-up now and then
            }
        }
        child.kill().expect("SIGKILL the child");
        let status = child.wait().expect("reap the child");
        assert!(!status.success(), "the child runs until killed");
        if ready {
            killed_mid_run += 1;
        }
        reader.join().expect("reader thread");
        // Lines the child printed before dying are acknowledgements too.
        while let Ok(l) = rx.try_recv() {
            if let Some(id) = l.strip_prefix("ack ") {
                acked.insert(id.parse().expect("numeric id"));
            }
        }

        let db = Database::open(d.path())
            .unwrap_or_else(|e| panic!("cycle {cycle}: reopen failed: {e}"));
        from_checkpoint += u64::from(db.recovery().checkpoint.is_some());
        assert!(
            db.recovery().skipped_checkpoints.is_empty(),
            "cycle {cycle}: {:?}",
            db.recovery().skipped_checkpoints
        );
        let s = db.snapshot();
        melddb::validate::check_tree(&s).unwrap_or_else(|e| panic!("cycle {cycle}: {e:?}"));
        if s.get(b"acct/0000").expect("reads").is_some() {
            let total: i64 = (0..ACCOUNTS)
                .map(|i| {
                    let v = s
                        .get(format!("acct/{i:04}").as_bytes())
                        .expect("reads")
                        .expect("account exists");
                    String::from_utf8_lossy(&v)
                        .parse::<i64>()
                        .expect("numeric balance")
                })
                .sum();
            assert_eq!(
                total,
                1000 * ACCOUNTS as i64,
                "cycle {cycle}: money appeared or vanished"
            );
        }
        for id in &acked {
            assert!(
                s.get(format!("x/{id}").as_bytes())
                    .expect("reads")
                    .is_some(),
                "cycle {cycle}: acknowledged transfer {id} is missing after the crash"
            );
        }
    }
    assert!(
        acked.len() > cycles as usize,
        "too few commits were acknowledged: {}",
        acked.len()
    );
    assert!(
        killed_mid_run > cycles / 2,
        "most kills must hit a running workload"
    );
    assert!(
        checkpoints >= 10.min(cycles / 5) && from_checkpoint > cycles / 2,
        "checkpoints must be exercised: {checkpoints} written, {from_checkpoint} recoveries from one"
    );
    let db = Database::open(d.path()).expect("final reopen");
    assert!(db.log_stats().first > 0, "the log was never trimmed");
    eprintln!(
        "{cycles} cycles: {} acknowledged, {checkpoints} checkpoints seen, \
         {from_checkpoint} recoveries from a checkpoint, log starts at {}",
        acked.len(),
        db.log_stats().first
    );
}
