//! `melddb-bench js`: the JavaScript package under Node against the native
//! core, in the same run: 8r2w transactions through the API, meld of a
//! recorded log, and the `.wasm` size.

use melddb_bench::js::compare;
use melddb_bench::round2;

use super::{write_json, RunArgs};

/// `melddb-bench js`.
#[derive(Debug, clap::Args)]
pub struct JsArgs {
    /// Size of the run and where its figures go.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Runs the suite, prints its table and writes its JSON.
pub fn run_suite(args: &JsArgs) -> Result<(), String> {
    let r = compare(args.run.quick, 1)?;
    let txn = r.js_tps / r.native_tps;
    let meld = r.js_meld_per_s / r.native_meld_per_s;
    println!(
        "{:<34} {:>12} {:>12} {:>8}",
        "", "JavaScript", "native", "ratio"
    );
    println!(
        "{:<34} {:>12.0} {:>12.0} {:>8.2}",
        "8r2w transactions/s (in-memory log)", r.js_tps, r.native_tps, txn
    );
    println!(
        "{:<34} {:>12.0} {:>12.0} {:>8.2}",
        format!("meld, entries/s ({} entries)", r.meld_entries),
        r.js_meld_per_s,
        r.native_meld_per_s,
        meld
    );
    let [raw, gz, br] = r.wasm_bytes;
    println!("melddb_wasm_bg.wasm: {raw} bytes, gzip {gz}, brotli {br}");
    if let Some(path) = &args.run.json {
        let doc = serde_json::json!({
            "suite": "js",
            "metrics": {
                "js_txn_tps_8r2w": round2(r.js_tps),
                "native_txn_tps_8r2w": round2(r.native_tps),
                "js_txn_over_native_8r2w": round2(txn),
                "js_meld_per_s": round2(r.js_meld_per_s),
                "native_meld_per_s": round2(r.native_meld_per_s),
                "js_meld_over_native": round2(meld),
                "wasm_raw_bytes": raw,
                "wasm_gzip_bytes": gz,
                "wasm_brotli_bytes": br,
            },
            "config": {
                "quick": args.run.quick,
                "meld_entries": r.meld_entries,
                "runtime": "Node (node on PATH), one node on an in-memory log",
            },
        });
        write_json(path, &doc)?;
    }
    Ok(())
}
