//! Re-runs one history configuration and prints the first violation.
use melddb::Isolation;
use melddb_tests::{run, Config, Mix};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let cfg = Config {
        seed: a[1].parse().unwrap(),
        degree: a[2].parse().unwrap(),
        ops: (1, a[3].parse().unwrap()),
        keys: a[4].parse().unwrap(),
        initial: a[4].parse::<u64>().unwrap() / 2,
        skew: a[5] == "true",
        mix: if a[6] == "true" { Mix::POINT } else { Mix::ALL },
        isolation: match a[7].as_str() {
            "si" => Some(Isolation::SnapshotIsolation),
            "rr" => Some(Isolation::RepeatableRead),
            "ser" => Some(Isolation::Serializable),
            _ => None,
        },
        txns: 150,
        ..Config::default()
    };
    match run(&cfg) {
        Ok(r) => println!("ok {:?}", r.counts),
        Err(e) => println!("{e}"),
    }
}
