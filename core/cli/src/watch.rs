//! `melddb watch PREFIX`: committed changes as they arrive.

use std::io::Write as _;

use melddb_runtime::Database;

use crate::text;

/// `melddb watch`.
pub fn watch(
    db: &Database,
    prefix: &str,
    count: Option<u64>,
    seconds: Option<f64>,
    json: bool,
) -> Result<(), String> {
    let mut feed = db.watch_prefix(prefix.as_bytes());
    let deadline =
        seconds.map(|s| std::time::Instant::now() + std::time::Duration::from_secs_f64(s.max(0.0)));
    let mut seen = 0u64;
    while count.is_none_or(|c| seen < c) {
        let wait = match deadline {
            Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                Some(w) => w,
                None => break,
            },
            None => std::time::Duration::from_secs(3600),
        };
        let Some(c) = feed.next_timeout(wait).map_err(|e| e.to_string())? else {
            continue;
        };
        seen += 1;
        let mut out = std::io::stdout().lock();
        if json {
            let changes: Vec<_> = c
                .changes
                .iter()
                .map(|ch| serde_json::json!({"key": text(&ch.key), "value": ch.value.as_deref().map(text)}))
                .collect();
            let _ = writeln!(
                out,
                "{}",
                serde_json::json!({"pos": c.pos, "changes": changes})
            );
        } else {
            for ch in &c.changes {
                let value = ch.value.as_deref().map_or("(deleted)".to_string(), text);
                let _ = writeln!(out, "{}\t{}\t{}", c.pos, text(&ch.key), value);
            }
        }
        let _ = out.flush();
    }
    Ok(())
}
