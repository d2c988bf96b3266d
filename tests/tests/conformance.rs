//! The conformance vectors on disk are exactly what the core generates
//! today. A change to the core that changes a result (a read, an outcome,
//! a node identity behind a digest) fails here; if the change is meant,
//! rewrite the file with `MELDDB_WRITE_VECTORS=1 cargo test -p
//! melddb-tests --test conformance` and every binding must then agree
//! with the new file.

use std::path::PathBuf;

use melddb_tests::conformance::{generate, VECTORS_PATH};

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(VECTORS_PATH)
}

#[test]
fn vectors_on_disk_are_what_the_core_generates() {
    let fresh = generate().expect("the scripts run on the core");
    if std::env::var_os("MELDDB_WRITE_VECTORS").is_some() {
        std::fs::write(path(), &fresh).expect("write the vectors");
    }
    let on_disk = std::fs::read_to_string(path()).unwrap_or_default();
    assert!(
        on_disk == fresh,
        "{VECTORS_PATH} differs from what the core generates; if the change is meant, \
         rewrite it with MELDDB_WRITE_VECTORS=1 cargo test -p melddb-tests --test conformance"
    );
}

#[test]
fn vectors_cover_every_kind_of_step_and_outcome() {
    let doc: serde_json::Value = serde_json::from_str(&generate().unwrap()).unwrap();
    let steps: Vec<&serde_json::Value> = doc["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| v["steps"].as_array().unwrap())
        .collect();
    let count = |f: &dyn Fn(&serde_json::Value) -> bool| steps.iter().filter(|s| f(s)).count();
    for op in [
        "begin", "get", "put", "delete", "range", "commit", "append", "digest",
    ] {
        assert!(count(&|s| s["op"] == op) > 0, "no {op} step");
    }
    for reason in ["WriteWrite", "ReadWrite", "Phantom"] {
        assert!(
            count(&|s| s["expect"]["reason"] == reason) > 0,
            "no commit aborted with {reason}"
        );
    }
    assert!(count(&|s| s["expect"]["committed"] == true) > 50);
    assert!(count(&|s| s["expect"]["readOnly"] == true) > 0);
}
