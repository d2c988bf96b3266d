//! Error codes as they travel: every code reads back as itself.

use super::Code;

/// Every variant, and a match that stops compiling when a variant is
/// added without being listed here.
fn all() -> Vec<Code> {
    use Code::*;
    let all = vec![
        BadFrame,
        Version,
        Unauthorized,
        Forbidden,
        NotYetWritten,
        Trimmed,
        TooLarge,
        BadLogName,
        WriteFailed,
        Full,
        Unrecoverable,
        ShuttingDown,
        Busy,
        TrimBeyondTail,
        NoSpace,
        Exhausted,
    ];
    for c in &all {
        match c {
            BadFrame | Version | Unauthorized | Forbidden | NotYetWritten | Trimmed | TooLarge
            | BadLogName | WriteFailed | Full | Unrecoverable | ShuttingDown | Busy
            | TrimBeyondTail | NoSpace | Exhausted => {}
        }
    }
    all
}

/// A client reads back every code the service sends (the enum's
/// discriminants are the wire values), and any other number as
/// `BadFrame`.
#[test]
fn every_error_code_reads_back_as_itself_and_unknown_ones_as_bad_frame() {
    let all = all();
    for &c in &all {
        assert_eq!(Code::from_u16(c as u16), c);
    }
    for v in 0..=u16::MAX {
        if !all.iter().any(|&c| c as u16 == v) {
            assert_eq!(Code::from_u16(v), Code::BadFrame, "wire value {v}");
        }
    }
}
