//! Several `melddb` node processes on one shared log of the log service
//! (on loopback), checked against an independent replay of that log: the
//! money total holds on every node, conflicts abort, each node's reported
//! commits are exactly the log's committed entries, and every node's
//! state digest is the replay's at the same position.

use std::collections::BTreeSet;

use melddb::{Melder, Settings};

mod common;
use common::{bank, check_report, committed, finish, replay, Peek, Service};

#[test]
fn three_node_processes_on_one_shared_log_agree_with_a_replay_of_it() {
    three_nodes_agree(None);
}

/// The same with premeld (two threads, distance 1) and group meld on, as
/// the log's genesis record asks: every node runs them live.
#[test]
fn three_nodes_with_premeld_and_group_meld_agree_with_a_replay() {
    three_nodes_agree(Some(Settings {
        premeld_threads: 2,
        premeld_distance: 1,
        group_meld: true,
        ..Settings::default()
    }));
}

/// Three `melddb bank` processes on one log (created with `settings`
/// first, or by the first node with the defaults), checked against a
/// replay.
fn three_nodes_agree(settings: Option<Settings>) {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let peek = Peek::new(&svc.addr);
    let url = format!("melddb://{}/bank", svc.addr);
    if let Some(s) = settings {
        peek.append("bank", s.encode());
    }
    let nodes: Vec<_> = (0..3)
        .map(|i| bank(&d.path().join(format!("node{i}")), &url, i + 1, 3.0))
        .collect();
    let reports: Vec<serde_json::Value> = nodes.into_iter().map(finish).collect();

    let entries = peek.entries("bank");
    if let Some(s) = settings {
        assert_eq!(Melder::from_genesis(&entries[0]).unwrap().settings(), &s);
    }
    let (outcomes, digests) = replay(&entries);
    let mut reported = BTreeSet::new();
    let mut aborted = 0;
    let mut opened = 0;
    for r in &reports {
        aborted += r["aborted"].as_u64().unwrap();
        opened += usize::from(r["opened_accounts_at"].is_u64());
        for p in check_report(r, &digests) {
            assert!(reported.insert(p), "position {p} reported twice");
        }
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
        reported,
        committed(&outcomes),
        "the nodes' commits are not the log's committed entries"
    );
}

/// `melddb demo` starts its own service and node processes, checks them
/// against a replay, and says so; every process it started is gone after.
#[test]
fn the_demo_runs_nodes_on_its_own_service_and_checks_them() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_melddb"))
        .args([
            "demo",
            "--nodes",
            "2",
            "--seconds",
            "1.5",
            "--accounts",
            "20",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    for n in nodes {
        assert_eq!(n["digest_matches_log_replay"], true, "{n}");
        assert_eq!(n["total"], 20 * 1000, "{n}");
        assert!(n["committed"].as_u64().unwrap() > 0, "{n}");
    }
}

/// `melddb watch PREFIX` on one node prints the commits another node
/// process makes, in log order, only keys under the prefix.
#[test]
fn watch_prints_another_nodes_commits_as_they_arrive() {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let url = format!("melddb://{}/bank", svc.addr);
    let watcher = std::process::Command::new(env!("CARGO_BIN_EXE_melddb"))
        .arg("--dir")
        .arg(d.path().join("w"))
        .args([
            "--log",
            &url,
            "watch",
            "acct/",
            "--count",
            "5",
            "--seconds",
            "60",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let watcher = common::Node(Some(watcher));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let report = finish(bank(&d.path().join("b"), &url, 1, 1.0));
    let mut w = watcher;
    let out = w.0.take().unwrap().wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5, "{lines:?}");
    let committed: BTreeSet<u64> = report["committed_positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .chain(report["opened_accounts_at"].as_u64())
        .collect();
    let mut last = 0;
    for l in &lines {
        let pos = l["pos"].as_u64().unwrap();
        assert!(pos > last && committed.contains(&pos), "{l}");
        last = pos;
        for ch in l["changes"].as_array().unwrap() {
            assert!(ch["key"].as_str().unwrap().starts_with("acct/"), "{ch}");
        }
    }
}
