//! What every MeldDB test crate shares.
//!
//! A test that cannot run on the machine at hand (no root, no loop device,
//! no Node, a file system without the feature it checks) calls [`skip`]
//! and returns. libtest has no skipped outcome, so it reports the test as
//! passed; the line [`skip`] prints is what tells the two apart, and
//! `.ci/run` counts those lines in its closing `N passed, N failed, N
//! skipped`.

use std::io::Write;

/// Says that the running test is skipped, and why, on a line of its own:
/// `skipped: <test>: <why>`. It writes to the standard error stream
/// directly, past the test harness's capture (which takes only what
/// `print!` and `eprint!` write), so the line shows in every run and not
/// only when a test fails.
pub fn skip(why: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let _ = std::io::stderr().write_all(format!("\nskipped: {test}: {why}\n").as_bytes());
}
