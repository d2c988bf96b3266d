//! `melddb-replay LOG [--rounds N]`: melds a recorded log (the genesis record
//! first, then every entry) with the single-threaded driver and prints one
//! JSON line: the final state digest, a digest of every outcome, and the
//! time melding took. The same source runs natively and under WASI, so the
//! determinism test and the wasm-vs-native benchmark compare like with like.
//!
//! Log file format: each record is a 4-byte little-endian length followed
//! by that many bytes.

use std::process::ExitCode;
use std::time::Instant;

use melddb::{Melder, Outcome};

fn read_log(bytes: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let len = bytes
            .get(at..at + 4)
            .ok_or("truncated length prefix")?
            .try_into()
            .map(u32::from_le_bytes)
            .map_err(|_| "bad length prefix")? as usize;
        at += 4;
        out.push(bytes.get(at..at + len).ok_or("truncated record")?);
        at += len;
    }
    Ok(out)
}

fn outcome_line(o: &Outcome) -> String {
    match o {
        Outcome::ReadOnly => "r".into(),
        Outcome::Committed { pos, csn } => format!("c{pos}:{csn}"),
        Outcome::Aborted { pos, reason } => format!("a{pos}:{reason}"),
        Outcome::Rejected { reason } => format!("x:{reason}"),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: melddb-replay LOG [--rounds N]");
        return ExitCode::from(2);
    };
    let rounds: u32 = match args.iter().position(|a| a == "--rounds") {
        Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(n) if n > 0 => n,
            _ => {
                eprintln!("--rounds needs a positive number");
                return ExitCode::from(2);
            }
        },
        None => 1,
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("cannot read {path}: {e}");
            return ExitCode::from(1);
        }
    };
    let log = match read_log(&bytes) {
        Ok(l) if !l.is_empty() => l,
        Ok(_) => {
            eprintln!("{path}: empty log");
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(1);
        }
    };
    let mut best = f64::MAX;
    let mut result = None;
    for _ in 0..rounds {
        let mut m = match Melder::from_genesis(log[0]) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("{path}: bad genesis record: {e}");
                return ExitCode::from(1);
            }
        };
        let start = Instant::now();
        let outcomes: Vec<Outcome> = log[1..].iter().flat_map(|e| m.apply(e)).collect();
        best = best.min(start.elapsed().as_secs_f64());
        result = Some((m, outcomes));
    }
    let Some((m, outcomes)) = result else {
        return ExitCode::from(1);
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for o in &outcomes {
        // FNV-1a over the outcome lines: only needs to match across builds.
        for b in outcome_line(o).bytes().chain([b'\n']) {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    println!(
        "{{\"digest\":\"{}\",\"outcomes\":{},\"outcomes_hash\":\"{h:016x}\",\"entries\":{},\"best_seconds\":{best}}}",
        m.lcs().digest_hex().unwrap(),
        outcomes.len(),
        log.len() - 1
    );
    ExitCode::SUCCESS
}
