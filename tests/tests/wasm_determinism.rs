//! The same logs melded by a wasm32 build of the engine (wasm32-wasip1 under
//! Node's WASI) give the same state digests and outcomes as native, under
//! every pipeline configuration. The wasm32-wasip1 target is added when the
//! toolchain lacks it; without Node 20+ the test says it is skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use melddb_tests::{pipeline_settings, run, Config};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Builds melddb-replay for `target` (None: the host) in a target
/// directory of its own, so the outer cargo's lock is not contended.
fn build(target: Option<&str>) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("replay-build");
    melddb_replay::build(&workspace(), &dir, target).unwrap_or_else(|e| panic!("{e}"))
}

fn write_log(path: &Path, log: &[Vec<u8>]) {
    let mut out = Vec::new();
    for e in log {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    std::fs::write(path, out).expect("write log");
}

/// (digest, outcomes_hash) from a replay JSON line.
fn fields(stdout: &[u8]) -> (String, String) {
    let s = String::from_utf8_lossy(stdout);
    let grab = |name: &str| {
        let at = s
            .find(&format!("\"{name}\":\""))
            .unwrap_or_else(|| panic!("no {name} in {s}"));
        let rest = &s[at + name.len() + 4..];
        rest[..rest.find('"').expect("closing quote")].to_string()
    };
    (grab("digest"), grab("outcomes_hash"))
}

#[test]
fn wasm_and_native_meld_the_same_logs_to_the_same_digests() {
    if let Err(why) = melddb_replay::node_available() {
        melddb_tests::skip(&why);
        return;
    }
    let native = build(None);
    let wasm = build(Some(melddb_replay::WASI_TARGET));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-logs");
    std::fs::create_dir_all(&dir).expect("log dir");
    let configs = [
        (0, 0, false),
        (2, 10, false),
        (5, 1, false),
        (0, 0, true),
        (5, 10, true),
    ];
    for (i, (t, d, group)) in configs.into_iter().enumerate() {
        let cfg = Config {
            keys: 1024,
            initial: 512,
            degree: 80,
            ops: (1, 12),
            txns: 300,
            seed: 40 + i as u64,
            check_every_meld: false,
            settings: pipeline_settings(t, d, group),
            ..Config::default()
        };
        let r = run(&cfg).expect("history checks pass");
        let name = format!("log{i}.bin");
        write_log(&dir.join(&name), &r.log);
        let n = Command::new(&native)
            .arg(dir.join(&name))
            .output()
            .expect("native replay runs");
        assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
        let w = Command::new("node")
            .arg("--single-threaded")
            .arg(workspace().join("tests/wasm/run-wasi.mjs"))
            .arg(&wasm)
            .arg(&dir)
            .arg(format!("/data/{name}"))
            .output()
            .expect("node runs (Node 20+ is needed)");
        assert!(w.status.success(), "{}", String::from_utf8_lossy(&w.stderr));
        let (nd, no) = fields(&n.stdout);
        let (wd, wo) = fields(&w.stdout);
        assert_eq!(nd, r.digest, "native replay vs the checked run, config {i}");
        assert_eq!(wd, nd, "wasm vs native digest, config {i}");
        assert_eq!(wo, no, "wasm vs native outcomes, config {i}");
    }
}
