//! `melddb-log check`: recovery and a scrub from the command line, a JSON
//! report on stdout, and an exit status a script can act on.

use std::path::{Path, PathBuf};
use std::process::Command;

use melddb_log::page;
use melddb_log::{Config, Store};

fn zones(dir: &Path) -> Vec<PathBuf> {
    (0..3).map(|z| dir.join(format!("zone{z}"))).collect()
}

/// The configuration these tests use, as the library takes it.
fn small_config(dir: &Path) -> Config {
    let mut cfg = Config::with_zones(zones(dir));
    cfg.page_bytes = 4096;
    cfg.segment_bytes = 64 << 10;
    cfg.max_record_bytes = 16 << 10;
    cfg
}

/// [`small_config`] as a TOML file for the command line; its path.
fn write_config(dir: &Path) -> PathBuf {
    let config = dir.join("log.toml");
    let zone_list: Vec<String> = zones(dir).iter().map(|z| z.display().to_string()).collect();
    std::fs::write(
        &config,
        format!("zones = {zone_list:?}\npage_bytes = 4096\nsegment_bytes = 65536\nmax_record_bytes = 16384\n"),
    )
    .unwrap();
    config
}

/// `melddb-log check --config CONFIG`, run to its end.
fn run_check(config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_melddb-log"))
        .args(["check", "--config"])
        .arg(config)
        .env("RUST_LOG", "error")
        .output()
        .expect("run melddb-log check")
}

/// [`run_check`]'s exit code and its JSON report.
fn check(config: &Path) -> (i32, serde_json::Value) {
    let out = run_check(config);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), json)
}

/// Changes one byte of the first parity page long enough and seals it
/// again: it passes its checksum and disagrees with its stripe.
fn falsify_a_parity_page(dir: &Path) {
    for z in zones(dir) {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&z)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "dat"))
            .collect();
        files.sort();
        for f in files {
            let mut bytes = std::fs::read(&f).unwrap();
            let mut off = 0usize;
            while let Ok(h) = page::header(&bytes[off..]) {
                let len = h.page_len() as usize;
                if h.kind == page::Kind::Ordered && h.shard == h.k && h.body_len >= 64 {
                    bytes[off + page::HEADER + 10] ^= 0x81;
                    page::seal(&mut bytes[off..off + len], 0);
                    std::fs::write(&f, &bytes).unwrap();
                    return;
                }
                off += len;
            }
        }
    }
    panic!("no parity page found");
}

#[test]
fn check_finds_and_repairs_a_lying_parity_page_and_reports_it_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let store = Store::open(cfg).unwrap();
    let records: Vec<Vec<u8>> = (0..40u32)
        .map(|i| (0..200 + i * 37).map(|b| (b ^ i) as u8).collect())
        .collect();
    for r in &records {
        store.append_blocking("a", 0, 0, r.clone()).unwrap();
    }
    drop(store);
    falsify_a_parity_page(dir.path());
    let config = write_config(dir.path());

    let (code, report) = check(&config);
    assert_eq!(code, 0, "{report}");
    let scrub = &report["scrub"];
    assert_eq!(scrub["parity_mismatches"], 1, "{report}");
    assert_eq!(scrub["bad_pages"], 1, "{report}");
    assert_eq!(
        scrub["repaired"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert!(
        scrub["end_writes"].as_u64().is_some_and(|n| n > 0),
        "{report}"
    );
    assert_eq!(scrub["bad_end_write_copies"], 0, "{report}");

    let (code, report) = check(&config);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["scrub"]["parity_mismatches"], 0, "{report}");
    assert_eq!(report["scrub"]["bad_pages"], 0, "{report}");

    let cfg = small_config(dir.path());
    let store = Store::open(cfg).unwrap();
    for (i, r) in records.iter().enumerate() {
        assert_eq!(&store.read("a", i as u64).unwrap()[..], &r[..], "a@{i}");
    }
}

#[test]
fn check_exits_2_on_a_config_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("log.toml");
    std::fs::write(&config, "zones = 7\n").unwrap();
    let out = run_check(&config);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error:"), "{err}");
}

/// A configuration with a key the service no longer has (or has moved
/// into `[tuning]`) is a bad configuration: exit 2, with the key and what
/// to do, for `check` and for `serve`.
#[test]
fn a_config_with_a_removed_or_moved_key_exits_2_with_what_to_do() {
    for (key, says) in [
        (
            "writer_cpu = 1",
            "`writer_cpu` is no longer an option: delete it",
        ),
        (
            "strict_end_writes = true",
            "`strict_end_writes` moved to the [tuning] table",
        ),
    ] {
        refused_with(key, says);
    }
}

fn refused_with(key: &str, says: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let text = std::fs::read_to_string(&config).unwrap();
    // Top-level keys go before the first table.
    std::fs::write(&config, format!("{key}\n{text}")).unwrap();
    for sub in ["check", "serve"] {
        let out = Command::new(env!("CARGO_BIN_EXE_melddb-log"))
            .args([sub, "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{sub}: {err}");
        assert!(err.contains(says), "{sub}: {err}");
    }
}

/// A check while a service holds the zones would recover and repair under
/// its feet: it is refused, naming the holder, and runs once it is gone.
#[test]
fn check_is_refused_while_another_process_holds_the_zones() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let config = write_config(dir.path());
    let store = Store::open(cfg).unwrap();
    store.append_blocking("a", 0, 0, b"held".to_vec()).unwrap();
    let out = run_check(&config);
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    let holder = format!("is in use by another process (pid {})", std::process::id());
    assert!(err.contains(&holder), "{err}");
    drop(store);
    let (code, report) = check(&config);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["scrub"]["bad_pages"], 0, "{report}");
}
