//! The `melddb` command end to end: writes, reads, scans (text and JSON),
//! exit codes, `check` and `stats` output for tools, and a short bench.

use std::process::Command;

fn melddb(dir: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_melddb"))
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .expect("run melddb");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn commands_round_trip_and_report_for_tools() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("db");
    for (k, v) in [("b", "2"), ("a", "1"), ("c", "3")] {
        assert_eq!(melddb(&dir, &["put", k, v]).0, 0);
    }
    assert_eq!(
        melddb(&dir, &["get", "b"]),
        (0, "2\n".into(), String::new())
    );
    let (code, _, err) = melddb(&dir, &["get", "zz"]);
    assert_eq!(code, 3, "absent key");
    assert!(err.contains("not found"));
    assert_eq!(melddb(&dir, &["del", "b"]).0, 0);
    assert_eq!(melddb(&dir, &["scan"]).1, "a\t1\nc\t3\n");
    assert_eq!(
        melddb(&dir, &["scan", "--reverse", "--limit", "1"]).1,
        "c\t3\n"
    );
    let (_, json, _) = melddb(&dir, &["scan", "--json", "--from", "b"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v, serde_json::json!([{"key": "c", "value": "3"}]));
    let (code, check, _) = melddb(&dir, &["check", "--json"]);
    assert_eq!(code, 0);
    let c: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(c["ok"], true);
    assert_eq!(c["records"], 5, "genesis + 4 commits");
    let (_, stats, _) = melddb(&dir, &["stats", "--json"]);
    let s: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(s["keys"], 2);
    assert_eq!(s["digest"], c["digest"]);
    let (code, bench, _) = melddb(
        &dir,
        &[
            "bench",
            "--keys",
            "500",
            "--seconds",
            "0.3",
            "--threads",
            "2",
            "--json",
        ],
    );
    assert_eq!(code, 0);
    let b: serde_json::Value = serde_json::from_str(&bench).unwrap();
    assert!(b["committed"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(melddb(&dir, &["bench", "--mix", "nope"]).0, 1);
    // An explicit checkpoint: the next open starts from it.
    let (code, cp, _) = melddb(&dir, &["checkpoint", "--json"]);
    assert_eq!(code, 0);
    let cp: serde_json::Value = serde_json::from_str(&cp).unwrap();
    assert!(cp["nodes"].as_u64().unwrap() >= 2, "{cp}");
    let (_, check, _) = melddb(&dir, &["check", "--json"]);
    let c: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(c["ok"], true);
    assert_eq!(c["recovered_from_checkpoint"], cp["begin"]);
    let (_, stats, _) = melddb(&dir, &["stats", "--json"]);
    let s: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(s["last_checkpoint"], cp["begin"]);
    // Only the checkpoint's own parts follow its begin record.
    assert_eq!(
        s["replayed_entries"].as_u64(),
        Some(cp["last_part"].as_u64().unwrap() - cp["begin"].as_u64().unwrap())
    );
    // A damaged segment is reported, not used.
    let seg = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[30] ^= 0xff;
    std::fs::write(&seg, bytes).unwrap();
    let (code, _, err) = melddb(&dir, &["check"]);
    assert_eq!(code, 1);
    assert!(err.contains("corrupt"), "{err}");
}

/// `bank` on an embedded directory at each isolation level: the total
/// holds (a transfer writes both accounts it reads, so even snapshot
/// isolation's write-write check keeps it), and the level is reported.
#[test]
fn bank_keeps_its_total_at_every_isolation_level() {
    for level in ["serializable", "repeatable-read", "snapshot"] {
        let d = tempfile::tempdir().unwrap();
        let (code, out, err) = melddb(
            &d.path().join("db"),
            &[
                "--isolation",
                level,
                "bank",
                "--accounts",
                "6",
                "--threads",
                "3",
                "--seconds",
                "0.5",
                "--json",
            ],
        );
        assert_eq!(code, 0, "{level}: {out} {err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["total_held"], true, "{v}");
        assert_eq!(v["isolation"], level, "{v}");
        assert!(v["committed"].as_u64().unwrap() > 0, "{v}");
    }
    let (code, _, err) = melddb(
        tempfile::tempdir().unwrap().path(),
        &["--isolation", "chaos", "scan"],
    );
    assert_eq!(code, 2, "{err}");
}

#[test]
fn put_get_and_del_answer_json_for_tools() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("db");
    let json = |args: &[&str]| -> (i32, serde_json::Value) {
        let (code, out, err) = melddb(&dir, args);
        (
            code,
            serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}")),
        )
    };
    assert_eq!(
        json(&["put", "k", "v", "--json"]),
        (0, serde_json::json!({"key": "k", "value": "v"}))
    );
    assert_eq!(
        json(&["get", "k", "--json"]),
        (0, serde_json::json!({"key": "k", "value": "v"}))
    );
    assert_eq!(
        json(&["del", "k", "--json"]),
        (0, serde_json::json!({"key": "k", "existed": true}))
    );
    assert_eq!(
        json(&["del", "k", "--json"]),
        (0, serde_json::json!({"key": "k", "existed": false}))
    );
    assert_eq!(
        json(&["get", "k", "--json"]),
        (3, serde_json::json!({"key": "k", "value": null}))
    );
}
