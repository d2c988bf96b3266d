//! The rights rule, checked over every combination.

use bytes::Bytes;

use super::context::allowed;
use crate::config::Rights;
use crate::protocol::Request;

/// `allowed` against the rule as the docs state it, over every
/// combination: Ping and Hello need nothing; appends, batches and
/// trims need the log and the append right; reads, range reads, bounds
/// and subscriptions of either kind need the log and the read right.
#[test]
fn rights_allow_exactly_what_the_rule_says() {
    let requests = |log: &str| {
        let log = log.to_string();
        vec![
            (Request::Ping, None),
            (Request::Hello { token: "t".into() }, None),
            (
                Request::Append {
                    log: log.clone(),
                    client: 1,
                    request: 1,
                    bytes: Bytes::from_static(b"x"),
                },
                Some(true),
            ),
            (
                Request::AppendBatch {
                    log: log.clone(),
                    client: 1,
                    first_request: 1,
                    records: vec![Bytes::from_static(b"x")],
                },
                Some(true),
            ),
            (
                Request::Trim {
                    log: log.clone(),
                    pos: 1,
                },
                Some(true),
            ),
            (
                Request::Read {
                    log: log.clone(),
                    pos: 1,
                },
                Some(false),
            ),
            (
                Request::ReadRange {
                    log: log.clone(),
                    from: 1,
                    max_records: 1,
                    max_bytes: 1,
                },
                Some(false),
            ),
            (Request::Bounds { log: log.clone() }, Some(false)),
            (
                Request::Subscribe {
                    log: log.clone(),
                    from: 0,
                },
                Some(false),
            ),
            (
                Request::SubscribeBatches {
                    log,
                    from: 0,
                    max_records: 1,
                    max_bytes: 1,
                },
                Some(false),
            ),
        ]
    };
    for read in [false, true] {
        for append in [false, true] {
            for logs in [vec![], vec!["orders".to_string()], vec!["*".to_string()]] {
                let r = Rights {
                    logs: logs.clone(),
                    read,
                    append,
                };
                for log in ["orders", "other"] {
                    let covered = logs.iter().any(|l| l == "*" || l == log);
                    for (req, needs_append) in requests(log) {
                        let want = match needs_append {
                            None => true,
                            Some(true) => covered && append,
                            Some(false) => covered && read,
                        };
                        assert_eq!(allowed(&r, &req).is_ok(), want, "{r:?} on {req:?}");
                    }
                }
            }
        }
    }
}
