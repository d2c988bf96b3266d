//! The `melddb` command on a directory another process holds open: every
//! command is refused with a message naming the directory, exits
//! non-zero, and leaves the database as it was.

use std::process::Command;

use melddb::Isolation;
use melddb_runtime::Database;

#[test]
fn every_command_is_refused_on_a_directory_another_process_holds_open() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("db");
    let db = Database::open(&dir).unwrap();
    db.transact(Isolation::Serializable, |tx| tx.put(b"a", b"1"))
        .unwrap();
    let digest = db.snapshot().digest().unwrap();
    let tail = db.log_stats().tail;
    let commands: [&[&str]; 8] = [
        &["put", "k", "v"],
        &["get", "a"],
        &["del", "a"],
        &["scan"],
        &["check"],
        &["check", "--json"],
        &["stats"],
        &["checkpoint"],
    ];
    for args in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_melddb"))
            .arg("--dir")
            .arg(&dir)
            .args(args)
            .output()
            .expect("run melddb");
        let err = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stdout} {err}");
        assert!(stdout.is_empty(), "{args:?} printed {stdout}");
        assert!(err.contains(&dir.display().to_string()), "{args:?}: {err}");
        assert!(err.contains("already open"), "{args:?}: {err}");
        assert!(
            err.contains(&format!("process {}", std::process::id())),
            "{args:?}: {err}"
        );
    }
    // The holder's log is as it left it: a commit now lands right after
    // its own, and a reopen finds exactly its commits.
    assert_eq!(db.log_stats().tail, tail);
    db.transact(Isolation::Serializable, |tx| tx.put(b"b", b"2"))
        .unwrap();
    let after = db.snapshot().digest().unwrap();
    assert_ne!(after, digest);
    drop(db);
    let db = Database::open(&dir).unwrap();
    assert_eq!(db.snapshot().digest().unwrap(), after);
    assert_eq!(db.get(b"k").unwrap(), None);
    assert_eq!(db.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    drop(db);
    // Released with the process's database: the command works again.
    let out = Command::new(env!("CARGO_BIN_EXE_melddb"))
        .arg("--dir")
        .arg(&dir)
        .args(["put", "k", "v"])
        .output()
        .expect("run melddb");
    assert!(out.status.success());
}
