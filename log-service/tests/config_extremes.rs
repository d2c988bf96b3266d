//! A configuration file is typed by hand: every number in it at its
//! type's largest value (and at 0 and 1) must be refused by validation
//! with a message, or open a store and a server that work. Never a panic
//! or an allocation that aborts the process: a typo must not take the
//! service down with a backtrace.

use melddb_log::Config;

/// Every number in `v`, as a JSON pointer.
fn numbers(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Number(_) => out.push(at),
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                numbers(x, format!("{at}/{k}"), out);
            }
        }
        _ => {}
    }
}

/// `base` with the number at `ptr` set to `n`, if the field's type can
/// hold it.
fn with(base: &serde_json::Value, ptr: &str, n: u64) -> Option<Config> {
    let mut v = base.clone();
    *v.pointer_mut(ptr)? = n.into();
    serde_json::from_value(v).ok()
}

#[test]
fn every_number_at_its_extremes_is_refused_or_works() {
    let dir = tempfile::tempdir().unwrap();
    let zones = (0..3).map(|z| dir.path().join(format!("z{z}"))).collect();
    let mut base = Config::with_zones(zones);
    // Small enough that a store opens in a moment.
    base.page_bytes = 4096;
    base.segment_bytes = 64 << 10;
    base.max_record_bytes = 64 << 10;
    base.listen.tcp = "127.0.0.1:0".into();
    base.listen.http = "127.0.0.1:0".into();
    base.tuning.disable_transparent_huge_pages = false;
    let base = serde_json::to_value(&base).unwrap();
    let mut fields = Vec::new();
    numbers(&base, String::new(), &mut fields);
    assert!(fields.len() >= 15, "{fields:?}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut opened = 0;
    let mut panics = Vec::new();
    for field in &fields {
        // The largest value the field's type takes, then 0 and 1.
        let largest = [u64::MAX, u32::MAX as u64, u16::MAX as u64, u8::MAX as u64]
            .into_iter()
            .find_map(|n| with(&base, field, n).map(|c| (n, c)));
        let (top, _) = largest.unwrap_or_else(|| panic!("{field}: no value fits"));
        for n in [top, 0, 1] {
            let Some(cfg) = with(&base, field, n) else {
                continue;
            };
            let what = format!("{field} = {n}");
            // Each try gets its own zones: a refused open leaves nothing,
            // an accepted one a store.
            let sub = dir.path().join(format!("try{opened}"));
            let mut cfg = cfg;
            cfg.zones = (0..3).map(|z| sub.join(format!("z{z}"))).collect();
            if let Err(e) = cfg.validate() {
                assert!(!e.to_string().is_empty(), "{what}");
                continue;
            }
            opened += 1;
            let t = std::time::Instant::now();
            let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                try_open(&rt, cfg, &what)
            }));
            if let Err(p) = tried {
                let why = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panics.push(format!("{what}: {why}"));
            }
            if t.elapsed().as_secs_f64() > 1.0 {
                eprintln!("{what}: {:.1} s", t.elapsed().as_secs_f64());
            }
        }
    }
    assert!(panics.is_empty(), "{panics:#?}");
    assert!(opened > 10, "only {opened} configurations opened");
}

/// Opens a store on `cfg`, appends and reads, serves it and reads over
/// TCP; a refusal to open is fine if it says why.
fn try_open(rt: &tokio::runtime::Runtime, cfg: Config, what: &str) {
    {
        {
            let store = match melddb_log::Store::open(cfg) {
                Ok(s) => std::sync::Arc::new(s),
                Err(e) => {
                    assert!(!e.to_string().is_empty(), "{what}");
                    return;
                }
            };
            let pos = store
                .append_blocking("x", 0, 0, b"w".to_vec())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(&store.read("x", pos).unwrap()[..], b"w", "{what}");
            rt.block_on(async {
                let running = melddb_log::start(store.clone())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let c = melddb_log::Client::connect(&running.tcp.to_string())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(&c.read("x", pos).await.unwrap()[..], b"w", "{what}");
                running.shutdown().await;
            });
            store.shutdown();
        }
    }
}
