//! Nodes on a shared log when processes die: a node killed with SIGKILL
//! and started again catches up to the same state, and nodes ride out the
//! log service's SIGKILL and restart on the same port; every acknowledged
//! commit is in the log exactly once, checked against a replay of it.

use std::collections::BTreeSet;
use std::time::Duration;

mod common;
use common::{bank, check_report, committed, finish, replay, Peek, Service, ServiceProcess};

#[test]
fn a_node_killed_mid_run_restarts_and_catches_up_to_the_same_state() {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let url = format!("melddb://{}/bank", svc.addr);
    let steady = bank(&d.path().join("steady"), &url, 1, 4.0);
    let victim_dir = d.path().join("victim");
    let mut victim = bank(&victim_dir, &url, 2, 10.0);
    std::thread::sleep(Duration::from_millis(1500));
    victim.kill();
    // The same directory: the killed process's lock died with it.
    let again = bank(&victim_dir, &url, 3, 1.5);
    let reports = [finish(steady), finish(again)];

    let entries = Peek::new(&svc.addr).entries("bank");
    let (outcomes, digests) = replay(&entries);
    let committed = committed(&outcomes);
    let mut reported = BTreeSet::new();
    for r in &reports {
        for p in check_report(r, &digests) {
            assert!(reported.insert(p), "position {p} reported twice");
            assert!(
                committed.contains(&p),
                "{p} reported committed, not in the log"
            );
        }
    }
    assert!(
        reports[1]["committed"].as_u64().unwrap() > 0,
        "the restarted node committed nothing: {}",
        reports[1]
    );
    // The killed node's commits are in the log but nobody reported them.
    assert!(committed.len() > reported.len());
}

const SERVICE_TEST: &str = "nodes_ride_out_the_log_service_killed_and_restarted";

#[test]
fn nodes_ride_out_the_log_service_killed_and_restarted() {
    if common::run_service_child() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let svc_dir = d.path().join("service");
    let port = ServiceProcess::free_port();
    let mut svc = ServiceProcess::start(&svc_dir, port, SERVICE_TEST);
    let url = format!("melddb://{}/bank", svc.addr);
    let nodes: Vec<_> = (0..2)
        .map(|i| bank(&d.path().join(format!("node{i}")), &url, i + 1, 5.0))
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    svc.kill();
    std::thread::sleep(Duration::from_millis(300));
    let svc = ServiceProcess::start(&svc_dir, port, SERVICE_TEST);
    let reports: Vec<serde_json::Value> = nodes.into_iter().map(finish).collect();

    let entries = Peek::new(&svc.addr).entries("bank");
    let (outcomes, digests) = replay(&entries);
    let mut reported = BTreeSet::new();
    let mut unknown = 0;
    for r in &reports {
        unknown += r["unknown_outcomes"].as_u64().unwrap();
        for p in check_report(r, &digests) {
            assert!(reported.insert(p), "position {p} reported twice");
        }
    }
    let committed = committed(&outcomes);
    eprintln!(
        "{} entries, {} committed, {} reported, {unknown} unknown outcomes",
        entries.len(),
        committed.len(),
        reported.len()
    );
    // Every commit a node was told about is in the log; the log's other
    // committed entries are the ones whose answers the outage lost.
    assert!(
        reported.is_subset(&committed),
        "a reported commit is missing from the log"
    );
    assert!(
        committed.len() - reported.len() <= unknown as usize,
        "{} committed entries nobody reported, {unknown} unknown outcomes",
        committed.len() - reported.len()
    );
    assert!(reported.len() > 30, "too few commits: {}", reported.len());
}
