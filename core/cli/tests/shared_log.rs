//! Several `melddb` node processes on one shared log of the log service
//! (on loopback), checked against an independent replay of that log: the
//! money total holds on every node, conflicts abort, each node's reported
//! commits are exactly the log's committed entries, and every node's
//! state digest is the replay's at the same position.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use melddb::{Melder, Outcome};
use melddb_log::{Client, Config, Store};

/// The service in this test process, on loopback.
struct Service {
    rt: tokio::runtime::Runtime,
    store: Arc<Store>,
    running: Option<melddb_log::Running>,
}

impl Service {
    fn start(dir: &std::path::Path) -> Service {
        let zones = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
        let mut cfg = Config::with_zones(zones);
        cfg.page_bytes = 4096;
        cfg.segment_bytes = 4 << 20;
        cfg.max_record_bytes = 1 << 20;
        cfg.prepared_segments = 0;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = Arc::new(Store::open(cfg).unwrap());
        let running = rt
            .block_on(melddb_log::start_on(
                store.clone(),
                "127.0.0.1:0",
                "127.0.0.1:0",
            ))
            .unwrap();
        Service {
            rt,
            store,
            running: Some(running),
        }
    }

    fn url(&self, log: &str) -> String {
        let addr = self.running.as_ref().unwrap().tcp;
        format!("melddb://{addr}/{log}")
    }

    /// Every entry of `log`, position 0 on.
    fn entries(&self, log: &str) -> Vec<Vec<u8>> {
        let addr = self.running.as_ref().unwrap().tcp.to_string();
        self.rt.block_on(async {
            let c = Client::connect(&addr).await.unwrap();
            let (first, tail) = c.bounds(log).await.unwrap();
            assert_eq!(first, 0);
            let mut out = Vec::new();
            for pos in 0..tail {
                out.push(c.read(log, pos).await.unwrap().to_vec());
            }
            out
        })
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            self.rt.block_on(r.shutdown());
        }
        self.store.shutdown();
    }
}

/// A node process, killed if the test fails before it exits.
struct Node(Option<Child>);

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn bank(dir: &std::path::Path, url: &str, seed: u64, seconds: f64) -> Node {
    let child = Command::new(env!("CARGO_BIN_EXE_melddb"))
        .arg("--dir")
        .arg(dir)
        .args(["--log", url, "bank", "--accounts", "12", "--threads", "3"])
        .args([
            "--seconds",
            &seconds.to_string(),
            "--seed",
            &seed.to_string(),
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run melddb");
    Node(Some(child))
}

fn finish(mut node: Node) -> serde_json::Value {
    let out = node.0.take().unwrap().wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "node failed: {stdout}\n{stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Replays `entries` with a fresh melder: the outcome of every entry and
/// the digest of every committed state, by position.
fn replay(entries: &[Vec<u8>]) -> (BTreeMap<u64, Outcome>, BTreeMap<u64, String>) {
    let mut m = Melder::from_genesis(&entries[0]).unwrap();
    let mut outcomes = BTreeMap::new();
    let mut digests = BTreeMap::new();
    digests.insert(0, m.lcs().digest_hex());
    for bytes in &entries[1..] {
        for o in m.apply(bytes) {
            if let Some(p) = o.pos() {
                outcomes.insert(p, o);
            }
        }
        digests.insert(m.lcs().pos(), m.lcs().digest_hex());
    }
    (outcomes, digests)
}

#[test]
fn three_node_processes_on_one_shared_log_agree_with_a_replay_of_it() {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let url = svc.url("bank");
    let nodes: Vec<Node> = (0..3)
        .map(|i| bank(&d.path().join(format!("node{i}")), &url, i + 1, 3.0))
        .collect();
    let reports: Vec<serde_json::Value> = nodes.into_iter().map(finish).collect();

    let entries = svc.entries("bank");
    let (outcomes, digests) = replay(&entries);
    let committed: BTreeSet<u64> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Committed { .. }))
        .map(|(&p, _)| p)
        .collect();

    let mut reported = BTreeSet::new();
    let mut aborted = 0;
    let mut opened = 0;
    for r in &reports {
        assert_eq!(r["total_held"], true, "{r}");
        assert_eq!(r["accounts"], 12, "{r}");
        aborted += r["aborted"].as_u64().unwrap();
        for p in r["committed_positions"].as_array().unwrap() {
            let p = p.as_u64().unwrap();
            assert!(reported.insert(p), "position {p} reported by two nodes");
        }
        if let Some(p) = r["opened_accounts_at"].as_u64() {
            assert!(reported.insert(p), "position {p} reported twice");
            opened += 1;
        }
        // The node's final state is the replay's state at its position.
        let pos = r["position"].as_u64().unwrap();
        assert_eq!(
            digests.get(&pos).map(String::as_str),
            r["digest"].as_str(),
            "node at {pos}"
        );
    }
    eprintln!(
        "{} entries, {} committed by the nodes, {aborted} aborted attempts",
        entries.len(),
        reported.len()
    );
    assert_eq!(opened, 1, "exactly one node opened the accounts");
    assert!(
        reported.len() > 30,
        "too few transfers committed to mean anything: {}",
        reported.len()
    );
    assert!(aborted > 0, "three nodes on 12 accounts never conflicted");
    assert_eq!(
        reported, committed,
        "the nodes' commits are not the log's committed entries"
    );
}
