//! Conformance vectors: scripted transactions on one node with every
//! result the core gives (reads, ranges, outcomes, state digests), written
//! to `tests/conformance/vectors.json`. Every language binding replays the
//! scripts through its own API and must reproduce each result byte for
//! byte; `tests/tests/conformance.rs` keeps the file equal to what this
//! module generates.
//!
//! A script's steps (keys and values in hex):
//! - `{"op":"begin","tx":N,"isolation":"serializable"|"repeatable-read"|"snapshot"}`
//!   begins transaction `N` on the node's latest committed state;
//! - `{"op":"get","tx":N,"key":K,"expect":V|null}`;
//! - `{"op":"put","tx":N,"key":K,"value":V}`;
//! - `{"op":"delete","tx":N,"key":K,"expect":bool}` (whether it was present);
//! - `{"op":"range","tx":N,"gte"|"gt":K,"lte"|"lt":K,"reverse":bool,"limit":L|null,"expect":[[K,V],…]}`
//!   (absent bounds are open);
//! - `{"op":"commit","tx":N,"expect":O}` where `O` is `{"readOnly":true}`,
//!   `{"committed":true,"pos":P,"csn":C}` or
//!   `{"committed":false,"pos":P,"reason":R,"key":K|null}`;
//! - `{"op":"append","bytes":B}` appends raw bytes (not a valid intention)
//!   to the log, as a hostile writer would;
//! - `{"op":"digest","pos":P,"expect":D}`: the node's latest state after
//!   melding the whole log is at position `P` with digest `D`.

use std::ops::Bound;

use melddb::{AbortReason, Database, Isolation, Order, Outcome, Settings, Transaction};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

/// Where the vectors live, relative to the workspace root.
pub const VECTORS_PATH: &str = "tests/conformance/vectors.json";

/// The format version of the vectors file.
pub const FORMAT: u32 = 1;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn settings_json(s: &Settings) -> Value {
    json!({
        "dbId": s.db_id,
        "maxConflictZone": s.max_conflict_zone,
        "premeldThreads": s.premeld_threads,
        "premeldDistance": s.premeld_distance,
        "groupMeld": s.group_meld,
    })
}

fn isolation_name(i: Isolation) -> &'static str {
    match i {
        Isolation::Serializable => "serializable",
        Isolation::RepeatableRead => "repeatable-read",
        Isolation::SnapshotIsolation => "snapshot",
    }
}

fn reason_json(reason: &AbortReason) -> (&'static str, Option<String>) {
    match reason {
        AbortReason::WriteWrite { key } => ("WriteWrite", Some(hex(key))),
        AbortReason::ReadWrite { key } => ("ReadWrite", Some(hex(key))),
        AbortReason::Phantom { range } => match &range.start {
            Bound::Included(k) | Bound::Excluded(k) => ("Phantom", Some(hex(k))),
            Bound::Unbounded => ("Phantom", None),
        },
        AbortReason::SnapshotTooOld { .. } => ("SnapshotTooOld", None),
        AbortReason::SnapshotUnavailable { .. } => ("SnapshotUnavailable", None),
        AbortReason::Malformed(_) => ("Malformed", None),
    }
}

fn outcome_json(o: &Outcome) -> Value {
    match o {
        Outcome::ReadOnly => json!({"readOnly": true}),
        Outcome::Committed { pos, csn } => json!({"committed": true, "pos": pos, "csn": csn}),
        Outcome::Aborted { pos, reason } => {
            let (name, key) = reason_json(reason);
            json!({"committed": false, "pos": pos, "reason": name, "key": key})
        }
        // `Database::commit` appends every intention; a trial meld that
        // rejects one before the log is a host's choice, not in scripts.
        Outcome::Rejected { reason } => {
            let (name, key) = reason_json(reason);
            json!({"committed": false, "pos": null, "reason": name, "key": key})
        }
    }
}

/// One script: its name, the database's settings, its seed and length,
/// and whether it appends hostile raw entries.
struct Spec {
    name: &'static str,
    settings: Settings,
    seed: u64,
    steps: usize,
    raw: bool,
    isolations: &'static [Isolation],
}

fn specs() -> Vec<Spec> {
    let all = &[
        Isolation::Serializable,
        Isolation::RepeatableRead,
        Isolation::SnapshotIsolation,
    ];
    let ser = &[Isolation::Serializable];
    vec![
        Spec {
            name: "serializable",
            settings: Settings::default(),
            seed: 1,
            steps: 400,
            raw: false,
            isolations: ser,
        },
        Spec {
            name: "isolation-levels",
            settings: Settings {
                db_id: 7,
                ..Settings::default()
            },
            seed: 2,
            steps: 400,
            raw: false,
            isolations: all,
        },
        Spec {
            name: "group-meld",
            settings: crate::pipeline_settings(0, 0, true),
            seed: 3,
            steps: 300,
            raw: false,
            isolations: all,
        },
        Spec {
            name: "premeld",
            settings: crate::pipeline_settings(2, 1, false),
            seed: 4,
            steps: 300,
            raw: false,
            isolations: all,
        },
        Spec {
            name: "hostile-entries",
            settings: Settings::default(),
            seed: 5,
            steps: 300,
            raw: true,
            isolations: ser,
        },
    ]
}

fn pick_key(rng: &mut ChaCha8Rng) -> Vec<u8> {
    if rng.random_range(0..8) == 0 {
        vec![0xff, rng.random_range(0..4u8)]
    } else {
        format!("k{:02}", rng.random_range(0..16)).into_bytes()
    }
}

fn pick_value(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let n = rng.random_range(0..24);
    (0..n).map(|_| rng.random()).collect()
}

/// A bound for a range step: its JSON name and the core's bound.
fn pick_bound(rng: &mut ChaCha8Rng, lower: bool) -> Option<(&'static str, bool, Vec<u8>)> {
    match rng.random_range(0..3) {
        0 => None,
        1 => Some((if lower { "gte" } else { "lte" }, true, pick_key(rng))),
        _ => Some((if lower { "gt" } else { "lt" }, false, pick_key(rng))),
    }
}

fn as_bound<'a>(b: &'a Option<(&'static str, bool, Vec<u8>)>) -> Bound<&'a [u8]> {
    match b {
        None => Bound::Unbounded,
        Some((_, true, k)) => Bound::Included(k),
        Some((_, false, k)) => Bound::Excluded(k),
    }
}

fn script(spec: &Spec) -> Result<Value, String> {
    let mut db = Database::create(spec.settings).map_err(|e| e.to_string())?;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let mut open: Vec<(u64, Transaction)> = Vec::new();
    let mut next_id = 0u64;
    let mut steps = Vec::new();
    for n in 0..spec.steps {
        if n % 50 == 49 {
            let snap = db.snapshot();
            let digest = snap.digest_hex().map_err(|e| e.to_string())?;
            steps.push(json!({"op": "digest", "pos": snap.pos(), "expect": digest}));
            continue;
        }
        if spec.raw && rng.random_range(0..25) == 0 {
            let len = rng.random_range(0..40);
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            if rng.random() && bytes.len() >= 4 {
                // Right magic, garbage after it: the decoder's checks run.
                bytes[..4].copy_from_slice(b"MLDI");
            }
            db.append_raw(&bytes).map_err(|e| e.to_string())?;
            steps.push(json!({"op": "append", "bytes": hex(&bytes)}));
            continue;
        }
        if open.is_empty() || (open.len() < 4 && rng.random_range(0..4) == 0) {
            let iso = spec.isolations[rng.random_range(0..spec.isolations.len())];
            steps.push(json!({"op": "begin", "tx": next_id, "isolation": isolation_name(iso)}));
            open.push((next_id, db.begin(iso)));
            next_id += 1;
            continue;
        }
        let at = rng.random_range(0..open.len());
        let id = open[at].0;
        let op = rng.random_range(0..20);
        if op < 3 {
            let (_, tx) = open.remove(at);
            let o = db.commit(tx).map_err(|e| e.to_string())?;
            steps.push(json!({"op": "commit", "tx": id, "expect": outcome_json(&o)}));
            continue;
        }
        let tx = &mut open[at].1;
        if op < 9 {
            let key = pick_key(&mut rng);
            let v = tx.get(&key).map_err(|e| e.to_string())?;
            steps.push(
                json!({"op": "get", "tx": id, "key": hex(&key), "expect": v.map(|v| hex(&v))}),
            );
        } else if op < 15 {
            let (key, value) = (pick_key(&mut rng), pick_value(&mut rng));
            tx.put(&key, &value).map_err(|e| e.to_string())?;
            steps.push(json!({"op": "put", "tx": id, "key": hex(&key), "value": hex(&value)}));
        } else if op < 17 {
            let key = pick_key(&mut rng);
            let was = tx.delete(&key).map_err(|e| e.to_string())?;
            steps.push(json!({"op": "delete", "tx": id, "key": hex(&key), "expect": was}));
        } else {
            let (lo, hi) = (pick_bound(&mut rng, true), pick_bound(&mut rng, false));
            let reverse = rng.random_range(0..3) == 0;
            let limit = (rng.random_range(0..2) == 0).then(|| rng.random_range(1..6usize));
            let order = if reverse {
                Order::Reverse
            } else {
                Order::Forward
            };
            let mut pairs = Vec::new();
            for item in tx.range(as_bound(&lo), as_bound(&hi), order, limit) {
                let (k, v) = item.map_err(|e| e.to_string())?;
                pairs.push(json!([hex(&k), hex(&v)]));
            }
            let mut step = Map::new();
            step.insert("op".into(), json!("range"));
            step.insert("tx".into(), json!(id));
            for (name, _, k) in lo.iter().chain(hi.iter()) {
                step.insert((*name).into(), json!(hex(k)));
            }
            step.insert("reverse".into(), json!(reverse));
            step.insert("limit".into(), json!(limit));
            step.insert("expect".into(), Value::Array(pairs));
            steps.push(Value::Object(step));
        }
    }
    let snap = db.snapshot();
    let digest = snap.digest_hex().map_err(|e| e.to_string())?;
    steps.push(json!({"op": "digest", "pos": snap.pos(), "expect": digest}));
    Ok(json!({
        "name": spec.name,
        "settings": settings_json(&spec.settings),
        "steps": steps,
    }))
}

/// The whole vectors file, as written to [`VECTORS_PATH`]: JSON with one
/// step per line (small diffs when a result changes), one trailing newline.
pub fn generate() -> Result<String, String> {
    let mut out = format!(
        "{{\"format\": {FORMAT},\n\"generator\": \"cargo test -p melddb-tests --test conformance (MELDDB_WRITE_VECTORS=1 rewrites)\",\n\"vectors\": ["
    );
    for (i, spec) in specs().iter().enumerate() {
        let v = script(spec)?;
        let sep = if i == 0 { "" } else { "," };
        out.push_str(&format!(
            "{sep}\n{{\"name\": {},\n\"settings\": {},\n\"steps\": [\n",
            v["name"], v["settings"]
        ));
        let steps: Vec<String> = v["steps"]
            .as_array()
            .map(|a| a.iter().map(Value::to_string).collect())
            .unwrap_or_default();
        out.push_str(&steps.join(",\n"));
        out.push_str("\n]}");
    }
    out.push_str("\n]}\n");
    Ok(out)
}
